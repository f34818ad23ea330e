"""`powercut export --format fstests`: a new test in xfstests' tests/generic/ layout.

The test makes the file system with the finding's mkfs options on dm-flakey,
runs the ops that had completed at the crash point (ops.py: xfs_io on the
fds the test's shell holds, coreutils for names), cuts the power
(`_load_flakey_table $FLAKEY_DROP_WRITES`: every later write is dropped),
closes the fds still held, and `_flakey_drop_and_remount` lets the kernel
recover what had reached the disk. Then it prints the facts the oracle
judged (checks.py: kinds, sizes, bytes, link counts, xattrs of the
finding's paths); the golden .out holds them as a correct kernel shows
them, computed from the model of the ops (model.py), never from a kernel's
output. Mount and fsck findings print nothing: the remount (`_scratch_mount`
fails the test) and `_check_scratch_fs` judge them.

Helpers used (common/rc, common/dmflakey): _begin_fstest, _require_scratch,
_require_dm_target, _require_xfs_io_command, _require_metadata_journaling,
_require_scratch_ext4_feature, _require_attrs, _require_renameat2,
_require_scratch_size, _scratch_mkfs_sized, _init_flakey, _scratch_mount, _load_flakey_table,
_flakey_drop_and_remount, _scratch_unmount, _cleanup_flakey, _check_scratch_fs.
"""

from __future__ import annotations

import shlex

from checkers.known_damage import configuration_without_metadata_journal
from harness.reports.export.checks import Check, build, helpers
from harness.reports.export.finding import ExportInput
from harness.reports.export.ops import xfs_io_script
from harness.reports.export.shell import header

NUMBER = "999"   # fstests' `./new generic` picks the real number; rename both files


def _requires(x: ExportInput, needs: set[str], checks: list[Check]) -> list[str]:
    # Without a metadata journal fsck damage after a crash is the configuration's documented
    # behaviour (checkers/known_damage.py): ./check must not fsck the scratch device.
    nocheck = "_nocheck" if configuration_without_metadata_journal(x.fs, x.mkfs_opts) else ""
    out = [f"_require_scratch{nocheck}", f"_require_scratch_size{nocheck} $(({x.device_bytes} / 1024))",
           "_require_dm_target flakey", "_require_xfs_io_command fsync"]
    if x.fs == "ext4":
        features = [v for k, v in zip(x.mkfs_opts.split(), x.mkfs_opts.split()[1:]) if k == "-O"]
        out += [f"_require_scratch_ext4_feature {shlex.quote(f)}" for f in features if not f.startswith("^")]
    if any("xattr_names" in c.cmd for c in checks):
        needs = needs | {"_require_attrs"}
    return out + sorted(needs)


def _sources(needs: set[str], checks: list[Check]) -> str:
    """The common/ files that define the _require_* helpers NEEDS name (common/rc's are always there)."""
    wanted = {n.split()[0] for n in needs} | ({"_require_attrs"} if any("xattr_names" in c.cmd for c in checks) else set())
    files = {"_require_attrs": "attr", "_require_renameat2": "renameat2"}
    return "".join(f". ./common/{files[n]}\n" for n in sorted(wanted) if n in files)


def _check_lines(checks: list[Check]) -> str:
    """Each check prints its fact; a value a correct kernel may show in more than one
    way prints one fixed line when it is one of them."""
    out = []
    for c in checks:
        out.append(f"# {c.why}")
        if len(c.allowed) == 1:
            out.append(f'echo "{c.label}: $({c.cmd})"')
        else:
            cases = "|".join(shlex.quote(v) for v in c.allowed)
            out.append(f'value=$({c.cmd})\ncase "$value" in\n{cases}) echo "{c.label}: {c.summary()}" ;;\n'
                       f'*) echo "{c.label}: $value" ;;\nesac')
    return "\n".join(out)


def render(x: ExportInput) -> tuple[str, str]:
    """(test script, golden .out)."""
    script = xfs_io_script(x.ops)
    checks, unchecked = build(x, "$SCRATCH_MNT")
    # A name the shell cannot give (linkat of an fd it does not hold: an O_TMPFILE file whose xfs_io
    # run ended unlinked) is not checked here: the shell export does
    skipped = [c for c in checks if set(c.label.split()) & script.unmade]
    checks = [c for c in checks if c not in skipped]
    unchecked += [f"not checked: {c.label} (the name comes from a linkat of an fd this test does not "
                  "hold)" for c in skipped]
    notes = list(dict.fromkeys(script.caveats + unchecked))
    caveats = "".join(f"# Note: {c}\n" for c in notes)
    mount = f'MOUNT_OPTIONS="$MOUNT_OPTIONS -o {x.mount_opts}"\n' if x.mount_opts else ""
    mkfs_opts = f'MKFS_OPTIONS="$MKFS_OPTIONS {x.mkfs_opts}"\n' if x.mkfs_opts else ""
    # fstests dropped _supported_fs: a test for one file system's options says so itself
    # (upstream it would go to tests/{fs}/ instead of tests/generic/)
    fs_line = (f'[ "$FSTYP" = {x.fs} ] || _notrun "{x.fs} only: the options are {x.fs}\'s"\n'
               if x.mkfs_opts or x.mount_opts else "")
    held = [f"exec {n}<&-" for n in script.shell_fds.values()]
    close = ("\n# The fds the ops still hold die with the power: closed only now.\n" + "\n".join(held)) if held else ""
    guarantee = (_check_lines(checks) if checks else
                 "# A correct kernel mounts the image (above) and leaves it consistent (fsck).\n_check_scratch_fs")
    test = f"""#! /bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# FS QA Test No. {NUMBER}
#
{header(x, "fstests test (generated by powercut)")}
{_guarantee_comment(x, checks)}{caveats}#
. ./common/preamble
_begin_fstest auto quick log

_cleanup()
{{
	_cleanup_flakey
	cd /
	rm -f $tmp.*
}}

. ./common/filter
. ./common/dmflakey
{_sources(script.needs, checks)}
{fs_line}{chr(10).join(_requires(x, script.needs, checks))}

{helpers(checks) + chr(10) if checks else ""}{mkfs_opts}# The size the finding's device had: the bug may depend on the geometry.
_scratch_mkfs_sized {x.device_bytes} >> $seqres.full 2>&1 || _fail "mkfs failed"
{_journaling(x)}{mount}_init_flakey
_scratch_mount

{chr(10).join(script.lines) if script.lines else "# (no ops: power is cut right after the mount)"}

# Power cut right here: from now on no write reaches the disk.
_load_flakey_table $FLAKEY_DROP_WRITES{close}
# Unmount and mount again: the kernel recovers what had reached the disk.
_flakey_drop_and_remount

{guarantee}

_scratch_unmount
{"" if checks else 'echo "Silence is golden"'}
status=0
exit
"""
    lines = [c.golden() for c in checks] or ["Silence is golden"]
    golden = f"QA output created by {NUMBER}\n" + "".join(f"{ln}\n" for ln in lines)
    return test, golden


def _journaling(x: ExportInput) -> str:
    """_require_metadata_journaling, unless the finding's configuration has no journal (it would
    not run there): then a comment on what such a file system still promises."""
    name = configuration_without_metadata_journal(x.fs, x.mkfs_opts)
    if name is None:
        return "_require_metadata_journaling $SCRATCH_DEV\n"
    return (f"# {name} journals no metadata: fsck may find damage after the power cut (not judged),\n"
            "# but what the checks below print is promised all the same.\n")


def _guarantee_comment(x: ExportInput, checks: list[Check]) -> str:
    ev = x.evidence
    if x.kind == "kernel":
        return ("# A correct kernel logs no WARNING or BUG running these ops or recovering from\n"
                "# the power cut: ./check's dmesg scan fails the test when it does.\n")
    if not checks:
        return ("# A correct kernel recovers any power cut to a file system that mounts and that\n"
                "# fsck finds consistent (journaled metadata is replayed whole or not at all).\n")
    ref = f": {ev['reference']}" if ev.get("reference") else ""
    rule = f" (rule {ev['rule']}{ref})" if ev.get("rule") else ""
    return (f"# What a correct kernel shows after the power cut{rule}:\n"
            + "".join(f"#   {c.golden()}  -- {c.why}\n" for c in checks))

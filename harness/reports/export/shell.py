"""`powercut export --format shell`: one standalone root script, no powercut needed.

It makes the file system on a dm-log-writes target, runs the finding's ops
with the bundled C program (pc-repro.c, compiled on the spot unless
PC_REPRO names a binary), marks the log right after the last op that had
completed at the crash point, replays the log up to that mark onto a zeroed
device (pc-repro replay, or xfstests' replay-log when REPLAY_LOG names it),
lets the kernel recover it with a mount, checks what the oracle checked
(checks.py: the finding's paths, sizes, bytes as a correct kernel must show
them), runs fsck and prints what is wrong. Exit 1: reproduced (the recovery
mount failed, a check showed a wrong value or fsck found errors), 0: the
image came back as a correct kernel leaves it, 2: it could not run.
"""

from __future__ import annotations

import os
import shlex

from checkers.known_damage import configuration_without_metadata_journal
from foundation.filesystems import get_fs
from harness.reports.export.checks import Check, build, helpers
from harness.reports.export.finding import ExportInput
from harness.reports.export.ops import CRASH_MARK, describe, repro_args

C_SOURCE = os.path.join(os.path.dirname(__file__), "pc-repro.c")


def _comment(text: str, limit: int = 60) -> str:
    lines = text.strip().splitlines()
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more lines)"]
    return "\n".join(f"#   {ln}" if ln else "#" for ln in lines)


def header(x: ExportInput, what: str) -> str:
    """The comment block both exports start with: what was found, where, with what evidence."""
    ops = "; ".join(describe(op) for op in x.ops) or "(none: the crash comes before the first op)"
    state = ("no crash state: the kernel complained while the ops ran; power is cut after them all"
             if not x.state_id else
             f"crash state {x.state_id}: the recorded log cut right after the last op above"
             if x.in_order else
             f"crash state {x.state_id} is a reordered one (some writes of the last flush epoch dropped or torn); "
             "this script cuts power right after the last op above instead, which may not show the bug")
    kernel_log = "\n".join(x.evidence.get("kernel_log", []) or [])
    parts = [
        f"# {what} of powercut finding {x.name} ({x.kind}).",
        f"# Found: {x.detail.splitlines()[0] if x.detail else x.found}",
        f"# Expected: {x.expected}" if x.expected else "",
        f"# File system: {x.fs}, mkfs options {x.mkfs_opts or '(none)'}, mount options {x.mount_opts or '(none)'}, "
        f"device {x.device_bytes // (1 << 20)} MiB.",
        f"# Seen on kernels: {', '.join(x.kernels) or 'unknown'}.",
        f"# Not seen on (powercut bisect): {', '.join(x.clean_on)}." if x.clean_on else "",
        f"# The workload's {x.threads} threads ran concurrently; here their ops run one after the other in one "
        "order, the order their completions reached the recorded log (fd THREAD.NAME: that thread's fd NAME)."
        if x.threads > 1 else "",
        f"# Ops completed before the power cut: {ops}" + (f" ({x.ops_after} later ops of the workload never ran)" if x.ops_after else ""),
        f"# {state}.",
        f"# The crash point fell while {x.in_flight} (the last op above) was running: it runs to its end here, "
        "and power goes right after it." if x.in_flight else "",
        "# What the kernel logged at the failed recovery mount:\n" + _comment(kernel_log) if kernel_log else "",
        # fsck's output is evidence only where fsck or the mount judged (a clean run is noise)
        "# fsck after the kernel's recovery mount, as powercut saw it:\n" + _comment(x.fsck_output)
        if x.fsck_output and x.kind in ("fsck", "mount", "corruption", "kernel") else "",
    ]
    return "\n".join(p for p in parts if p)


def render(x: ExportInput) -> str:
    fs = get_fs(x.fs)
    mkfs = " ".join(shlex.quote(a) for a in fs.mkfs_cmd("", "")[:-1])   # MKFS_OPTS go after it
    fsck = " ".join(shlex.quote(a) for a in fs.fsck)
    with open(C_SOURCE) as f:
        c_source = f.read()
    ops = " ".join(shlex.quote(a) for a in repro_args(x.ops))
    recovery = ",".join(o for o in [x.mount_opts, *fs.recovery_opts] if o)
    log_bytes = max(64 << 20, 2 * x.device_bytes)
    checks, _ = build(x, '"$MNT"')
    return f"""#!/bin/sh
{header(x, "Standalone reproducer")}
#
# Run as root on a host with device-mapper's log-writes target (dm-log-writes):
#   sh {x.name}.sh           exit 1: reproduced, 0: the image came back clean, 2: could not run
# Devices: three loop devices on files in $WORK (default: a new directory in /tmp), or
# DATA_DEV, LOG_DEV and REPLAY_DEV (REPLAY_DEV is zeroed first). The ops run in a small
# bundled C program (compiled with cc; PC_REPRO=/path/to/pc-repro to use a built one);
# REPLAY_LOG=/path/to/xfstests/src/log-writes/replay-log replays with xfstests' tool instead.
set -u
FS={x.fs}
MKFS="{mkfs}"
MKFS_OPTS={shlex.quote(x.mkfs_opts)}
MOUNT_OPTS={shlex.quote(x.mount_opts)}
RECOVERY_OPTS={shlex.quote(recovery)}
FSCK="{fsck}"
SIZE={x.device_bytes}
LOG_SIZE={log_bytes}
WORK=${{WORK:-$(mktemp -d /tmp/pc-repro.XXXXXX)}}
MNT=$WORK/mnt
LW=pc-repro-$$
LOOPS=""
say() {{ echo "repro: $*"; }}
cleanup() {{
    cd /
    umount "$MNT" 2>/dev/null
    dmsetup remove "$LW" 2>/dev/null
    for l in $LOOPS; do losetup -d "$l" 2>/dev/null; done
}}
die() {{ echo "repro: cannot run: $*" >&2; cleanup; exit 2; }}
trap cleanup EXIT
mkdir -p "$MNT" || die "mkdir $MNT"
[ "$(id -u)" = 0 ] || die "run as root"
command -v dmsetup >/dev/null || die "dmsetup not found"

if [ -z "${{PC_REPRO:-}}" ]; then
    cat > "$WORK/pc-repro.c" <<'PC_REPRO_SOURCE'
{c_source}PC_REPRO_SOURCE
    cc -O2 -o "$WORK/pc-repro" "$WORK/pc-repro.c" || die "cc could not build pc-repro (set PC_REPRO)"
    PC_REPRO=$WORK/pc-repro
fi

loop_on() {{  # a loop device on a new zeroed file $1 of $2 bytes
    rm -f "$1"; truncate -s "$2" "$1" || die "truncate $1"
    l=$(losetup --find --show "$1") || die "losetup $1"
    LOOPS="$LOOPS $l"
    echo "$l"
}}
[ -n "${{DATA_DEV:-}}" ] || DATA_DEV=$(loop_on "$WORK/data.img" "$SIZE")
[ -n "${{LOG_DEV:-}}" ] || LOG_DEV=$(loop_on "$WORK/log.img" "$LOG_SIZE")
if [ -n "${{REPLAY_DEV:-}}" ]; then
    dd if=/dev/zero of="$REPLAY_DEV" bs=1M count=$((SIZE >> 20)) conv=fsync 2>/dev/null || die "zeroing $REPLAY_DEV"
else
    REPLAY_DEV=$(loop_on "$WORK/replay.img" "$SIZE")
fi
# The log device starts zeroed, so no stale entry is read back.
dd if=/dev/zero of="$LOG_DEV" bs=1M count=1 conv=fsync 2>/dev/null

say "kernel $(uname -r), $FS, mkfs options '$MKFS_OPTS', mount options '$MOUNT_OPTS'"
KMSG_SEEN=$(dmesg 2>/dev/null | wc -l)   # a correct kernel logs no WARNING or BUG from here on
sectors=$(blockdev --getsz "$DATA_DEV") || die "blockdev --getsz $DATA_DEV"
dmsetup create "$LW" --table "0 $sectors log-writes $DATA_DEV $LOG_DEV" || die "no log-writes target (modprobe dm-log-writes)"
$MKFS $MKFS_OPTS "/dev/mapper/$LW" >/dev/null || die "mkfs failed"
dmsetup message "$LW" 0 mark mkfs
mount -t "$FS" ${{MOUNT_OPTS:+-o "$MOUNT_OPTS"}} "/dev/mapper/$LW" "$MNT" || die "mount of the new file system failed"
say "running the ops; power is cut right after the last one (mark {CRASH_MARK})"
(cd "$MNT" && PC_LOGWRITES=$LW "$PC_REPRO" ops {ops}) || die "the ops could not run"
umount "$MNT" || die "umount"
dmsetup remove "$LW" || die "dmsetup remove"

say "replaying the log up to mark {CRASH_MARK} onto $REPLAY_DEV"
if [ -n "${{REPLAY_LOG:-}}" ]; then
    "$REPLAY_LOG" --log "$LOG_DEV" --replay "$REPLAY_DEV" --end-mark {CRASH_MARK} || die "replay-log failed"
else
    "$PC_REPRO" replay "$LOG_DEV" "$REPLAY_DEV" {CRASH_MARK} || die "replay failed"
fi

say "recovery: mount (the kernel replays its journal), check, unmount"
if ! mount -t "$FS" ${{RECOVERY_OPTS:+-o "$RECOVERY_OPTS"}} "$REPLAY_DEV" "$MNT"; then
    echo "RESULT: REPRODUCED: the recovery mount failed; kernel log:"
    dmesg | tail -n 15
    exit 1
fi
(cd "$MNT" && ls -laR .) | head -n 60
wrong=""
{_check_lines(checks)}
umount "$MNT" || die "umount after recovery"
say "$FSCK $REPLAY_DEV"
$FSCK "$REPLAY_DEV" < /dev/null   # (fsck.f2fs asks on stdin whether to restore lost files)
code=$?
{_verdict(x.fs, configuration_without_metadata_journal(x.fs, x.mkfs_opts))}
"""


def _check_lines(checks: list[Check]) -> str:
    """Each fact compared with what a correct kernel may show; a wrong one is the finding."""
    if not checks:
        return "# (a mount or fsck finding: the recovery mount above and fsck below judge it)"
    out = [helpers(checks).rstrip()]
    for c in checks:
        cases = "|".join(shlex.quote(v) for v in c.allowed)
        want = shlex.quote("    a correct kernel shows: " + " or ".join(v or "(nothing)" for v in c.allowed))
        out.append(f'value=$({c.cmd})\ncase "$value" in\n{cases}) say "as expected: {c.label}: $value" ;;\n'
                   f'*) echo "WRONG: {c.label}: $value"; echo {want}; wrong="$wrong; {c.label}" ;;\nesac')
    return "\n".join(out)


def _verdict(fs: str, no_journal: str | None) -> str:
    """NO_JOURNAL: the configuration's name when it journals no metadata; fsck damage after a
    crash is then its documented behaviour (checkers/known_damage.py): shown, not a verdict."""
    bad = "[ $((code & 12)) -ne 0 ]" if fs == "ext4" else "[ $code -ne 0 ]"
    if no_journal:
        fsck = (f'say "fsck exit $code, not judged: {no_journal} keeps no metadata consistent after a crash"\n'
                'echo "RESULT: not reproduced: the facts above are as a correct kernel leaves them"')
    else:
        fsck = (f'if {bad}; then\n'
                '    echo "RESULT: REPRODUCED: fsck exit $code after the kernel\'s recovery (expected: clean)"\n'
                '    exit 1\nfi\n'
                'echo "RESULT: not reproduced: fsck exit $code, the recovered image is consistent"')
    return f"""warned=$(dmesg 2>/dev/null | tail -n +$((KMSG_SEEN + 1)) | grep -E 'WARNING:|BUG:|Oops|general protection' | head -n 5)
if [ -n "$warned" ]; then
    echo "RESULT: REPRODUCED: the kernel logged (fsck exit $code):"
    echo "$warned"
    exit 1
fi
if [ -n "$wrong" ]; then
    echo "RESULT: REPRODUCED: after the kernel's recovery, wrong:${{wrong#;}} (fsck exit $code)"
    exit 1
fi
{fsck}
exit 0"""

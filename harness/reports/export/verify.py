"""`powercut export FINDING --verify KERNEL[,FIXED] --fstests DIR`: both exports
in the real tools, on the kernels given.

One guest per kernel (harness/backends/vm/hostroot.py: the kernel in QEMU,
this host's root read-only as its root, so the host's bash, xfs_io, mkfs,
fsck and dmsetup run unchanged against the guest kernel's device-mapper).
There the fstests export runs as tests/generic/999 of a copy of the user's
fstests checkout (built on the host: `make fstests FSTESTS=DIR`) with
`./check`, on two loop devices (TEST_DEV, SCRATCH_DEV); then the shell
export runs as a user would run it. A kernel with the bug fails the test
(./check reports the output mismatch or fsck) and the script says
REPRODUCED; a fixed kernel passes both.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

from foundation import ownership
from foundation.errors import UsageError
from foundation.filesystems import get_fs
from foundation.runstate import RunState
from harness.backends.vm import hostroot, packages
from harness.backends.vm import kernel as vmkernel
from harness.reports.export import fstests
from harness.reports.export.finding import ExportInput

TIMEOUT_S = 2400
TEST_DEV_BYTES = 1 << 30
# fstests wants room: _require_scratch_ext4_feature makes a 512 MiB file system on SCRATCH_DEV
SCRATCH_MIN_BYTES = 1 << 30
# Where the checkout lives in the output directory; tests/generic/999 is added to the copy only.
COPY = "fstests"

GUEST_JOB = """set -u
# No udev in the guest: dmsetup (fstests' and the script's) makes the /dev/mapper nodes itself,
# as block nodes. udev would make them links to ../dm-N, and fstests relies on that (its
# _short_dev names /sys/fs/xfs/dm-N after the link's target): a wrapper first in PATH does
# what udev's rule does, right after each dmsetup call.
export DM_DISABLE_UDEV=1
mkdir -p /tmp/pc-bin
cat > /tmp/pc-bin/dmsetup <<'WRAP'
#!/bin/sh
{dmsetup} "$@"
rc=$?
for node in /dev/mapper/*; do
    [ -b "$node" ] && [ ! -L "$node" ] || continue
    dm=$(basename "$(readlink -f /sys/dev/block/$((0x$(stat -c %t "$node"))):$((0x$(stat -c %T "$node"))))")
    [ -b "/dev/$dm" ] && ln -sfn "../$dm" "$node"
done
exit $rc
WRAP
chmod +x /tmp/pc-bin/dmsetup
export PATH=/tmp/pc-bin:$PATH
cd "$OUT"
truncate -s {test_bytes} /tmp/test.img && truncate -s {scratch_bytes} /tmp/scratch.img
TEST_DEV=$(losetup -f --show /tmp/test.img) && SCRATCH_DEV=$(losetup -f --show /tmp/scratch.img) || exit 2
{mkfs} $TEST_DEV > /dev/null 2>&1 || {{ echo "mkfs of TEST_DEV failed"; exit 2; }}
mkdir -p /tmp/test /tmp/scratch
cat > {copy}/local.config <<EOF
export FSTYP={fs}
export TEST_DEV=$TEST_DEV
export TEST_DIR=/tmp/test
export SCRATCH_DEV=$SCRATCH_DEV
export SCRATCH_MNT=/tmp/scratch
export RESULT_BASE=$OUT/results
EOF
echo "== fstests: ./check generic/{number} on $(uname -r)"
(cd {copy} && ./check generic/{number}) > fstests.out 2>&1
echo "fstests-exit $?" >> fstests.out
cat fstests.out
for f in results/generic/{number}.out.bad results/generic/{number}.full; do
    [ -f "$f" ] && {{ echo "== $f"; head -c 20000 "$f"; }}
done
umount /tmp/test 2>/dev/null
echo "== shell export"
WORK=/tmp/repro sh repro.sh > shell.out 2>&1
echo "shell-exit $?" >> shell.out
cat shell.out
"""


@dataclass
class Verdict:
    kernel: str          # as given
    uname: str
    fstests: str         # "failed", "passed", "not run", "error"
    shell: str           # "REPRODUCED", "not reproduced", "could not run"
    output: str          # where the guest's output went


def parse_kernels(spec: str) -> list[str]:
    kernels = [k for k in spec.split(",") if k]
    if not 1 <= len(kernels) <= 2:
        raise UsageError("--verify KERNEL[,FIXED]: one or two kernels")
    return kernels


def check_fstests_dir(path: str | None) -> str:
    if not path:
        raise UsageError("--verify needs --fstests DIR: a checkout of fstests built with `make` "
                         "(`make fstests FSTESTS=DIR` clones nothing: it builds the checkout you give)")
    if not (os.path.isfile(os.path.join(path, "check")) and os.path.isdir(os.path.join(path, "tests", "generic"))):
        raise UsageError(f"--fstests {path}: not an fstests checkout (no check, no tests/generic)")
    if not os.path.exists(os.path.join(path, "ltp", "fsstress")):
        raise UsageError(f"--fstests {path}: not built (run make there, or `make fstests FSTESTS={path}`)")
    return os.path.abspath(path)


def _copy_checkout(src: str, dst: str, test: str, golden: str) -> None:
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(".git", "results"))
    gen = os.path.join(dst, "tests", "generic")
    for name, text, mode in ((fstests.NUMBER, test, 0o755), (f"{fstests.NUMBER}.out", golden, 0o644)):
        path = os.path.join(gen, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
    with open(os.path.join(gen, "group.list"), "a") as f:   # ./check runs only listed tests
        f.write(f"{fstests.NUMBER} auto quick log\n")


def _verdicts(text: str) -> tuple[str, str]:
    m = re.search(r"^fstests-exit (\d+)", text, re.M)
    if re.search(rf"^generic/{fstests.NUMBER}\s.*\[not run\]", text, re.M) or "Not run: generic" in text:
        ft = "not run"
    elif re.search(r"^Failures: generic/", text, re.M) or (m and m[1] != "0" and "Passed all" not in text):
        ft = "failed"
    elif "Passed all 1 tests" in text:
        ft = "passed"
    else:
        ft = "error"
    sh = "could not run"
    if "RESULT: REPRODUCED" in text:
        sh = "REPRODUCED"
    elif "RESULT: not reproduced" in text:
        sh = "not reproduced"
    return ft, sh


def verify_on(x: ExportInput, kernel_spec: str, fstests_dir: str, test: str, golden: str, script: str,
              out_dir: str) -> Verdict:
    """Boot KERNEL_SPEC once; run the fstests export with ./check and the shell export."""
    packages.ensure(packages.VM_HOST_PACKAGES, "--verify")
    kernel = vmkernel.resolve(kernel_spec, None)
    state = RunState.create(f"export verify of {x.name} on {kernel_spec}")
    try:
        work = os.path.join(state.scratch, "guest-out")
        ownership.make_dir(work)
        _copy_checkout(fstests_dir, os.path.join(work, COPY), test, golden)
        with open(os.path.join(work, "repro.sh"), "w") as f:
            f.write(script)
        fs = get_fs(x.fs)
        job = GUEST_JOB.format(dmsetup=shutil.which("dmsetup") or "/sbin/dmsetup", test_bytes=TEST_DEV_BYTES, scratch_bytes=max(x.device_bytes, SCRATCH_MIN_BYTES),
                               mkfs=" ".join(fs.mkfs_cmd("", "")[:-1]), copy=COPY, fs=fs.name,
                               number=fstests.NUMBER)
        command = f"OUT={work} sh -c {_q(job)}"
        result = hostroot.run_in_guest(kernel, command, work, state, timeout=TIMEOUT_S,
                                       modules=[fs.name, "dm_flakey", "dm_log_writes"])
        log = os.path.join(out_dir, f"verify-{result.kernel or 'unknown'}.txt")
        with open(log, "w") as f:
            f.write(result.output)
        ft, sh = _verdicts(result.output)
        return Verdict(kernel_spec, result.kernel, ft, sh, log)
    finally:
        state.teardown_or_warn()


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"

"""Run an export in the vm backend's guest: does it reproduce on that kernel?

The guest (harness/backends/vm: the kernel under test in QEMU, busybox,
dmsetup, mkfs, the kernel's own dm-log-writes) also gets the file system's
fsck, xfs_io, the dm-flakey module, pc-repro built statically on the host
(the guest has no compiler), and three empty disks.

- shell: the script runs exactly as a kernel developer would run it, with
  DATA_DEV, LOG_DEV, REPLAY_DEV and PC_REPRO pointing at those disks.
- fstests, without a checkout at hand: the test runs under FSTESTS_SHIM,
  a small stand-in for the common/ helpers it calls (with a real fstests
  checkout, `--verify` runs it under ./check instead: verify.py)
  (dm-flakey tables as common/dmflakey sets them up: all writes pass, or
  all are dropped; fsck for _check_scratch_fs), and its output is compared
  with the golden .out as ./check would.

Output and exit status come back over the guest's serial ports.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from harness.backends.vm import capabilities, initramfs, packages
from harness.backends.vm import kernel as vmkernel
from harness.backends.vm.qemu import Disk, Guest
from foundation import ownership
from foundation.errors import EnvError
from foundation.filesystems import get_fs
from foundation.runstate import RunState
from harness.reports.export.finding import ExportInput
from harness.reports.export.shell import C_SOURCE

BOOT_TIMEOUT_S = 900
SHELL_JOB = """say "export check (shell)"
DATA_DEV=/dev/vda LOG_DEV=/dev/vdb REPLAY_DEV=/dev/vdc PC_REPRO=/pc/pc-repro WORK=/tmp/repro \\
    sh /pc/repro.sh > /dev/ttyS1 2>&1
result "exit $?"
"""
FSTESTS_JOB = """say "export check (fstests)"
grep -v '^\\. \\./common/' /pc/test > /pc/test.body
( . /pc/fstests-shim.sh; . /pc/test.body ) > /tmp/999.out 2>&1
cat /tmp/999.out > /dev/ttyS1
if diff /pc/test.out /tmp/999.out > /tmp/999.diff; then
    echo "FSTESTS: passed (output matches the golden .out)" > /dev/ttyS1; result "exit 0"
else
    { echo "FSTESTS: FAILED (output differs from the golden .out):"; cat /tmp/999.diff; cat /tmp/999.full; } > /dev/ttyS1
    result "exit 1"
fi
"""
# Stand-ins for the xfstests helpers the generated test calls (busybox sh).
FSTESTS_SHIM = """seq=999; seqres=/tmp/999; tmp=/tmp/999.tmp; here=/pc; status=1
: > $seqres.full
FSTYP={fs}; SCRATCH_DEV=/dev/vda; SCRATCH_MNT=/mnt/scratch; MOUNT_OPTIONS=""; MKFS_OPTIONS=""
XFS_IO_PROG={xfs_io}; SETFATTR_PROG=setfattr
mkdir -p $SCRATCH_MNT
_begin_fstest() {{ echo "QA output created by $seq"; }}
_fail() {{ echo "$*"; exit 1; }}
_notrun() {{ echo "not run: $*"; exit 1; }}
_supported_fs() {{ :; }}
_require_scratch() {{ :; }}
_require_scratch_nocheck() {{ :; }}
_require_scratch_size_nocheck() {{ :; }}
_require_dm_target() {{ :; }}
_require_xfs_io_command() {{ :; }}
_require_scratch_ext4_feature() {{ :; }}
_require_metadata_journaling() {{ :; }}
_require_attrs() {{ :; }}
_require_renameat2() {{ :; }}
_require_test_program() {{ :; }}
_scratch_mkfs() {{ {mkfs} "$@" $SCRATCH_DEV; }}
_scratch_mkfs_sized() {{ {mkfs} $MKFS_OPTIONS $SCRATCH_DEV; }}
_require_scratch_size() {{ :; }}
_flakey_table() {{  # 0: every write passes, 1: every write is dropped
    size=$(blockdev --getsz $NON_FLAKEY_DEV)
    if [ "$1" = 1 ]; then echo "0 $size flakey $NON_FLAKEY_DEV 0 0 180 1 drop_writes"
    else echo "0 $size flakey $NON_FLAKEY_DEV 0 180 0"; fi
}}
FLAKEY_ALLOW_WRITES=0; FLAKEY_DROP_WRITES=1
_init_flakey() {{ NON_FLAKEY_DEV=$SCRATCH_DEV; dmsetup create flakey-test --table "$(_flakey_table 0)" || _fail "no flakey target"; SCRATCH_DEV=/dev/mapper/flakey-test; }}
_load_flakey_table() {{ dmsetup suspend --nolockfs flakey-test; _flakey_table $1 | dmsetup load flakey-test; dmsetup resume flakey-test; }}
_scratch_mount() {{ mount -t $FSTYP $MOUNT_OPTIONS $SCRATCH_DEV $SCRATCH_MNT || _fail "mount failed"; }}
_scratch_unmount() {{ umount $SCRATCH_MNT; }}
_flakey_drop_and_remount() {{ _load_flakey_table 1; umount $SCRATCH_MNT; _load_flakey_table 0; _scratch_mount; }}
_cleanup_flakey() {{ dmsetup resume flakey-test 2>/dev/null; umount $SCRATCH_MNT 2>/dev/null; dmsetup remove flakey-test 2>/dev/null; }}
_check_scratch_fs() {{
    {fsck} $SCRATCH_DEV >> $seqres.full 2>&1
    c=$?
    if {bad}; then echo "_check_generic_filesystem: filesystem on $SCRATCH_DEV is inconsistent (see $seqres.full)"; fi
}}
"""


@dataclass
class VmCheck:
    kernel: str          # the guest's uname -r
    exit_code: int       # the script's: 1 reproduced, 0 clean, 2 could not run
    output: str


def _static_repro(out: str) -> None:
    p = subprocess.run(["cc", "-O2", "-static", "-o", out, C_SOURCE], capture_output=True, text=True)
    if p.returncode != 0:
        raise EnvError(f"building pc-repro statically for the guest failed: {p.stderr.strip().splitlines()[:1]}")


def _initrd(kernel: vmkernel.Kernel, fs_name: str, repro: str) -> str:
    """The vm backend's guest plus fsck, xfs_io, dm-flakey and pc-repro."""
    fs = get_fs(fs_name)
    tree = initramfs.base_tree(kernel, fs)
    for name in (fs.fsck[0], "xfs_io"):
        tree.add_program(initramfs.which(name))
    tree.add_program(repro, at="pc/pc-repro")
    initramfs.add_modules(tree, kernel, initramfs.guest_modules(kernel, [fs.name], [capabilities.DM_FLAKEY]))
    return initramfs.cached(tree)


def _boot(x: ExportInput, kernel_spec: str, job: str, files: dict[str, bytes]) -> VmCheck:
    packages.ensure(packages.vm_host_packages(), "--check-vm")
    kernel = vmkernel.resolve(kernel_spec, None)
    state = RunState.create(f"export check of {x.name} on {kernel_spec}")
    try:
        repro = os.path.join(state.scratch, "pc-repro")
        _static_repro(repro)
        base = _initrd(kernel, x.fs, repro)
        disks = []
        for name, size in (("data", x.device_bytes), ("log", max(64 << 20, 2 * x.device_bytes)),
                           ("replay", x.device_bytes)):
            path = os.path.join(state.scratch, f"{name}.img")
            os.close(ownership.create_file(path, size))
            disks.append(Disk(path))
        output = os.path.join(state.scratch, "output.txt")
        guest = Guest(kernel, base, state, state.scratch)
        outcome = guest.boot("export", {}, disks, timeout=BOOT_TIMEOUT_S, output=output,
                             files={"export.sh": job.encode(), **files})
        with open(output, errors="replace") as f:
            text = f.read()
        codes = [ln.split()[1] for ln in outcome.lines if ln.startswith("exit ")]
        if not outcome.completed or not codes:
            raise EnvError(f"the guest did not finish the export check: {outcome.console_tail[-300:]}")
        return VmCheck(outcome.kernel, int(codes[-1]), text)
    finally:
        state.teardown_or_warn()


def check_in_vm(x: ExportInput, script: str, kernel_spec: str) -> VmCheck:
    """Boot KERNEL_SPEC (as --kernel takes it) and run SCRIPT (the shell export of X) there."""
    return _boot(x, kernel_spec, SHELL_JOB, {"repro.sh": script.encode()})


def check_fstests_in_vm(x: ExportInput, test: str, golden: str, kernel_spec: str) -> VmCheck:
    """Run TEST (the fstests export of X) under FSTESTS_SHIM on KERNEL_SPEC; exit 1: its
    output differs from GOLDEN (the kernel has the bug), 0: it matches."""
    fs = get_fs(x.fs)
    bad = "[ $((c & 12)) -ne 0 ]" if fs.name == "ext4" else "[ $c -ne 0 ]"
    shim = FSTESTS_SHIM.format(fs=fs.name, xfs_io=initramfs.which("xfs_io"), bad=bad,
                               mkfs=" ".join(fs.mkfs), fsck=" ".join(fs.fsck))
    return _boot(x, kernel_spec, FSTESTS_JOB, {"test": test.encode(), "test.out": golden.encode(),
                                                "fstests-shim.sh": shim.encode()})

"""Boot the guest once: QEMU with the kernel under test, an initramfs and virtio disks.

Each boot runs one job (a script in harness/backends/vm/guest/) and powers off. The
QEMU process is written to the run's journal right after it is spawned, so
teardown and `powercut cleanup` stop it like any other child. Every boot
has a deadline; missing it is an error that quotes the console's last line.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from foundation import ownership
from foundation.errors import EnvError
from foundation.runstate import RunState, spawn_recorded
from harness.backends.vm import console as vmconsole, initramfs
from harness.backends.vm.kernel import Kernel

QEMU = "/usr/bin/qemu-system-x86_64"  # installed on demand (harness/backends/vm/packages.py)
GUEST_MEMORY_MIB = 1024
# panic=-1 + -no-reboot: a guest kernel panic ends QEMU at once instead of
# hanging; oops=panic makes an oops (say, in a recovery mount) end it too.
# loglevel=5: KERN_WARNING lines (WARN()'s "WARNING: CPU ...") reach the
# console, where harness/backends/vm/console.py looks for the kernel's bug reports.
KERNEL_ARGS = "console=ttyS0 panic=-1 oops=panic loglevel=5 rdinit=/init"
_KVM_GET_API_VERSION = 0xAE00
_KVM_CREATE_VM = 0xAE01


def kvm_usable() -> bool:
    """True if KVM can run a stock kernel here: hardware virtualization, and we may use it.

    /dev/kvm alone is not enough: on the project's machines it is backed by
    kvm_pvm (a paravirtual hypervisor for nested set-ups), which creates VMs
    but only runs PVM-enabled guest kernels; a stock kernel dies at once.
    """
    if not any(os.path.isdir(f"/sys/module/{m}") for m in ("kvm_intel", "kvm_amd")):
        return False
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if fcntl.ioctl(fd, _KVM_GET_API_VERSION) != 12:
            return False
        os.close(fcntl.ioctl(fd, _KVM_CREATE_VM, 0))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Disk:
    path: str
    discard: bool = False  # pass guest discards through (punch holes in the file)

    def drive_arg(self) -> str:
        # cache=unsafe: the host file only has to be right once QEMU exits,
        # so the guest's flushes need not reach the host's disk.
        arg = f"file={self.path.replace(',', ',,')},format=raw,if=virtio,cache=unsafe"
        return arg + (",discard=unmap" if self.discard else "")


@dataclass(frozen=True)
class Share:
    """A host directory the guest mounts with virtio 9p (`mount -t 9p -o trans=virtio TAG DIR`)."""
    tag: str
    path: str
    readonly: bool = True

    def qemu_args(self) -> list[str]:
        # multidevs=remap: a shared tree spanning several host file systems
        # keeps distinct inode numbers in the guest.
        fsdev = (f"local,id={self.tag},path={self.path.replace(',', ',,')},security_model=passthrough,"
                 f"multidevs=remap{',readonly=on' if self.readonly else ''}")
        return ["-fsdev", fsdev, "-device", f"virtio-9p-pci,fsdev={self.tag},mount_tag={self.tag}"]


@dataclass
class Outcome:
    kernel: str                 # the guest's `uname -r`
    lines: list[str]            # the job's result lines
    completed: bool             # the job reached its end (False: the guest died)
    console_tail: str
    console: str = ""           # what the console showed during the job
    hung: bool = False          # the guest stopped answering and was killed (live guests)

    def kernel_event(self, phase: str) -> dict[str, str] | None:
        """The kernel's own bug report during this job (or its death), as a Verdict/finding event."""
        event = vmconsole.first_event(self.console) if self.completed else \
            vmconsole.died_event(self.console, "hang" if self.hung else "died")
        if event is None:
            return None
        return {"event": event.event, "line": event.line, "console": event.excerpt, "phase": phase,
                "rule": f"{phase}:{event.rule()}", **({} if self.completed else {"died": "yes"})}


class BatchDisk(NamedTuple):
    """A recovery engine's batch disk (harness/backends/vm/recovery.py)."""

    path: str     # the host file
    device: str   # the same disk inside the guest


@dataclass
class Guest:
    """A kernel plus its initramfs for one file system, booted as often as needed."""

    kernel: Kernel
    base_initrd: str
    state: RunState
    console_dir: str            # each boot's console is kept here as vm-boot-N.console
    accel: str = field(default_factory=lambda: "kvm" if kvm_usable() else "tcg")
    boots: list[float] = field(default_factory=list)
    memory_mib: int = GUEST_MEMORY_MIB
    cpu: str | None = None       # QEMU's -cpu (None: its default model)

    def boot(self, job: str, env: dict[str, str], disks: list[Disk], *, timeout: float,
             files: dict[str, bytes] | None = None, output: str | None = None,
             shares: list[Share] | None = None) -> Outcome:
        """Run guest script JOB with ENV (PC_* variables) and FILES added under /pc.

        The job's result lines come back in the Outcome; OUTPUT, if given,
        receives what the guest writes to its second serial port (the
        workload's output). A job that reports an error raises EnvError.
        """
        work = self.state.make_dir(os.path.join(self.state.scratch, f"boot-{len(self.boots)}"))
        job_env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in {"PC_JOB": job, **env}.items())
        job_files = {"pc/job.env": job_env.encode(), **{f"pc/{k}": v for k, v in (files or {}).items()}}
        initrd = initramfs.boot_initrd(self.base_initrd, job_files, os.path.join(work, "initrd.gz"))
        console = os.path.join(self.console_dir, f"vm-boot-{len(self.boots)}.console")
        results = os.path.join(work, "results.log")
        cmd = qemu_command(self.kernel, self.accel, initrd, [f"file:{console}",
                           f"file:{output or os.path.join(work, 'output.log')}", f"file:{results}"], disks,
                           memory_mib=self.memory_mib, cpu=self.cpu, shares=shares)
        t0 = time.monotonic()
        with open(os.path.join(work, "qemu.err"), "w+") as err:
            # Own session: Ctrl-C reaches powercut, whose teardown stops QEMU.
            proc, res = spawn_recorded(self.state, cmd, "qemu", stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                       start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise EnvError(f"guest did not finish within {timeout:.0f}s: last console line: {last_line(console)}") from None
            finally:
                self.state.release(res)
            err.seek(0)
            qemu_err = err.read().strip()
        self.boots.append(round(time.monotonic() - t0, 2))
        if proc.returncode != 0:
            raise EnvError(f"qemu-system-x86_64 exited with {proc.returncode}: {(qemu_err.splitlines() or [''])[0]}")
        return parse_results(results, console)

    # The recovery engine's view (harness/backends/vm/recovery.py): one boot per job,
    # the batch disk is a scratch file sized to the batch (the boot's only disk).
    def run_job(self, job: str, env: dict[str, str], disks: list[Disk], *, timeout: float,
                on_line: Callable[[str], None] | None = None) -> Outcome:
        # Results are read after the boot: ON_LINE is not called (the caller checks afterwards).
        return self.boot(job, env, disks, timeout=timeout)

    def batch_disk(self, state: RunState, engine: int) -> BatchDisk:
        path = os.path.join(state.scratch, f"recovery-batch{f'-{engine + 1}' if engine else ''}.img")
        os.close(ownership.create_file(path))
        return BatchDisk(path, "/dev/vda")

    def batch_bytes(self, needed: int) -> int:
        return needed


def qemu_command(kernel: Kernel, accel: str, initrd: str, serials: list[str], disks: list[Disk], *,
                 memory_mib: int = GUEST_MEMORY_MIB, cpu: str | None = None,
                 shares: list[Share] | None = None) -> list[str]:
    """QEMU for one guest: no devices but SERIALS (ttyS0 = console, ...), DISKS (vda, vdb, ...) and SHARES."""
    cmd = [QEMU, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
           "-accel", accel, "-m", str(memory_mib), "-smp", "1",
           "-kernel", kernel.image, "-initrd", initrd, "-append", KERNEL_ARGS]
    for serial in serials:
        cmd += ["-serial", serial]
    for d in disks:
        cmd += ["-drive", d.drive_arg()]
    if cpu:
        cmd += ["-cpu", cpu]
    for share in shares or []:
        cmd += share.qemu_args()
    return cmd


def last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = [s.strip() for s in f.read().decode(errors="replace").splitlines() if s.strip()]
    except FileNotFoundError:
        return "(no console output)"
    return lines[-1][:300] if lines else "(no console output)"


def parse_results(results: str, console_path: str) -> Outcome:
    with open(results, encoding="utf-8", errors="replace") as f:
        lines = [line.rstrip("\r\n") for line in f if line.strip()]
    kernel, job_lines, completed = "", [], False
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "kernel":
            kernel = rest
        elif word == "done":
            completed = True
        elif word == "error":
            raise EnvError(f"guest: {rest} (last console line: {last_line(console_path)})")
        else:
            job_lines.append(line)
    with open(console_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return Outcome(kernel, job_lines, completed, last_line(console_path), console=text)

"""A guest that lives for many workloads: booted once, fed jobs over a control channel.

A one-job boot (harness/backends/vm/qemu.py `Guest`) costs seconds under TCG; a fuzz
campaign runs thousands of workloads. A LiveGuest boots the `serve` job
(harness/backends/vm/guest/serve.sh) once and then runs `record` and `recover` jobs
on request. Its disks are fixed at boot and reused by every job:

    vda  data disk     the host writes a fresh file system onto it before each recording
    vdb  log disk      dm-log-writes' log, zeroed by the host before each recording
    vdc  records disk  the executor's records (JSON workloads)
    vdd  input disk    files the host hands the guest (job.env, the plan, a program)
    vde  batch disks   crash images to recover, back to back (sparse, MAX slots each):
    vdf                one per recovery mode (--recovery both runs two engines)

Serial ports: ttyS0 console (a file), ttyS1 the workload's output (a file),
ttyS2 the control channel (a Unix socket QEMU serves; the host connects). The socket is
in the run's short socket directory (runstate.SOCKET_ROOT), not its scratch: a deep
scratch path would pass AF_UNIX's 107 bytes.
Every command gets its answer on ttyS2; if none comes within the hang limit
the guest is declared hung and killed. A guest that panics ends QEMU
(panic=-1, -no-reboot): the host sees the socket close. Either way the next
job boots a new guest. QEMU dies with its worker (PR_SET_PDEATHSIG) and is
in the guest's own run-state journal, so `powercut cleanup` finds it too.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from foundation import ownership
from foundation.parentdeath import signal_on_parent_death
from foundation.errors import EnvError
from foundation.runstate import RunState, spawn_recorded
from harness.backends.vm import initramfs
from harness.backends.vm.kernel import Kernel
from harness.backends.vm.qemu import BatchDisk, Disk, Outcome, kvm_usable, last_line, qemu_command
from checkers.crashwalk.recovery_modes import MODES

# A command with no answer for this long means a hung guest (seconds; POWERCUT_VM_HANG_S).
HANG_S = float(os.environ.get("POWERCUT_VM_HANG_S", "300"))
BOOT_S = float(os.environ.get("POWERCUT_VM_TIMEOUT", "900"))
IN_DISK_BYTES = 64 << 20
RECORDS_DISK_BYTES = 1 << 30
DATA, LOG, RECORDS, INPUT = "/dev/vda", "/dev/vdb", "/dev/vdc", "/dev/vdd"
# One batch disk per recovery mode (vde, vdf): the engines of --recovery both stage side by side.
BATCHES = tuple(f"/dev/vd{chr(ord('e') + i)}" for i in range(len(MODES)))


def _die_with_parent() -> None:
    signal_on_parent_death(signal.SIGKILL)


@dataclass
class LiveDisks:
    data: str
    log: str
    records: str
    input: str
    batches: list[str]


@dataclass
class LiveGuest:
    """KERNEL with its initramfs, serving jobs on disks sized for DEVICE_BYTES images."""

    kernel: Kernel
    base_initrd: str
    device_bytes: int
    log_bytes: int
    batch_slots: int
    accel: str = field(default_factory=lambda: "kvm" if kvm_usable() else "tcg")
    boots: list[float] = field(default_factory=list)      # seconds from spawn to "ready"
    jobs: dict[str, float] = field(default_factory=dict)  # job name -> seconds spent, summed
    lost: int = 0                                         # jobs the guest died or hung in (each costs a boot)
    release: str = ""                                     # the guest's `uname -r`
    state: RunState | None = None
    disks: LiveDisks | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _sock: socket.socket | None = None
    _buf: bytes = b""
    _console: str = ""
    _sockets: str = ""                                    # the run's short socket directory

    # -- lifetime ---------------------------------------------------------------
    def _ensure_state(self) -> RunState:
        if self.state is None:
            self.state = RunState.create(f"vm guest {self.kernel.label}")
            s = self.state.scratch
            self._sockets = self.state.socket_dir()
            self.disks = LiveDisks(*(os.path.join(s, n) for n in ("data.img", "log.img", "records.img", "input.img")),
                                   [os.path.join(s, f"batch-{i}.img") for i in range(len(BATCHES))])
            for path, size in ((self.disks.data, self.device_bytes), (self.disks.log, self.log_bytes),
                               (self.disks.records, RECORDS_DISK_BYTES), (self.disks.input, IN_DISK_BYTES),
                               *((b, self.batch_slots * self.device_bytes) for b in self.disks.batches)):
                os.close(ownership.create_file(path, size))
        return self.state

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._sock is not None

    def output_path(self) -> str:
        return os.path.join(self._ensure_state().scratch, "output.log")

    def boot(self) -> None:
        state = self._ensure_state()
        assert self.disks is not None
        self.stop()
        work = state.scratch
        initrd = initramfs.boot_initrd(self.base_initrd, {"pc/job.env": f"export PC_JOB=serve PC_IN_DISK={INPUT}\n".encode()},
                                       os.path.join(work, "initrd.gz"))
        sock_path = os.path.join(self._sockets, "control.sock")
        if os.path.exists(sock_path):
            os.unlink(sock_path)
        self._console = os.path.join(work, f"console-{len(self.boots)}.log")
        serials = [f"file:{self._console}", f"file:{self.output_path()}", "chardev:ctl"]
        d = self.disks
        disks = [Disk(d.data, discard=True), Disk(d.log), Disk(d.records), Disk(d.input), *map(Disk, d.batches)]
        cmd = qemu_command(self.kernel, self.accel, initrd, serials, disks)
        cmd[1:1] = ["-chardev", f"socket,id=ctl,path={sock_path},server=on,wait=on"]
        t0 = time.monotonic()
        self._err = open(os.path.join(work, "qemu.err"), "w+")
        self._proc, self._res = spawn_recorded(state, cmd, "qemu (live guest)", stdin=subprocess.DEVNULL,
                                               stdout=self._err, stderr=self._err, start_new_session=True,
                                               preexec_fn=_die_with_parent)
        self._sock = self._connect(sock_path, t0 + 60)
        self._buf = b""
        lines, silent = self._until(("ready",), BOOT_S)
        if silent or not lines or lines[-1] != "ready":
            tail = last_line(self._console)
            self.stop()
            raise EnvError(f"the live guest did not come up: last console line: {tail}")
        for line in lines:
            if line.startswith("kernel "):
                self.release = line.split(" ", 1)[1]
        self.boots.append(round(time.monotonic() - t0, 2))

    def _connect(self, path: str, deadline: float) -> socket.socket:
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                self._err.seek(0)
                raise EnvError(f"qemu-system-x86_64 exited with {self._proc.returncode}: "
                               f"{(self._err.read().strip().splitlines() or [''])[0]}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if time.monotonic() > deadline:
                    raise EnvError("qemu-system-x86_64 never opened its control socket") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Power the guest off (kill QEMU: its disks are host files, nothing to flush)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None
            assert self.state is not None
            self.state.release(self._res)
            self._err.close()

    def close(self) -> None:
        self.stop()
        if self.state is not None:
            self.state.teardown_or_warn()
            self.state = None

    def __enter__(self) -> "LiveGuest":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the control channel -----------------------------------------------------
    def _send(self, line: str) -> None:
        assert self._sock is not None
        self._sock.sendall(line.encode() + b"\n")

    def _until(self, ends: tuple[str, ...], limit: float,
               on_line: Callable[[str], None] | None = None) -> tuple[list[str], bool]:
        """(lines up to and including one whose first word is in ENDS, False); the lines so
        far without an end if the guest died, and with True if it went silent for LIMIT
        seconds (what it said before it hung tells which mount it hung in)."""
        assert self._sock is not None
        lines: list[str] = []
        while True:
            while b"\n" in self._buf:
                raw, self._buf = self._buf.split(b"\n", 1)
                line = raw.decode(errors="replace").rstrip("\r")
                if not line.strip():
                    continue
                lines.append(line)
                if on_line is not None:
                    on_line(line)
                if line.split(" ", 1)[0] in ends:
                    return lines, False
            self._sock.settimeout(limit)
            try:
                chunk = self._sock.recv(65536)
            except socket.timeout:
                return lines, True
            except OSError:
                chunk = b""
            if not chunk:
                return lines, False
            self._buf += chunk

    # -- jobs -------------------------------------------------------------------------
    def put_files(self, files: dict[str, bytes]) -> None:
        """Hand FILES (path under / -> content) to the guest through the input disk."""
        assert self.disks is not None
        sector = 0
        with open(self.disks.input, "r+b") as f:
            for path, data in files.items():
                f.seek(sector * 512)
                f.write(data)
                f.flush()
                self._send(f"file {path} {sector} {len(data)}")
                sector += (len(data) + 511) // 512
        if sector * 512 > IN_DISK_BYTES:
            raise EnvError(f"files for the guest take {sector * 512} bytes, more than the input disk's {IN_DISK_BYTES}")
        for _ in files:
            lines, _ = self._until(("ok", "error"), HANG_S)
            if not lines or lines[-1] != "ok":
                raise EnvError(f"the live guest could not read its input files: {lines[-1] if lines else 'no answer'}")

    def run_job(self, job: str, env: dict[str, str], disks: list[Disk] | None = None, *,
                timeout: float = 0, files: dict[str, bytes] | None = None, output: str | None = None,
                on_line: Callable[[str], None] | None = None) -> Outcome:
        """Run guest script JOB with ENV and FILES (under /pc); DISKS are ignored (the guest
        has its own). OUTPUT receives what the workload wrote to ttyS1. A guest that dies or
        hangs gives an Outcome with completed=False (and is gone); an `error` line raises EnvError."""
        if not self.alive:
            self.boot()
        env_text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in {"PC_JOB": job, **env}.items())
        console_start = _size(self._console)
        output_start = _size(self.output_path())
        t0 = time.monotonic()
        self.put_files({"pc/job.env": env_text.encode(), **{f"pc/{k}": v for k, v in (files or {}).items()}})
        self._send(f"job {job}")
        lines, hung = self._until(("done", "error"), HANG_S, on_line)
        self.jobs[job] = round(self.jobs.get(job, 0.0) + time.monotonic() - t0, 3)
        completed = not hung and bool(lines) and lines[-1] == "done"
        if not completed:
            self.lost += 1
            self.stop()
        text = _read_from(self._console, console_start)
        if output is not None:
            with open(output, "wb") as f:
                f.write(_read_from(self.output_path(), output_start).encode())
        if lines and lines[-1].startswith("error "):
            raise EnvError(f"guest: {lines[-1][6:]} (last console line: {last_line(self._console)})")
        body = [s for s in lines if s != "done"]
        return Outcome(self.release, body, completed, last_line(self._console), console=text, hung=hung)

    # -- the recovery engine's view (harness/backends/vm/recovery.py) ----------------------------
    def batch_disk(self, state: RunState, engine: int) -> BatchDisk:
        self._ensure_state()
        assert self.disks is not None
        if engine >= len(BATCHES):
            raise EnvError(f"recovery engine {engine}: a live guest has {len(BATCHES)} batch disks")
        return BatchDisk(self.disks.batches[engine], BATCHES[engine])

    def batch_bytes(self, needed: int) -> int:
        size = self.batch_slots * self.device_bytes
        if needed > size:
            raise EnvError(f"a recovery batch of {needed} bytes does not fit the live guest's {size}-byte batch disk")
        return size


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""

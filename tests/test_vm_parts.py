"""Pieces of the vm backend that need no guest boot: archives, modules, packages, batches."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from harness.backends.vm.recovery import VmRecovery
from foundation.errors import EnvError
from foundation.filesystems import get_fs
from foundation.sparse import copy_range, data_extents
from harness.backends.vm import cpio, packages
from harness.backends.vm.kernel import Kernel
from harness.backends.vm.console import died_event, first_event
from harness.backends.vm.qemu import BatchDisk, Disk, Outcome
from checkers.crashwalk.walk import verdict_findings
from replay.logformat import FLUSH, FUA, LogReader, LogWriter
from replay.logsplice import image_prefix, splice


def test_cpio_archive_unpacks_with_busybox(tmp_path: Path) -> None:
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        pytest.skip("no busybox to unpack with")
    members = [cpio.directory("a"), cpio.file("a/x.sh", b"echo hi\n", executable=True),
               cpio.file("a/odd", b"12345"), cpio.symlink("a/link", "x.sh")]
    (tmp_path / "in.cpio").write_bytes(cpio.archive(members))
    subprocess.run([busybox, "cpio", "-i", "-F", str(tmp_path / "in.cpio")], cwd=tmp_path, check=True,
                   capture_output=True)
    assert (tmp_path / "a/x.sh").read_bytes() == b"echo hi\n" and os.access(tmp_path / "a/x.sh", os.X_OK)
    assert (tmp_path / "a/odd").read_bytes() == b"12345"
    assert os.readlink(tmp_path / "a/link") == "x.sh"
    assert cpio.gzipped(members) == cpio.gzipped(members)  # deterministic: cache keys stay stable


def fake_modules(tmp_path: Path) -> str:
    d = tmp_path / "lib/modules/6.99.0"
    d.mkdir(parents=True)
    (d / "modules.dep").write_text(
        "kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/jbd2/jbd2.ko.xz\n"
        "kernel/fs/jbd2/jbd2.ko.xz:\n"
        "kernel/lib/crc16.ko.xz:\n"
        "kernel/drivers/md/dm-log-writes.ko.xz: kernel/drivers/md/dm-mod.ko.xz\n"
        "kernel/drivers/md/dm-mod.ko.xz:\n")
    (d / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\n")
    return str(d)


def test_module_order_loads_dependencies_first_and_skips_builtins(tmp_path: Path) -> None:
    k = Kernel("test", "/vmlinux", fake_modules(tmp_path))
    assert k.module_order(["virtio_pci", "dm-log-writes", "dm_mod", "ext4"]) == [
        "kernel/drivers/md/dm-mod.ko.xz", "kernel/drivers/md/dm-log-writes.ko.xz",
        "kernel/fs/jbd2/jbd2.ko.xz", "kernel/lib/crc16.ko.xz", "kernel/fs/ext4/ext4.ko.xz"]


def test_missing_module_names_the_kernel(tmp_path: Path) -> None:
    k = Kernel("debian:linux-image-test", "/vmlinux", fake_modules(tmp_path))
    with pytest.raises(EnvError, match="kernel debian:linux-image-test has no module xfs"):
        k.module_order(["xfs"])


def test_missing_packages_without_root_name_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EnvError, match=r"--backend vm needs the Debian packages qemu-system-x86: "
                                       r"install them \(apt-get install qemu-system-x86\)"):
        packages.ensure({"/nonexistent/qemu-system-x86_64": "qemu-system-x86"}, "--backend vm")


def test_copy_range_moves_only_data_to_an_offset(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    with open(src, "wb") as f:
        f.truncate(1 << 20)
        f.seek(4096)
        f.write(b"A" * 4096)
        f.seek(512 << 10)
        f.write(b"B" * 8192)
    with open(src, "rb") as s, open(dst, "wb+") as d:
        copy_range(s.fileno(), d.fileno(), 0, 1 << 20, 3 << 20)
        d.truncate(4 << 20)
        d.seek((3 << 20) + 4096)
        assert d.read(4096) == b"A" * 4096
        d.seek((3 << 20) + (512 << 10))
        assert d.read(8192) == b"B" * 8192
        # Holes stayed holes: only the two data regions were written.
        written = sum(n for _, n in data_extents(d.fileno(), 4 << 20))
        assert written <= 64 << 10


class FakeGuest:
    """Plays back scripted guest outcomes and remembers each boot's environment."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        self.outcomes = outcomes
        self.envs: list[dict[str, str]] = []

    def run_job(self, job: str, env: dict[str, str], disks: list[Disk], *, timeout: float,
                on_line: Callable[[str], None] | None = None) -> Outcome:
        assert job == "recover" and len(disks) == 1
        self.envs.append(env)
        outcome = self.outcomes.pop(0)
        for line in outcome.lines if on_line else []:  # as a live guest streams them
            on_line(line)
        return outcome

    def batch_disk(self, state: SimpleNamespace, engine: int) -> BatchDisk:
        path = os.path.join(state.scratch, f"batch{engine}.img")
        open(path, "wb").close()
        return BatchDisk(path, "/dev/vda")

    def batch_bytes(self, needed: int) -> int:
        return needed


PANIC_CONSOLE = """pc: mount 0
pc: mount 1
[   12.345678] BUG: unable to handle page fault for address: 0000000000001234
[   12.345679] #PF: supervisor read access in kernel mode
[   12.345680] Oops: 0000 [#1] PREEMPT SMP NOPTI
[   12.345681] RIP: 0010:ext4_fill_super+0x123/0x456 [ext4]
[   12.345690] Kernel panic - not syncing: Fatal exception
"""
WARNING_CONSOLE = """pc: mount 2
[   13.000000] ------------[ cut here ]------------
[   13.000001] WARNING: CPU: 0 PID: 77 at fs/ext4/super.c:1234 ext4_put_super+0x1/0x2 [ext4]
[   13.000002] Modules linked in: ext4
[   13.000003] ---[ end trace 0000000000000000 ]---
pc: mount 3
"""


def test_vm_recovery_batch_survives_a_guest_that_dies_mid_mount(tmp_path: Path) -> None:
    image = tmp_path / "crash.img"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    guest = FakeGuest([
        # Boot 1 recovers image 0, then the kernel oopses (oops=panic) mounting image 1.
        Outcome("6.99", ["begin 0", "ok 0", "begin 1"], completed=False, console_tail="Kernel panic - not syncing",
                console=PANIC_CONSOLE),
        # Boot 2 starts after the image that killed the kernel; image 2 WARNs but mounts,
        # image 3 does not mount (a file-system verdict, not a kernel one).
        Outcome("6.99", ["begin 2", "ok 2", "begin 3", "fail 3 mount: Structure needs cleaning"], completed=True,
                console_tail="", console=WARNING_CONSOLE),
    ])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    engine = VmRecovery(guest, get_fs("ext4"), "", SimpleNamespace(scratch=str(scratch)), timeout=60)  # type: ignore[arg-type]
    try:
        for point in (10, 11, 12, 13):
            assert engine.submit(point, str(image)) == []
        verdicts = dict(engine.finish())
    finally:
        engine.close()
    assert [e["PC_FIRST"] for e in guest.envs] == ["0", "2"] and guest.envs[0]["PC_IMAGES"] == "4"
    assert verdicts[10].mount_ok and verdicts[10].fsck_ran and not verdicts[10].fsck_failed
    assert verdicts[10].kernel is None
    # The image the kernel died on: a kernel event with the console excerpt, nothing else known.
    k = verdicts[11].kernel
    assert not verdicts[11].mount_ok and k is not None and k["died"] == "yes"
    assert k["event"] == "bug" and "unable to handle page fault" in k["line"] and "ext4_fill_super" in k["console"]
    # A WARNING while mounting image 2 is that image's kernel event; the image itself was fine.
    k = verdicts[12].kernel
    assert verdicts[12].mount_ok and not verdicts[12].fsck_failed and k is not None and "died" not in k
    assert k["event"] == "warning" and k["rule"] == "recovery mount:warning:fs/ext4/super.c:1234"
    assert not verdicts[13].mount_ok and verdicts[13].mount_error == "mount: Structure needs cleaning"
    assert verdicts[13].kernel is None
    findings = verdict_findings(verdicts[11], SimpleNamespace(point=11, mark=None, id="p11"), get_fs("ext4"))  # type: ignore[arg-type]
    assert [f.kind for f in findings] == ["kernel"] and findings[0].evidence["phase"] == "recovery mount"


def test_kernel_events_on_the_console() -> None:
    assert first_event("[ 1.0] EXT4-fs error (device dm-0): bad block\n[ 1.1] I/O error\n") is None
    e = first_event(WARNING_CONSOLE)
    assert e is not None and e.event == "warning" and e.rule() == "warning:fs/ext4/super.c:1234"
    assert "cut here" in e.excerpt
    # Linux 7.x puts the source before "at" and the CPU after it (Debian 7.2.13's console):
    # the same WARNING, the same identity as on 6.x.
    e7 = first_event("[   16.908872] WARNING: fs/jbd2/transaction.c:334 at start_this_handle.cold+0x22/0x2f [jbd2],"
                     " CPU#0: pc-exec/139\n[   16.909270] Modules linked in: ext4 jbd2\n")
    assert e7 is not None and e7.event == "warning" and e7.rule() == "warning:fs/jbd2/transaction.c:334"
    # A guest that dies without a bug report: the last console line says what it was doing.
    died = died_event("pc: job record\npc: mount 4\n", "hang")
    assert died.event == "hang" and died.line == "pc: mount 4"
    crash = died_event("[ 2.0] sysrq: Trigger a crash\n[ 2.1] Kernel panic - not syncing: sysrq triggered crash\n", "died")
    assert crash.event == "sysrq-crash"


def test_log_splice_puts_a_fresh_image_before_the_kernel_log(tmp_path: Path) -> None:
    """A fresh file system made on the host, written as log entries, then the guest's own
    log: replayed from zeros, the spliced log rebuilds the image and then the guest's writes."""
    image = tmp_path / "fresh.img"
    with open(image, "wb") as f:
        f.truncate(8 << 20)
        f.seek(1 << 20)
        f.write(b"A" * 4096)
        f.seek(5 << 20)
        f.write(b"B" * 512)
    n_prefix = image_prefix(str(image), str(tmp_path / "prefix.log"), "pc:mkfs-done")
    with LogWriter(str(tmp_path / "guest.log")) as w:   # what the kernel writes: ends with its end mark
        w.mark("pc:mounted")
        w.write(4096, b"C" * 1024)
        w.flush()
        w.write(8192, b"D" * 512, FLUSH | FUA)
    out = tmp_path / "run.log"
    n = splice(str(tmp_path / "prefix.log"), str(tmp_path / "guest.log"), str(out))
    with LogReader(str(out)) as r:
        entries = list(r.entries())
        assert r.nr_entries == n == n_prefix + 5 == len(entries)
        marks = [e.mark for e in entries if e.is_mark]
        assert marks == ["pc:mkfs-done", "pc:mounted", "dm-log-writes-end"]
        device = bytearray(8 << 20)
        for e in entries:
            if e.is_write:
                a, b = e.byte_range(r.sectorsize)
                device[a:b] = r.read_data(e)
    assert device[1 << 20:(1 << 20) + 4096] == b"A" * 4096 and device[5 << 20:(5 << 20) + 512] == b"B" * 512
    assert device[2 << 20:(2 << 20) + 1024] == b"C" * 1024 and device[4 << 20:(4 << 20) + 512] == b"D" * 512
    # drop-flush: the kernel's flushes are left out, its writes stay.
    n = splice(None, str(tmp_path / "guest.log"), str(out), drop_flush=True)
    with LogReader(str(out)) as r:
        entries = list(r.entries())
    assert n == 4 and not any(e.is_flush or e.is_fua for e in entries)
    assert [e.sector for e in entries if e.is_write] == [4096, 8192]


def test_live_guest_control_channel_tells_answers_death_and_silence_apart() -> None:
    """The host reads the guest's answers line by line; a closed channel (QEMU exited: the
    guest died) ends the lines without an end word; silence past the limit is a hang, and
    what came before it (which mount began) is kept."""
    import socket
    from harness.backends.vm.live import LiveGuest
    g = LiveGuest(Kernel("k", "/vmlinux", None), "/initrd", 1 << 20, 1 << 20, 1)
    host, guest = socket.socketpair()
    g._sock = host
    guest.sendall(b"begin 0\r\nok 0\n\nbegin 1\ndone\nready\n")
    assert g._until(("done",), 5) == (["begin 0", "ok 0", "begin 1", "done"], False)
    assert g._until(("ready",), 5) == (["ready"], False)   # what came after stays buffered
    guest.sendall(b"begin 3\n")
    # Silence: a hang in mount 3. No timing decides this: "begin 3" is buffered before the call
    # and nothing more is ever sent, so any limit ends the same way (0.2 s only keeps it short).
    assert g._until(("done",), 0.2) == (["begin 3"], True)
    guest.sendall(b"begin 2\n")
    guest.close()
    assert g._until(("done",), 5) == (["begin 2"], False)  # closed: the guest died mid-job
    host.close()


def test_both_guest_kinds_offer_the_vm_guest_interface() -> None:
    """Guest (one boot per job) and LiveGuest (booted once) are used through VmGuest only:
    each protocol method must accept every call the protocol allows, each field must exist."""
    import dataclasses
    import inspect

    from harness.backends.vm.guests import VmGuest
    from harness.backends.vm.live import LiveGuest
    from harness.backends.vm.qemu import Guest

    methods = {n: inspect.signature(getattr(VmGuest, n)) for n in ("run_job", "batch_disk", "batch_bytes")}
    for cls in (Guest, LiveGuest):
        assert set(VmGuest.__annotations__) <= {f.name for f in dataclasses.fields(cls)}, cls
        for name, proto in methods.items():
            params = inspect.signature(getattr(cls, name)).parameters
            for p in proto.parameters.values():
                assert p.name in params, (cls, name, p.name)
                assert params[p.name].kind == p.kind, (cls, name, p.name)
            extra = [p for p in params.values() if p.name not in proto.parameters]
            assert all(p.default is not inspect.Parameter.empty for p in extra), (cls, name, extra)

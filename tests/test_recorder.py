"""End-to-end tests of build/pc-recorder, the FUSE stand-in for dm-log-writes.

Stack under test: pc-recorder serves MOUNT/disk.img, a loop device sits on that
file, a real file system is made and mounted on the loop device. The log the
recorder writes must be in dm-log-writes format, and replaying its writes and
discards in order onto a zero image must reproduce the recorded image exactly.

The log parser is deliberately self-contained (no project imports): it checks
the recorder against the documented format, not against our own replayer.
Only resources this test created are ever torn down: other tests create loop
devices and mounts concurrently.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import select
import shutil
import signal
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from common import require_root_stack

ROOT = Path(__file__).resolve().parents[1]
RECORDER = ROOT / "build" / "pc-recorder"

MAGIC = 0x6A736677736872
FLUSH, DISCARD, MARK = 1, 4, 8
END_MARK = b"dm-log-writes-end"
MiB = 1 << 20

pytestmark = [
    pytest.mark.e2e,
    require_root_stack,
]


# ---------------------------------------------------------------- log format

@dataclass
class Entry:
    sector: int
    nr_sectors: int
    flags: int
    data_off: int        # byte offset of the entry's data in the log
    text: bytes = b""    # MARK text


@dataclass
class Log:
    sectorsize: int
    nr_entries: int
    entries: list[Entry]


def parse_log(buf) -> Log:
    """Parse and validate a dm-log-writes log held in `buf` (bytes/mmap)."""
    magic, version, nr_entries, ss = struct.unpack_from("<QQQI", buf, 0)
    assert magic == MAGIC, hex(magic)
    assert version == 1
    assert ss in (512, 4096)
    assert buf[28:ss] == bytes(ss - 28), "super block padding not zero"
    entries = []
    off = ss
    while off < len(buf):
        assert off + ss <= len(buf), f"truncated header at {off}"
        sector, nr_sectors, flags, data_len = struct.unpack_from("<QQQQ", buf, off)
        text = b""
        if flags & MARK:
            assert nr_sectors == 0 and 0 < data_len < ss - 32
            text = bytes(buf[off + 32:off + 32 + data_len])
            assert buf[off + 32 + data_len:off + ss] == bytes(ss - 32 - data_len)
        else:
            assert data_len == 0
            assert buf[off + 32:off + ss] == bytes(ss - 32), f"header padding at {off}"
        if flags & FLUSH:
            assert sector == 0 and nr_sectors == 0
        off += ss
        entries.append(Entry(sector, nr_sectors, flags, off, text))
        if not flags & DISCARD:
            off += nr_sectors * ss
    assert off == len(buf), "log does not end on an entry boundary"
    return Log(ss, nr_entries, entries)


def replay_hash(buf, log: Log, size: int) -> str:
    """Apply every write and discard in log order onto a zero image."""
    img = bytearray(size)
    ss = log.sectorsize
    for e in log.entries:
        start, length = e.sector * ss, e.nr_sectors * ss
        if not length:
            continue
        assert start + length <= size, f"entry beyond device end: {e}"
        if e.flags & DISCARD:
            img[start:start + length] = bytes(length)
        else:
            img[start:start + length] = buf[e.data_off:e.data_off + length]
    return hashlib.sha256(img).hexdigest()


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def check_log(path: Path, image: Path) -> Log:
    """Common assertions; returns the parsed log."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as buf:
        log = parse_log(buf)
        assert log.nr_entries == len(log.entries)
        assert log.entries[-1].flags == MARK and log.entries[-1].text == END_MARK
        assert replay_hash(buf, log, image.stat().st_size) == file_hash(image)
    return log


# --------------------------------------------------------------- the stack

def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check and res.returncode:
        raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")
    return res


def _is_mounted(path: Path) -> bool:
    target = str(path).replace(" ", "\\040")
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f)


def _loop_backing(dev: str) -> str | None:
    try:
        return Path(f"/sys/block/{Path(dev).name}/loop/backing_file").read_text().strip()
    except OSError:
        return None


class Stack:
    """recorder -> loop device -> mounted file system, torn down in the order
    the harness uses. Tracks exactly what it created so cleanup never touches
    anyone else's loop devices or mounts."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.fuse_mnt = tmp / "fuse"
        self.fs_mnt = tmp / "fs"
        self.fuse_mnt.mkdir()
        self.fs_mnt.mkdir()
        self.disk = self.fuse_mnt / "disk.img"
        self.control = self.fuse_mnt / "control"
        self.err = tmp / "recorder.err"
        self.proc: subprocess.Popen | None = None
        self.loop: str | None = None
        self.marks: list[bytes] = []

    def start(self, image: Path, log: Path, *extra: str) -> None:
        r, w = os.pipe()
        try:
            with open(self.err, "wb") as err:
                self.proc = subprocess.Popen(
                    [str(RECORDER), "--image", str(image), "--log", str(log),
                     "--ready-fd", str(w), *extra, str(self.fuse_mnt)],
                    pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=err, stderr=err)
            os.close(w)
            w = -1
            ready, _, _ = select.select([r], [], [], 10)
            got = os.read(r, 64) if ready else b""
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        assert got == b"ready\n", f"no ready signal; stderr: {self.err.read_text()!r}"

    def attach(self, *losetup_opts: str) -> str:
        self.loop = _run("losetup", "--find", "--show", *losetup_opts, str(self.disk)).stdout.strip()
        return self.loop

    def mount(self, mkfs: list[str]) -> None:
        _run(*mkfs, self.loop)
        _run("mount", self.loop, str(self.fs_mnt))

    def mark(self, text: str) -> None:
        fd = os.open(self.control, os.O_WRONLY)
        try:
            os.write(fd, text.encode() + b"\n")
        finally:
            os.close(fd)
        self.marks.append(text.encode())

    def _ours(self) -> bool:
        return self.loop is not None and _loop_backing(self.loop) == str(self.disk)

    def _detach(self, check: bool = True) -> None:
        _run("losetup", "-d", self.loop, check=check)
        # With the device still open elsewhere (e.g. udev probing) the kernel
        # only marks it autoclear; the FUSE file stays busy until it is gone.
        deadline = time.monotonic() + 10
        while self._ours() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not check or not self._ours(), f"{self.loop} still attached"

    def teardown(self, stop: str = "fusermount") -> int:
        """Clean teardown in the harness's order; the daemon is stopped by
        unmounting FUSE or by SIGTERM. Returns the daemon's exit status."""
        _run("umount", str(self.fs_mnt))
        self._detach()
        if stop == "sigterm":
            self.proc.send_signal(signal.SIGTERM)
        else:
            _run("fusermount3", "-u", str(self.fuse_mnt))
        status = self.proc.wait(timeout=20)
        assert not _is_mounted(self.fuse_mnt)
        return status

    def cleanup(self) -> None:
        """Best effort after a failure; only touches what this Stack made."""
        if _is_mounted(self.fs_mnt):
            if _run("umount", str(self.fs_mnt), check=False).returncode:
                _run("umount", "-l", str(self.fs_mnt), check=False)
        if self._ours():
            self._detach(check=False)
        if _is_mounted(self.fuse_mnt):
            if _run("fusermount3", "-u", str(self.fuse_mnt), check=False).returncode:
                _run("fusermount3", "-u", "-z", str(self.fuse_mnt), check=False)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def stderr_problems(self) -> list[str]:
        # Warnings (e.g. no CAP_SYS_RESOURCE for PR_SET_IO_FLUSHER in a
        # container) are fine; any other line reports an I/O error.
        return [line for line in self.err.read_text().splitlines()
                if not line.startswith("pc-recorder: warning:")]


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()
    if s.proc is not None:
        assert s.proc.poll() is not None
        with pytest.raises(ProcessLookupError):
            os.kill(s.proc.pid, 0)
    if s.loop is not None:
        assert not s._ours(), f"{s.loop} left attached"
    assert not _is_mounted(s.fs_mnt) and not _is_mounted(s.fuse_mnt)


def sparse_image(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def workload(s: Stack) -> None:
    """A few files with fsync, marks between the operations."""
    s.mark("start")
    for i in range(4):
        with open(s.fs_mnt / f"file{i}", "wb") as f:
            f.write(os.urandom(48 * 1024 * (i + 1)))
            f.flush()
            os.fsync(f.fileno())
        s.mark(f"file{i}-synced")
    os.rename(s.fs_mnt / "file0", s.fs_mnt / "renamed")
    os.unlink(s.fs_mnt / "file1")
    dfd = os.open(s.fs_mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    s.mark("dir-synced")


# --------------------------------------------------------------------- tests

EXT4 = ["mkfs.ext4", "-q", "-F", "-b", "4096"]
FS_CASES = {
    # name: (image size, mkfs command, recorder options, losetup options, stop)
    "ext4": (64 * MiB, EXT4, [], [], "fusermount"),
    "ext4-sigterm": (64 * MiB, EXT4, [], [], "sigterm"),
    "ext4-dio": (64 * MiB, EXT4, [], ["--direct-io=on"], "fusermount"),
    "ext4-4k": (64 * MiB, EXT4, ["--sector-size", "4096"], ["--sector-size", "4096"],
                "fusermount"),
    "xfs": (300 * MiB, ["mkfs.xfs", "-q", "-f"], [], [], "fusermount"),
    "btrfs": (256 * MiB, ["mkfs.btrfs", "-q", "-f"], [], [], "fusermount"),
}


@pytest.mark.parametrize("case", list(FS_CASES))
def test_record_and_replay(stack, tmp_path, case):
    size, mkfs, rec_opts, loop_opts, stop = FS_CASES[case]
    if not shutil.which(mkfs[0]):
        pytest.skip(f"{mkfs[0]} not installed")
    image = sparse_image(tmp_path / "image", size)
    logf = tmp_path / "log"

    stack.start(image, logf, *rec_opts)
    stack.attach(*loop_opts)
    stack.mount(mkfs)
    workload(stack)
    assert stack.teardown(stop) == 0
    assert stack.stderr_problems() == []

    log = check_log(logf, image)
    assert log.sectorsize == (4096 if rec_opts else 512)
    marks = [e.text for e in log.entries if e.flags & MARK]
    assert marks == stack.marks + [END_MARK]
    assert any(e.flags & FLUSH for e in log.entries), "fsync produced no FLUSH"
    assert sum(1 for e in log.entries if e.flags == 0 and e.nr_sectors) > 10


def test_drop_flush_fault(stack, tmp_path):
    image = sparse_image(tmp_path / "image", 64 * MiB)
    logf = tmp_path / "log"

    stack.start(image, logf, "--fault", "drop-flush")
    stack.attach()
    stack.mount(EXT4)
    workload(stack)
    assert stack.teardown() == 0

    log = check_log(logf, image)
    assert [e.text for e in log.entries if e.flags & MARK] == stack.marks + [END_MARK]
    assert not any(e.flags & FLUSH for e in log.entries)


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10


def _fallocate(path: Path, mode: int, off: int, length: int) -> None:
    # Straight to the syscall: util-linux fallocate(1) adds an fsync, and
    # Python's os.posix_fallocate knows no modes.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fd = os.open(path, os.O_RDWR)
    try:
        if libc.fallocate(fd, mode, off, length) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def test_file_level_entries_and_sigterm(stack, tmp_path):
    """Drive disk.img and control directly: exact entries, error codes,
    and a clean log after SIGTERM."""
    image = sparse_image(tmp_path / "image", 1 * MiB)
    logf = tmp_path / "log"
    stack.start(image, logf)

    fd = os.open(stack.disk, os.O_RDWR)
    try:
        os.pwrite(fd, b"A" * 4096, 8192)
        os.pwrite(fd, b"B" * 8192, 32768)
        os.fsync(fd)
        assert os.pread(fd, 4096, 8192) == b"A" * 4096
        for off, length in ((100, 512), (512, 100)):
            with pytest.raises(OSError) as ei:
                os.pwrite(fd, b"x" * length, off)
            assert ei.value.errno == errno.EINVAL
        with pytest.raises(OSError) as ei:
            os.ftruncate(fd, 4096)
        assert ei.value.errno == errno.EPERM
    finally:
        os.close(fd)
    # Both land on written data, so replay only matches if they are logged.
    _fallocate(stack.disk, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192, 8192)
    _fallocate(stack.disk, FALLOC_FL_ZERO_RANGE, 32768, 4096)
    with open(stack.disk, "rb") as f:
        f.seek(8192)
        assert f.read(4096) == bytes(4096)
        f.seek(32768)
        assert f.read(8192) == bytes(4096) + b"B" * 4096
    _fallocate(stack.disk, 0, 0, 4096)  # plain allocation: not logged
    with pytest.raises(OSError) as ei:
        _fallocate(stack.disk, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 512)
    assert ei.value.errno == errno.EINVAL
    stack.mark("hello")

    with pytest.raises(OSError) as ei:
        os.open(stack.control, os.O_RDONLY)
    assert ei.value.errno == errno.EACCES
    for bad in (b"\n", b"\0abc"):  # no text: dm refuses a mark message without one
        fd = os.open(stack.control, os.O_WRONLY)
        try:
            with pytest.raises(OSError) as ei:
                os.write(fd, bad)
            assert ei.value.errno == errno.EINVAL
        finally:
            os.close(fd)
    stack.mark("y" * (512 - 33))  # the longest mark a 512-byte header block holds
    # Longer, or with a NUL: cut the way dm-log-writes' log_mark cuts (kstrndup to sectorsize - 33, a C string).
    for text, size in ((b"z" * 600, 600), (b"a\0b", 3)):
        fd = os.open(stack.control, os.O_WRONLY)
        try:
            assert os.write(fd, text) == size
        finally:
            os.close(fd)

    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(timeout=10) == 0
    assert not _is_mounted(stack.fuse_mnt)

    log = check_log(logf, image)
    got = [(e.sector, e.nr_sectors, e.flags, e.text) for e in log.entries]
    assert got == [
        (16, 8, 0, b""),             # the 4 KiB write at 8192
        (64, 16, 0, b""),            # the 8 KiB write at 32768
        (0, 0, FLUSH, b""),          # fsync; close() sends no flush
        (16, 16, DISCARD, b""),      # punch hole
        (64, 8, 0, b""),             # zero range, logged as a zero write
        (0, 0, MARK, b"hello"),
        (0, 0, MARK, b"y" * 479),
        (0, 0, MARK, b"z" * 479),
        (0, 0, MARK, b"a"),
        (0, 0, MARK, END_MARK),
    ]


@pytest.mark.parametrize("args", [
    ["--image", "{tmp}/missing.img", "--log", "{tmp}/log", "{tmp}"],
    ["--image", "{tmp}/img", "--log", "{tmp}/log", "--sector-size", "1024", "{tmp}"],
    ["--image", "{tmp}/img", "--log", "{tmp}/log", "{tmp}/img"],
    ["--image", "{tmp}/img", "--log", "{tmp}/nodir/log", "{tmp}"],
    ["--image", "{tmp}/img", "--log", "{tmp}/log", "--bogus", "{tmp}"],
    ["--image", "{tmp}/img", "--log", "{tmp}/log", "--fault", "explode", "{tmp}"],
    ["--image", "{tmp}/img", "--log", "{tmp}/log"],
    ["--image", "{tmp}/img", "--log", "{tmp}/log", "--device", "write_us=abc", "{tmp}"],
    ["--image", "{tmp}/img", "--log", "{tmp}/log", "--device", "warp=9", "{tmp}"],
], ids=["missing-image", "bad-sector-size", "mountpoint-not-dir", "log-not-creatable",
        "unknown-option", "unknown-fault", "no-mountpoint", "device-not-a-number", "device-unknown-key"])
def test_bad_invocation(tmp_path, args):
    sparse_image(tmp_path / "img", MiB)
    argv = [a.format(tmp=tmp_path) for a in args]
    res = subprocess.run([str(RECORDER), *argv], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pc-recorder: "), res.stderr
    assert not (tmp_path / "log").exists(), "log created before arguments were checked"
    assert not _is_mounted(tmp_path)


def _requests(s: Stack) -> None:
    """Writes, a flush, a discard, a zeroing and marks straight to disk.img."""
    fd = os.open(s.disk, os.O_RDWR)
    try:
        for k in range(8):
            os.pwrite(fd, bytes([65 + k]) * 4096 * (k % 3 + 1), k * 16384)
            if k % 3 == 2:
                os.fsync(fd)
        assert os.pread(fd, 4096, 16384) == b"B" * 4096
    finally:
        os.close(fd)
    _fallocate(s.disk, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192)
    _fallocate(s.disk, FALLOC_FL_ZERO_RANGE, 32768, 4096)
    s.mark("done")


@pytest.mark.parametrize("device", ["read_us=200,write_us=300,flush_us=2000,discard_us=100,mbps=40,qd=1",
                                    "write_us=50,qd=4"])
def test_device_timing_leaves_the_log_unchanged(tmp_path, device):
    """A device profile changes when requests complete, never what is logged."""
    logs = []
    for name, extra in (("plain", []), ("timed", ["--device", device])):
        d = tmp_path / name
        d.mkdir()
        s = Stack(d)
        try:
            image = sparse_image(d / "image", 1 * MiB)
            s.start(image, d / "log", *extra)
            _requests(s)
            s.proc.send_signal(signal.SIGTERM)
            assert s.proc.wait(timeout=20) == 0
            assert s.stderr_problems() == []
            log = check_log(d / "log", image)
            logs.append([(e.sector, e.nr_sectors, e.flags, e.text) for e in log.entries])
        finally:
            s.cleanup()
    assert logs[0] == logs[1] and len(logs[0]) > 10

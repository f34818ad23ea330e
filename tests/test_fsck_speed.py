"""What makes fsck cheaper in the crash walk must not change a verdict.

- xfs_repair's speed options (FsType.fsck_cmd: -o bhash sized to the image,
  phase2_threads=1; FsType.fsck_env: glibc allocator tunables) give the same
  exit code and the same messages as plain `xfs_repair -n` on damaged images.
- fsck() captures the tool's output through memory files and a pidfd (no
  wake-up per line it prints): the same exit code and text as a capture
  through pipes, on damaged ext4 and xfs images.
- FsckVerdicts (fsck once per distinct recovered image): a verdict in the
  making is waited for, a failed fsck leaves the key to the next one. That
  reused verdicts are what fsck says on real walks is checked in
  tests/test_oracle_incremental.py.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from checkers.crashwalk.recovery import FsckVerdicts, fsck
from foundation.filesystems import get_fs
from foundation.sparse import data_extents

DAMAGED = 24   # damaged images compared per run (more by hand: DAMAGED=300)
PROTO = """/dev/null
0 0
d--755 0 0
a d--755 0 0
{files}
$
b d--755 0 0
c d--755 0 0
$
big ---644 0 0 {big}
$
$
"""


def _messages(p: subprocess.CompletedProcess[str]) -> tuple[int, list[str]]:
    """Exit code and what the output says, in an order-free form: xfs_repair's threads print
    at once (lines come in any order, and even glue into each other) and it prints heap
    addresses. The characters of the output, whitespace aside, sorted: a message more or
    less changes them."""
    text = re.sub(r"\b(0x)?[0-9a-f]{10,}\b", "ADDR", p.stdout + p.stderr)
    return p.returncode, sorted("".join(text.split()))


@pytest.mark.skipif(shutil.which("mkfs.xfs") is None, reason="needs xfsprogs")
def test_xfs_repair_speed_option_keeps_the_verdict(tmp_path: Path) -> None:
    xfs = get_fs("xfs")
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(7)
    files = []
    for i in range(40):
        (src / f"f{i}").write_bytes(rng.randbytes(rng.choice([100, 5000, 70000])))
        files.append(f"f{i} ---644 0 0 {src / f'f{i}'}")
    (src / "big").write_bytes(rng.randbytes(3 << 20))
    proto = tmp_path / "proto"
    proto.write_text(PROTO.format(files="\n".join(files), big=src / "big"))
    clean = tmp_path / "clean.img"
    with open(clean, "wb") as f:
        f.truncate(300 << 20)
    subprocess.run(["mkfs.xfs", "-q", "-f", "-p", str(proto), str(clean)], check=True)
    assert "-o" in xfs.fsck_cmd(str(clean))  # the options under test are in use
    with open(clean, "rb") as f:
        extents = data_extents(f.fileno(), 300 << 20)
    codes = set()
    assert xfs.fsck_env() and "GLIBC_TUNABLES" in xfs.fsck_env()  # and the allocator settings
    for _ in range(DAMAGED):
        with open(clean, "r+b") as f:   # damage it, check, then undo the damage
            undo = []
            for _ in range(rng.randint(1, 4)):
                off, n = rng.choice(extents)
                pos, junk = rng.randrange(off, off + n), rng.randbytes(rng.choice([1, 4, 64]))
                undo.append((pos, os.pread(f.fileno(), len(junk), pos)))
                os.pwrite(f.fileno(), junk, pos)
            plain = subprocess.run(xfs.fsck + [str(clean)], capture_output=True, text=True)
            fast = subprocess.run(xfs.fsck_cmd(str(clean)), capture_output=True, text=True, env=xfs.fsck_env())
            code, text = fsck(str(clean), xfs)   # the walk's own call, through memory files
            for pos, old in reversed(undo):
                os.pwrite(f.fileno(), old, pos)
        assert _messages(fast) == _messages(plain), f"{plain.stdout}{plain.stderr}\n---\n{fast.stdout}{fast.stderr}"
        walk = subprocess.CompletedProcess(fast.args, code, text, "")
        assert _messages(walk) == _messages(fast), f"{fast.stdout}{fast.stderr}\n---\n{text}"
        codes.add(plain.returncode)
    assert codes == {0, 1}  # damage it finds and damage it does not: both compared


def test_fsck_verdicts_wait_for_a_verdict_in_the_making() -> None:
    memo = FsckVerdicts()
    assert memo.claim(1) is None  # ours to check
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(memo.claim(1)))
    waiter.start()
    # Proof that it waits: the thread is seen blocked on the pending check's event (a deadline
    # poll on that condition, not a sleep standing in for it); a claim that returned would end it.
    cond = memo._pending[1]._cond   # threading.Event's condition: its waiters are blocked in wait()
    deadline = time.monotonic() + 60
    while not cond._waiters:        # type: ignore[attr-defined]
        assert waiter.is_alive() and time.monotonic() < deadline, f"the claim did not wait: {got}"
        time.sleep(0.001)
    assert got == []  # waits for the check in progress
    memo.settle(1, (0, "clean", "/img"))
    waiter.join()
    assert got == [(0, "clean", "/img")] and memo.hits == 1
    # A check that produced nothing (fsck raised) hands the key to the next worker.
    assert memo.claim(2) is None
    second: list[object] = []
    waiter = threading.Thread(target=lambda: second.append(memo.claim(2)))
    waiter.start()
    memo.settle(2, None)
    waiter.join()
    assert second == [None]
    memo.settle(2, (4, "errors", "/img2"))
    assert memo.claim(2) == (4, "errors", "/img2")


def test_fsck_verdicts_stop_hashing_when_nothing_repeats() -> None:
    memo = FsckVerdicts()
    memo.hashed_bytes = FsckVerdicts.GIVE_UP_BYTES
    assert not memo.worth_hashing
    memo.hits = 1
    assert memo.worth_hashing  # once an image repeated, hashing pays


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="needs e2fsprogs")
def test_fsck_output_through_memory_files_is_what_pipes_capture(tmp_path: Path) -> None:
    ext4 = get_fs("ext4")
    image = tmp_path / "ext4.img"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(Path(__file__).parent / "workloads"), str(image)], check=True)
    rng = random.Random(11)
    with open(image, "rb") as f:
        extents = [(off, n) for off, n in data_extents(f.fileno(), 1 << 20)]  # the metadata at the front
    codes = set()
    for _ in range(12):
        with open(image, "r+b") as f:
            undo = []
            for _ in range(rng.randint(0, 3)):
                off, n = rng.choice(extents)
                pos = rng.randrange(off, off + n)
                junk = rng.randbytes(rng.choice([1, 8, 64]))
                undo.append((pos, os.pread(f.fileno(), len(junk), pos)))
                os.pwrite(f.fileno(), junk, pos)
            piped = subprocess.run(ext4.fsck_cmd(str(image)), capture_output=True, text=True)
            got = fsck(str(image), ext4)
            for pos, old in reversed(undo):
                os.pwrite(f.fileno(), old, pos)
        assert got == (piped.returncode, (piped.stdout + piped.stderr).strip())
        codes.add(piped.returncode)
    assert len(codes) > 1  # clean and damaged images both compared

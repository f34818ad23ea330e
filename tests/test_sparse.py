"""foundation/sparse.py: making a range of one sparse file read as another's."""

from __future__ import annotations

import os
import random
from pathlib import Path

from foundation.sparse import data_extents, mirror_range


def test_mirror_range_makes_exactly_that_range_equal(tmp_path: Path) -> None:
    rng = random.Random(3)
    size = 4 << 20
    src, dst = tmp_path / "src", tmp_path / "dst"
    with open(src, "wb") as f:   # data, holes, and data that is all zeros
        f.truncate(size)
        for off in (0, 70 << 10, 1 << 20, (3 << 20) + 512):
            f.seek(off)
            f.write(rng.randbytes(rng.choice([512, 4096, 100 << 10])))
        f.seek(2 << 20)
        f.write(bytes(64 << 10))
    with open(dst, "wb") as f:   # junk everywhere
        f.write(rng.randbytes(size))
    with open(src, "rb") as s, open(dst, "r+b") as d:
        before = os.pread(d.fileno(), size, 0)
        for start, end in ((4096, (2 << 20) + 8192), ((3 << 20) + 1000, size)):
            mirror_range(s.fileno(), d.fileno(), start, end)
        after, want = os.pread(d.fileno(), size, 0), os.pread(s.fileno(), size, 0)
        for start, end in ((4096, (2 << 20) + 8192), ((3 << 20) + 1000, size)):
            assert after[start:end] == want[start:end]
        # outside the ranges nothing changed
        assert after[:4096] == before[:4096]
        assert after[(2 << 20) + 8192:(3 << 20) + 1000] == before[(2 << 20) + 8192:(3 << 20) + 1000]
        # the source's holes became holes (the image stays sparse)
        data = sum(min(off + n, size) - max(off, (3 << 20) + 1000)
                   for off, n in data_extents(d.fileno(), size) if off + n > (3 << 20) + 1000)
        assert data < 512 << 10


def test_mirror_range_past_the_source_end_reads_zeros(tmp_path: Path) -> None:
    """Small ranges are read and written, large ones walked by extents: both give zeros past SRC's end."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"\x07" * 10000)
    for end in (64 << 10, 3 << 20):
        dst.write_bytes(b"\xff" * (4 << 20))
        with open(src, "rb") as s, open(dst, "r+b") as d:
            mirror_range(s.fileno(), d.fileno(), 4096, end, dst_start=8192)
        got = dst.read_bytes()
        assert got[:8192] == b"\xff" * 8192
        assert got[8192:8192 + 10000 - 4096] == b"\x07" * (10000 - 4096)
        assert got[8192 + 10000 - 4096:8192 + end - 4096] == bytes(end - 10000)
        assert got[8192 + end - 4096:] == b"\xff" * ((4 << 20) - 8192 - end + 4096)

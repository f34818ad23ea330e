"""The guest's tree dump (pc-dump.c, run here on a host directory) rebuilt by contentdump.py:
what the content oracle reads must come out as it went in, and reads that fail must say so."""

from __future__ import annotations

import errno
import os
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from checkers.findings import Finding
from foundation import paths
from foundation.errors import EnvError
from harness.backends.vm import contentdump


def _dump(root: Path, out: Path, size: int = 64 << 20) -> bytes:
    subprocess.run([paths.c_program("pc-recover"), "dump", str(root), str(out), str(size)], check=True)
    return out.read_bytes()


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    """What the oracle reads of every path: kind, size, link count, data, symlink target, user xattrs."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            xattrs = {} if stat.S_ISLNK(st.st_mode) else \
                {n: os.getxattr(p, n) for n in os.listxattr(p) if n.startswith("user.")}
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    body: object = f.read()
                out[rel] = ("file", st.st_size, st.st_nlink, body, xattrs)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(p))
            else:
                out[rel] = (stat.S_IFMT(st.st_mode), xattrs)
    return out


def test_a_dumped_tree_rebuilds_as_the_oracle_reads_it(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "d" / "e").mkdir(parents=True)
    dst.mkdir()
    (src / "d" / "small").write_bytes(b"hello")
    with open(src / "sparse", "wb") as f:           # data, a hole, data, a hole at the end
        f.write(os.urandom(5000))
        f.seek(3 << 20)
        f.write(b"tail")
        f.truncate(5 << 20)
    (src / "empty").write_bytes(b"")
    os.link(src / "d" / "small", src / "d" / "e" / "again")   # two names: link count 2 on both sides
    os.symlink("d/small", src / "link")
    os.symlink("nowhere", src / "d" / "dangling")
    os.mkfifo(src / "fifo")
    try:
        os.setxattr(src / "d" / "small", "user.a", b"\x00value")
        os.setxattr(src / "d", "user.dir", b"")
    except OSError:
        pytest.skip("this directory's file system keeps no user xattrs")
    failed = contentdump.rebuild(_dump(src, tmp_path / "dump"), str(dst))
    assert failed == []
    assert _tree(dst) == _tree(src)
    assert os.stat(dst / "d" / "small").st_nlink == 2


def test_a_dump_that_does_not_fit_is_an_environment_error(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "big").write_bytes(os.urandom(1 << 16))
    with pytest.raises(subprocess.CalledProcessError):
        _dump(src, tmp_path / "dump", 4096)   # pc-recover says it did not fit: exit 1
    with pytest.raises(EnvError, match="did not fit"):
        contentdump.rebuild((tmp_path / "dump").read_bytes(), str(dst))


def test_a_failed_read_is_a_corruption_finding_and_hides_what_it_explains(tmp_path: Path) -> None:
    # As pc-dump.c writes them (its header comment): the root, a directory whose readdir failed
    # with EUCLEAN, a file that read back, the end.
    def rec(tag: bytes, body: bytes) -> bytes:
        return tag + struct.pack("<I", len(body)) + body
    dump = (contentdump.MAGIC + rec(b"N", struct.pack("<QIIQ", 2, stat.S_IFDIR | 0o755, 3, 0))
            + rec(b"N", struct.pack("<QIIQ", 3, stat.S_IFDIR | 0o755, 2, 0) + b"d")
            + rec(b"E", struct.pack("<IH", errno.EUCLEAN, 1) + b"d" + b"readdir")
            + rec(b"N", struct.pack("<QIIQ", 4, stat.S_IFREG | 0o644, 1, 1) + b"ok")
            + rec(b"D", struct.pack("<Q", 0) + b"y") + rec(b"Z", b""))
    failed = contentdump.rebuild(dump, str(tmp_path))
    assert [(f.kind, f.evidence["path"], f.evidence["errno"]) for f in failed] == [("corruption", "d", "EUCLEAN")]
    assert (tmp_path / "ok").read_bytes() == b"y" and (tmp_path / "d").is_dir()
    findings = [Finding("durability", "", evidence={"path": p}) for p in ("d/f", "d", "ok", "dd")]
    assert [f.evidence["path"] for f in contentdump.judged_by_failures(findings, failed)] == ["ok", "dd"]

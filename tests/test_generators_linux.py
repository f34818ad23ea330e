"""The generators reach the linux tier's states (docs/semantics.md): fsync of
directories including the root, fsync through an fd whose file was renamed,
linked or unlinked, and names reused by a file, directory or symlink. Both
the record-based generators (Hypothesis and AFL++ decode the same records)
and the exhaustive engine's seq-2 space."""

from __future__ import annotations

import random
from typing import Any

from workloads import exhaustive
from workloads.opcodec import RECORD, decode


def features(ops: list[dict[str, Any]]) -> set[str]:
    """Which linux-tier states an op list reaches."""
    got: set[str] = set()
    fd_path: dict[str, str] = {}
    changed: dict[str, str] = {}   # path -> how its name changed since it was opened
    removed: set[str] = set()
    files = {"foo", "bar", "A/foo", "A/bar", "B/foo", "A/C/foo"}
    for op in ops:
        kind = op["op"]
        if kind == "open":
            fd_path[op["fd"]] = op["path"]
            if op["path"] in removed and "O_CREAT" in op.get("flags", []):
                got.add("reuse-file")
        elif kind in ("rename", "link", "unlink"):
            src = op.get("from", op.get("path"))
            changed[src] = kind
            if kind != "link":
                removed.add(src)
        elif kind in ("mkdir", "symlink"):
            if op["path"] in removed or (kind == "mkdir" and op["path"] in files):
                got.add(f"reuse-{kind}")
        elif kind == "fsync":
            path = fd_path.get(op["fd"], "")
            if path == ".":
                got.add("fsync-root")
            elif path in ("A", "B", "A/C"):
                got.add("fsync-dir")
            elif path in changed:
                got.add(f"fsync-after-{changed[path]}")
    return got


WANTED = {"fsync-root", "fsync-dir", "fsync-after-rename", "fsync-after-link", "fsync-after-unlink",
          "reuse-file", "reuse-mkdir", "reuse-symlink"}


def test_record_generators_reach_the_linux_states() -> None:
    rng = random.Random(13)
    got: set[str] = set()
    for _ in range(3000):
        got |= features(decode(bytes(rng.randrange(256) for _ in range(RECORD * 8))))
    assert WANTED <= got, WANTED - got


def test_exhaustive_seq2_reaches_the_linux_states() -> None:
    """Both seq-2 spaces: the product of every core op (--core-ops with all of them) and
    the pruned, ordered ACE space (the default)."""
    names = [c.name for c in exhaustive.CORE]
    for core in ("rename-open", "link-open", "unlink-open", "move-across", "reuse-file", "reuse-dir",
                 "reuse-symlink"):
        assert core in names
    n = exhaustive.space_size(1)
    assert n * n == exhaustive.space_size(2, names)
    for space in (names, None):
        got: set[str] = set()
        step = max(1, exhaustive.space_size(2, space) // 4000)
        for i in range(0, exhaustive.space_size(2, space), step):
            got |= features(exhaustive.workload(2, i, space)["threads"][0]["ops"][len(exhaustive.SETUP):])
        assert WANTED - {"reuse-mkdir"} <= got, (space, WANTED - got)
    assert any(exhaustive.workload(2, i, names)["name"] == "seq2-unlink-open.fsync-reuse-dir.fsync"
               for i in range(exhaustive.space_size(2, names)))

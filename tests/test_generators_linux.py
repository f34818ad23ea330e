"""The generators reach the linux tier's states (docs/semantics.md): fsync of
directories including the root, fsync through an fd whose file was renamed,
linked or unlinked, and names reused by a file, directory or symlink. Both
the record-based generators (Hypothesis and AFL++ decode the same records)
and the exhaustive engine's seq-2 space."""

from __future__ import annotations

import os
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


def persisted_after_namespace_ops(ops: list[dict[str, Any]]) -> tuple[int, int]:
    """(namespace ops, those followed right away by an fsync of a file or directory they used
    or of the directory holding such a name)."""
    ns = hit = 0
    fd_path: dict[str, str] = {}
    for i, op in enumerate(ops):
        if op["op"] == "open":
            fd_path[op["fd"]] = op["path"]
        if op["op"] not in ("rename", "link", "unlink", "symlink", "mkdir", "rmdir"):
            continue
        ns += 1
        used = {op[k] for k in ("from", "to", "path") if k in op}
        near = used | {os.path.dirname(p) or "." for p in used}
        nxt = ops[i + 1:i + 3]
        if nxt and nxt[0]["op"] == "fsync" and fd_path.get(nxt[0]["fd"]) in used:
            hit += 1
        elif len(nxt) == 2 and nxt[0]["op"] == "open" and nxt[0]["path"] in near and nxt[1]["op"] == "fsync":
            hit += 1
    return ns, hit


def test_records_weigh_namespace_ops_followed_by_an_fsync_of_what_they_touched() -> None:
    """Hypothesis and AFL++ draw uniform bytes: the vocabulary's weights decide. Namespace ops
    have a tier of their own, are mostly followed by fsync or fsync_dir, and those pick the
    file the op used or its directory first (before: 0.23 such pairs per 8-record input)."""
    rng = random.Random(13)
    ns = hit = 0
    for _ in range(3000):
        a, b = persisted_after_namespace_ops(decode(bytes(rng.randrange(256) for _ in range(RECORD * 8))))
        ns, hit = ns + a, hit + b
    assert hit / 3000 > 1.0 and hit / ns > 0.35, (ns, hit)

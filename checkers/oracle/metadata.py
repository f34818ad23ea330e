"""Reads an inode's metadata on the crash image: link count, xattrs, allocated blocks,
where fsync/sync made them durable (the model says what; this module looks)."""

from __future__ import annotations

import os
from typing import Any

from checkers.findings import Finding
from checkers.fsrules import rule
from checkers.history import Inode
from checkers.oracle.model import Guarantee, Model
from checkers.oracle.view import PointView
from foundation.intervals import merge_ranges
from workloads.pattern import generate


def check_metadata(m: Model, full: str, path: str, inodes: list[Inode], st: os.stat_result,
                   v: PointView) -> Finding | None:
    """Link count and xattrs, where one inode is possible and fsync/sync made them durable."""
    if len(inodes) != 1:
        return None
    ino = inodes[0]
    g = m.guarantee(ino, v)
    if g is None or g.metadata is None:
        return None
    q = g.metadata.prefix
    if m.semantics.holds("fallocate-fsync"):
        short = allocation_shortfall(full, ino, q, st)
        if short is not None:
            return meta_finding(path, g, "allocation", short[0], short[1], "fallocate-fsync")
    later = [pos for pos, _, inos in m.h.name_changes if pos >= q and pos in v.allowed and ino.ino in inos]
    if g.metadata.ino is None and not later:  # sync: the names, so the link count, are durable
        want = sum(1 for i in m.h.ns[q].values() if i == ino.ino)
        if want and st.st_nlink != want:
            return meta_finding(path, g, "link count", want, st.st_nlink)
    changed = {name for pos, x in ino.xattrs if pos >= q and pos in v.allowed for name in x} | {
        name for pos, x in ino.xattrs if pos >= q and pos in v.allowed
        for name in ino.xattrs_at(pos)}  # set or removed after the guarantee: either state
    durable = ino.xattrs_at(q)
    try:
        present = {n for n in os.listxattr(full) if n.startswith("user.")}
    except OSError:
        return None
    for name, (file_id, seq, it, length) in durable.items():
        if name in changed:
            continue
        if name not in present:
            return meta_finding(path, g, f"xattr {name}", "present", "missing")
        want_v = generate(m.wid, file_id, seq, it, 0, length)
        if os.getxattr(full, name) != want_v:
            return meta_finding(path, g, f"xattr {name}", f"value of op {seq}", "another value")
    for name in present - set(durable) - changed:
        if any(name in x for _, x in ino.xattrs):  # removed before the guarantee, back again
            return meta_finding(path, g, f"xattr {name}", "absent", "present")
    return None


def allocation_shortfall(full: str, ino: Inode, q: int, st: os.stat_result) -> tuple[str, str] | None:
    """fallocate-fsync: blocks fallocate reserved before the guarantee at Q
    must still be allocated; (expected, found) if fewer are. Checked only
    while nothing since the first fallocate could free blocks: a punch or
    a truncate, to any size (ext4 drops blocks past EOF on truncate)."""
    allocs = [e for e in ino.events if e.kind == "alloc" and e.pos < q]
    if not allocs:
        return None
    first = allocs[0].pos
    if any(e.kind in ("zero", "size", "collapse", "insert") and e.pos > first for e in ino.events):
        return None
    # Data written into a reserved range may be placed elsewhere (btrfs
    # compress-force writes copy-on-write): only untouched reservations count.
    if any(e.kind in ("data", "maybe") and e.pos > first and any(a.start < e.end and e.start < a.end for a in allocs)
           for e in ino.events):
        return None
    bsize = os.statvfs(full).f_bsize
    whole = [(-(-e.start // bsize) * bsize, e.end // bsize * bsize) for e in allocs]
    want = sum(t - s for s, t in merge_ranges([(s, t) for s, t in whole if t > s]))
    have = st.st_blocks * 512
    if have >= want:
        return None
    return f"at least {want} bytes allocated", f"{have} bytes allocated"


def meta_finding(path: str, g: Guarantee, what: str, expected: Any, found: Any,
                 rule_name: str | None = None) -> Finding:
    p = g.metadata
    assert p is not None
    r = rule_name or p.rule
    return Finding("durability", f"{path}: {what} is {found}, but {p.ex.describe()} made it {expected}",
                   evidence={"path": path, "rule": r, "op": p.ex.describe(), "op_mark": p.ex.mark,
                             "expected": str(expected), "found": str(found),
                             "reference": rule(r).reference})

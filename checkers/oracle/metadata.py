"""Reads an inode's metadata on the crash image: link count, xattrs, allocated blocks,
where fsync/sync made them durable (the model says what; this module looks)."""

from __future__ import annotations

import os
from typing import Any

from checkers.findings import Finding
from checkers.fsrules import rule
from checkers.history import Persist
from checkers.oracle.model import Model
from checkers.oracle.view import PointView
from checkers.timeline import Inode
from foundation import fiemap
from foundation.intervals import merge_ranges
from workloads.pattern import generate


def check_metadata(m: Model, full: str, path: str, inodes: list[Inode], st: os.stat_result,
                   v: PointView) -> Finding | None:
    """Link count and xattrs, where one inode is possible and fsync/sync made them
    durable; xattrs also where ordered-metadata made every op before a floor durable."""
    if len(inodes) != 1:
        return None
    ino = inodes[0]
    g = m.guarantee(ino, v)
    meta = g.metadata if g is not None else None
    if meta is not None:
        q = meta.prefix
        if m.semantics.holds("fallocate-fsync"):
            short = allocation_shortfall(full, ino, q, st)
            if short is not None:
                return meta_finding(path, meta, "allocation", short[0], short[1], "fallocate-fsync")
        later = [pos for pos, _, inos in m.h.name_changes if pos >= q and pos in v.allowed and ino.ino in inos]
        if meta.ino is None and not later:  # sync: the names, so the link count, are durable
            want = sum(1 for i in m.h.ns[q].values() if i == ino.ino)
            if want and st.st_nlink != want:
                return meta_finding(path, meta, "link count", want, st.st_nlink)
    # ext4 and xfs journal xattr changes like namespace ops, in one order: the floor
    # ordered-metadata lifts the namespace to holds for them too (docs/semantics.md).
    floor, op = m.ordered_floor(v)
    if op is not None and floor > (meta.prefix if meta is not None else 0) and ino.xattrs:
        return check_xattrs(m, full, path, ino, floor, op, v, "ordered-metadata")
    return check_xattrs(m, full, path, ino, meta.prefix, meta, v) if meta is not None else None


def check_xattrs(m: Model, full: str, path: str, ino: Inode, q: int, p: Persist, v: PointView,
                 rule_name: str | None = None) -> Finding | None:
    """The user xattrs as of prefix Q (made durable by P), those changed since in either state."""
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
            return meta_finding(path, p, f"xattr {name}", "present", "missing", rule_name)
        want_v = generate(m.wid, file_id, seq, it, 0, length)
        if os.getxattr(full, name) != want_v:
            return meta_finding(path, p, f"xattr {name}", f"value of op {seq}", "another value", rule_name)
    for name in present - set(durable) - changed:
        if any(name in x for pos, x in ino.xattrs if pos < q):  # removed before the guarantee, back again
            return meta_finding(path, p, f"xattr {name}", "absent", "present", rule_name)
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
    whole = merge_ranges([(s, t) for s, t in ((-(-e.start // bsize) * bsize, e.end // bsize * bsize) for e in allocs)
                          if t > s])
    want = sum(t - s for s, t in whole)
    mapped = _mapped(full)
    if mapped is not None:  # each reserved block still mapped (data blocks elsewhere don't stand in for them)
        have = sum(min(t, b) - max(s, a) for s, t in whole for a, b in mapped if a < t and s < b)
        return None if have >= want else (f"{want} reserved bytes allocated", f"{have} of them allocated")
    have = st.st_blocks * 512
    if have >= want:
        return None
    return f"at least {want} bytes allocated", f"{have} bytes allocated"


def _mapped(full: str) -> list[tuple[int, int]] | None:
    """The file's mapped ranges (FIEMAP, written or unwritten), or None where FIEMAP fails."""
    try:
        fd = os.open(full, os.O_RDONLY)
    except OSError:
        return None
    try:
        got = fiemap.extents(fd)
    finally:
        os.close(fd)
    return None if got is None else merge_ranges([(lo, lo + n) for lo, _, n, _ in got])


def meta_finding(path: str, p: Persist, what: str, expected: Any, found: Any,
                 rule_name: str | None = None) -> Finding:
    r = rule_name or p.rule
    return Finding("durability", f"{path}: {what} is {found}, but {p.ex.describe()} made it {expected}",
                   evidence={"path": path, "rule": r, "op": p.ex.describe(), "op_mark": p.ex.mark,
                             "expected": str(expected), "found": str(found),
                             "reference": rule(r).reference})

"""Reads the names on the crash image: a path missing or of the wrong kind, a renamed
file at neither name, names no prefix of the namespace ops explains."""

from __future__ import annotations

import os

from checkers.findings import Finding
from checkers.fsrules import rule
from checkers.linux_names import observed_kind, order_gap
from checkers.oracle.filecheck import FileCheck
from checkers.oracle.model import Cover, Model
from checkers.oracle.view import PointView


def name_finding(m: Model, path: str, floor: int, why: Cover | None, v: PointView, found: str) -> Finding:
    renames = [pos for pos, paths, _ in m.h.name_changes
               if floor <= pos and pos in v.allowed and path in paths
               and m.h.execs[pos].kind == "rename"]
    if renames and found == "missing":
        ex = m.h.execs[renames[0]]
        return Finding("atomicity", f"{path} is missing after {ex.describe()}: rename must leave the old or the new file",
                       evidence={"path": path, "rule": "rename-atomic", "op": ex.describe(),
                                 "op_mark": ex.mark, "expected": "present", "found": found,
                                 "reference": rule("rename-atomic").reference})
    if why is None:  # no guarantee, yet a state the path never had: a kind it never was
        return Finding("stale-data", f"{path} is {found}, which it never was",
                       evidence={"path": path, "rule": "no-stale-data", "found": found,
                                 "reference": rule("no-stale-data").reference})
    r = why.rule
    if found != "missing" and r == "sync-all":
        r = "no-resurrection"
    expected = "absent" if None in {m.h.ns[floor].get(path)} else "present"
    return Finding("durability", f"{path} is {found}, but {why.ex.describe()} made it {expected}: {rule(r).promise}",
                   evidence={"path": path, "rule": r, "op": why.ex.describe(), "op_mark": why.ex.mark,
                             "expected": expected, "found": found, "reference": rule(r).reference})


def check_order(m: Model, mnt: str, v: PointView) -> list[Finding]:
    """ordered-metadata: the recovered names must be those after one prefix of
    the namespace ops. Only single-threaded workloads: ops of two threads
    that overlap in time have no order to keep."""
    if not m.semantics.holds("ordered-metadata") or len(m.h.threads) != 1:
        return []
    floor = max([m.ordered_floor(v)[0]] + [p.prefix for p in m.h.persists
                                            if p.ino is None and p.ex.pos < v.n_done])
    versions = list(range(floor, v.n_done + 1)) + v.versions_after
    seen = {p: observed_kind(mnt, p) for p in m.all_paths if not m.uncertain(p, v)}
    gap = order_gap(m.h, seen, versions)
    if gap is None:
        return []
    late, early = m.h.execs[gap.late_pos], m.h.execs[gap.early_pos]
    what = (f"{gap.late_path} shows the result of {late.describe()}, but {gap.early_path} lacks that "
            f"of {early.describe()}" + (" (the same op, half applied)" if late is early else ", done before it"))
    r = rule("ordered-metadata")
    return [Finding("durability", f"no prefix of the completed namespace ops explains the names: {what}",
                    evidence={"path": gap.early_path, "rule": r.name, "op": early.describe(),
                              "op_mark": early.mark, "expected": f"{gap.early_path} as after {early.describe()}",
                              "found": f"{gap.early_path} {seen[gap.early_path] or 'missing'}, "
                                       f"{gap.late_path} {seen[gap.late_path] or 'missing'}",
                              "reference": r.reference})]


def check_renames(m: Model, mnt: str, v: PointView) -> list[Finding]:
    """rename-atomic, the half per-path checks cannot see: the renamed file
    must be at the old or the new name, never lost between them."""
    out = []
    for pos, paths, _ in m.h.name_changes:
        ex = m.h.execs[pos]
        if ex.kind != "rename" or pos not in v.allowed or ex.f("flags"):
            continue
        src, dst = ex.f("from"), ex.f("to")
        if {src, dst} & m.h.uncertain or m.uncertain(src, v) or m.uncertain(dst, v):
            continue
        moved = m.h.ns[pos].get(src)
        if moved is None or m.h.inodes[moved].kind != "file":
            continue
        floor, _ = m.name_floor(src, v)
        later = [p for p, ps, _ in m.h.name_changes if p > pos and p in v.allowed and ps & {src, dst}]
        if floor > pos or m.h.ns[floor].get(src) != moved or later:
            continue  # the old name was not durable, or later ops muddle it
        if os.path.lexists(os.path.join(mnt, src)):
            continue
        ino = m.h.inodes[moved]
        dpath = os.path.join(mnt, dst)
        if os.path.isfile(dpath) and not os.path.islink(dpath):
            with open(dpath, "rb") as f:
                if FileCheck(m, ino, v).check(f.read()) is None:
                    continue
        out.append(Finding("atomicity", f"the file renamed by {ex.describe()} is neither at {src} nor at {dst}",
                           evidence={"path": dst, "rule": "rename-atomic", "op": ex.describe(), "op_mark": ex.mark,
                                     "expected": f"{src} or {dst} holds the renamed file",
                                     "found": f"{src} missing, {dst} " + ("missing" if not os.path.lexists(dpath)
                                                                          else "holds other data"),
                                     "reference": rule("rename-atomic").reference}))
    return out

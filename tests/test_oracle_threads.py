"""Two threads on one file: the marks do not order ops that ran at the same time, and the
oracle accepts the outcome of either order (checkers/overlap.py). Built from real executor
runs (pc-exec on a scratch directory, the host's kernel): the file as the kernel left it
is one real outcome, whichever order the two ops took."""

from __future__ import annotations

import os
from pathlib import Path

from checkers.history import History, build_history
from checkers.oracle import ContentOracle
from common import exec_plan, require_exec
from workloads.format import parse_workload
from workloads.pattern import generate
from workloads.plan import Plan, build_plan

pytestmark = require_exec

OPEN = {"op": "open", "path": "f", "flags": ["O_CREAT", "O_RDWR"]}


def two_threads(writer: list[dict], truncater: list[dict]) -> Plan:
    return build_plan(parse_workload({"format": "powercut-workload/1", "name": "threads", "threads": [
        {"name": "w", "ops": [dict(OPEN, fd="f"), *writer, {"op": "fdatasync", "fd": "f"}, {"op": "close", "fd": "f"}]},
        {"name": "t", "ops": [dict(OPEN, fd="g"), *truncater, {"op": "close", "fd": "g"}]}]}))


# One thread writes 64 KiB while the other truncates the file to 1234 bytes; both have
# returned before the fdatasync is called (barrier "done"). Write last: 65536 bytes of
# data; truncate last: 1234.
RACE = two_threads(
    [{"op": "barrier", "name": "go"}, {"op": "pwrite", "fd": "f", "offset": 0, "length": 65536},
     {"op": "barrier", "name": "done"}],
    [{"op": "barrier", "name": "go"}, {"op": "ftruncate", "fd": "g", "length": 1234},
     {"op": "barrier", "name": "done"}])


def mark_of(marks: list[tuple[int, str]], h: History, kind: str) -> int:
    ex = next(ex for ex in h.execs if ex.kind == kind)
    return next(i for i, (_, text) in enumerate(marks) if text == f"op {ex.rec.thread}.{ex.op.seq}.0")


def swapped(marks: list[tuple[int, str]], h: History) -> list[tuple[int, str]]:
    """MARKS with the pwrite's and the ftruncate's swapped: the other order in the log."""
    a, b = mark_of(marks, h, "pwrite"), mark_of(marks, h, "ftruncate")
    out = list(marks)
    out[a], out[b] = (marks[a][0], marks[b][1]), (marks[b][0], marks[a][1])
    return out


def findings(plan: Plan, h: History, fs: Path) -> list:
    return ContentOracle(h, plan.wid, "ext4").inspect(str(fs), max(ex.mark or 0 for ex in h.execs))


def test_either_order_of_a_write_and_a_truncate_in_two_threads_is_clean(tmp_path: Path) -> None:
    """The model takes the order of the marks; the kernel ran the two calls in some order the
    marks need not show (overlapping calls, or a mark delayed). With the marks in either order
    the file the kernel left is clean; before the fix one of the two was a finding (stale
    data past 1234 or a file shorter than the fdatasync's 65536 bytes)."""
    results, marks = exec_plan(RACE, tmp_path)
    size = os.path.getsize(tmp_path / "fs/f")
    assert size in (1234, 65536)
    for order in (marks, None):
        h = build_history(RACE, results, order or swapped(marks, build_history(RACE, results, marks)))
        w, t = (next(ex for ex in h.execs if ex.kind == k) for k in ("pwrite", "ftruncate"))
        assert findings(RACE, h, tmp_path / "fs") == [], (w.pos, t.pos, size)
    # Not a blanket pass: bytes every order keeps (the write's first 1234) lost are still found.
    with open(tmp_path / "fs/f", "r+b") as f:
        f.write(bytes(512))
    for order in (marks, swapped(marks, h)):
        got = findings(RACE, build_history(RACE, results, order), tmp_path / "fs")
        assert [(x.kind, x.evidence["offset"]) for x in got] == [("durability", 0)]


def test_a_write_called_after_the_truncate_returned_must_survive(tmp_path: Path) -> None:
    """A barrier puts the truncate before the write in real time: no other order, and the
    outcome the race allowed (the write's bytes past 1234 gone) is a finding."""
    plan = two_threads(
        [{"op": "barrier", "name": "go"}, {"op": "pwrite", "fd": "f", "offset": 0, "length": 65536}],
        [{"op": "ftruncate", "fd": "g", "length": 1234}, {"op": "barrier", "name": "go"}])
    results, marks = exec_plan(plan, tmp_path)
    h = build_history(plan, results, marks)
    assert not any(e.kind == "maybe" for ino in h.inodes.values() for e in ino.events)
    assert findings(plan, h, tmp_path / "fs") == []
    os.truncate(tmp_path / "fs/f", 1234)
    got = findings(plan, h, tmp_path / "fs")
    assert [x.kind for x in got] == ["durability"] and "size 1234" in got[0].evidence["found"]


def test_an_op_called_after_both_ends_the_other_order(tmp_path: Path) -> None:
    """After the race, the writer writes the same 64 KiB again: called after both had returned,
    it is last in every order, so neither race outcome (zeros past 1234, or the first write's
    bytes; a 1234-byte file) is allowed once its fdatasync returned, with the marks in either
    order (with them swapped, the model's alternative is the race's real outcome)."""
    plan = two_threads(
        [{"op": "barrier", "name": "go"}, {"op": "pwrite", "fd": "f", "offset": 0, "length": 65536},
         {"op": "barrier", "name": "done"}, {"op": "pwrite", "fd": "f", "offset": 0, "length": 65536}],
        [{"op": "barrier", "name": "go"}, {"op": "ftruncate", "fd": "g", "length": 1234},
         {"op": "barrier", "name": "done"}])
    results, marks = exec_plan(plan, tmp_path)
    h = build_history(plan, results, marks)
    orders = (marks, swapped(marks, h))
    for order in orders:
        assert findings(plan, build_history(plan, results, order), tmp_path / "fs") == []
    first = next(ex for ex in h.execs if ex.kind == "pwrite")
    f = tmp_path / "fs/f"
    for race_outcome in (bytes(512), generate(plan.wid, first.f("file"), first.op.seq, 0, 4096, 512)):
        with open(f, "r+b") as out:
            out.seek(4096)
            kept = out.read(512)
            out.seek(4096)
            out.write(race_outcome)
        for order in orders:
            got = findings(plan, build_history(plan, results, order), tmp_path / "fs")
            assert [(x.kind, x.evidence["offset"]) for x in got] == [("durability", 4096)]
        with open(f, "r+b") as out:
            out.seek(4096)
            out.write(kept)
    os.truncate(f, 1234)
    for order in orders:
        got = findings(plan, build_history(plan, results, order), tmp_path / "fs")
        assert [x.kind for x in got] == ["durability"] and "size 1234" in got[0].evidence["found"]

"""The content oracle with its per-inode event index (checkers/eventindex.py: the
allowed events found by bisection, by kind, writer and region) against the
plain filter over every event (`indexed = False`) on the same images: same
findings, loss-window rows and torn-write rows, on tampered fixtures with
stale, zeroed, torn and foreign data (with the index's regions made small so
that its region lookup and its wide-event list are both exercised), then on
real crash images with stale data, dropped and torn writes, failed writes and
classified (pwritev2) writes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import checkers.eventindex as eventindex
from checkers.eventindex import Allowed
from checkers.oracle import ContentOracle
from common import require_exec
from conftest import WORKLOADS, PcEnv, needs_root_stack
from test_oracle import Run
from test_oracle_bulk import INVARIANTS, OPS, _pair_inspector_for, tampered_trials, verdicts
from replay.crashstates import DEFAULT_PER_POINT
from workloads.pattern import generate

pytestmark = require_exec


class Pair:
    """The same history checked twice: indexed (the default) and by the plain filter."""

    def __init__(self, history: Any, wid: int, invariants: dict | None = None) -> None:
        self.fast = ContentOracle(history, wid, "ext4", invariants)
        self.ref = ContentOracle(history, wid, "ext4", invariants)
        self.ref.indexed = False
        for o in (self.fast, self.ref):  # every file checked at every state: nothing reused
            o.incremental = False
        self.compared = 0
        self.kinds: set[str] = set()
        self.classified = self.torn = 0

    def compare(self, mnt: str, point: int, state_id: str | None = None) -> list:
        a, b = self.fast.inspect(mnt, point, state_id), self.ref.inspect(mnt, point, state_id)
        assert verdicts(a) == verdicts(b), f"crash point {point} {state_id}"
        assert self.fast.loss_rows == self.ref.loss_rows
        assert self.fast.torn_rows == self.ref.torn_rows
        self.compared += 1
        self.kinds |= {f.kind for f in a}
        if self.fast.torn_rows:
            self.classified = max(self.classified, self.fast.torn_rows[-1]["writes"])
            self.torn += self.fast.torn_rows[-1]["torn"]
        return a


# OPS plus plain pwritev2 writes (classified at every state), one over 64 KiB
# (several regions), a truncate that zeroes a wide range, and appends.
MORE = OPS[:-3] + [
    {"op": "pwritev2", "fd": "b", "iov": [8192], "offset": 4096},
    {"op": "pwritev2", "fd": "r", "iov": [70000], "offset": 30000},
    {"op": "repeat", "count": 4, "ops": [{"op": "write", "fd": "r", "length": 4096}]},
    {"op": "fsync", "fd": "r"},
    {"op": "ftruncate", "fd": "r", "length": 20000},
    {"op": "pwritev2", "fd": "r", "iov": [9000], "offset": 12000},
] + OPS[-3:]


def tear_b(run: Run) -> str:
    """B's first pwritev2 (4096..12288) torn: its first 4 KiB back to what the
    fdatasync'ed pwrite before it left there (allowed: nothing synced B since)."""
    ino = run.history.inodes[run.history.ns[-1]["B"]]
    older = next(e for e in ino.events if e.kind == "data" and e.start == 4096)
    data = bytearray((run.dir / "B").read_bytes())
    data[4096:8192] = generate(run.plan.wid, older.src.file_id, older.src.seq, older.src.iter, 4096 - older.src.delta, 4096)
    (run.dir / "B").write_bytes(bytes(data))
    return "torn B@4096"


def test_allowed_is_the_set_it_stands_for() -> None:
    a = Allowed(5, frozenset({2, 7, 9}))
    assert set(a) == {0, 1, 2, 3, 4, 7, 9} and len(a) == 7 and a == {0, 1, 2, 3, 4, 7, 9}
    assert [p in a for p in (-1, 0, 4, 5, 7, 8, 9, 10)] == [False, True, True, False, True, False, True, False]
    assert a.last() == 9 and Allowed(5, frozenset()).last() == 4 and Allowed(0, frozenset()).last() == 0


@pytest.mark.parametrize("region,wide", [(1 << 16, 64), (4096, 2)])
def test_indexed_and_plain_oracles_agree_on_tampered_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            region: int, wide: int) -> None:
    monkeypatch.setattr(eventindex, "REGION", region)
    monkeypatch.setattr(eventindex, "WIDE", wide)
    run = Run(tmp_path, MORE)
    pair = Pair(run.history, run.plan.wid, INVARIANTS)
    tampered_trials(run, pair, random.Random(17), 50, also=lambda trial: tear_b(run) if trial % 3 == 0 else "")
    # The states compared had the findings and the classified writes the index must get right.
    assert pair.compared > 300 and {"durability", "stale-data"} <= pair.kinds
    assert pair.classified >= 3 and pair.torn > 0
    if wide == 2:
        assert any(idx.near.wide for idx in pair.fast.model.index._event_index.values())


@pytest.mark.e2e
@needs_root_stack
@pytest.mark.parametrize("workload,opts,kinds", [
    ("stale_writeback.json", ["--mount-opts", "data=writeback,nodelalloc"], {"stale-data"}),
    ("mini_recorder.json", ["--reorder", "drop-one,torn:512"], set()),
    ("atomic_small.json", ["--reorder", "drop-one,torn", "--states-per-point", "6"], set()),
    ("failed_direct_write.json", ["--reorder", "drop-one,torn"], set()),
])
def test_indexed_and_plain_oracles_agree_on_real_crash_images(pc: PcEnv, monkeypatch: pytest.MonkeyPatch,
                                                              workload: str, opts: list[str], kinds: set[str]) -> None:
    from harness.pipeline.config import RunConfig
    from harness.pipeline.run import run_checked
    from workloads.runner import load_runner

    monkeypatch.setenv("POWERCUT_STATE_DIR", str(pc.state))
    monkeypatch.setenv("POWERCUT_SCRATCH", str(pc.scratch))
    args = dict(zip(opts[::2], opts[1::2]))
    cfg = RunConfig.parse({"fs": "ext4", "quiet": True, "jobs": 2, "size_mib": 32,
                           "mount_opts": args.get("--mount-opts"), "reorder": args.get("--reorder", "drop-one"),
                           "states_per_point": int(args.get("--states-per-point", DEFAULT_PER_POINT))})
    out = pc.tmp / "out"
    path = WORKLOADS / workload
    if workload == "atomic_small.json":  # ext4 refuses RWF_ATOMIC here: plain pwritev2 writes, still classified
        doc = json.loads(path.read_text())
        for op in doc["threads"][0]["ops"]:
            op["flags"] = [f for f in op.get("flags", []) if f != "RWF_ATOMIC"] if op["op"] == "pwritev2" else op.get("flags")
            if op["flags"] is None:
                del op["flags"]
        path = pc.tmp / "plain_pwritev2.json"
        path.write_text(json.dumps(doc))
    runner = load_runner(str(path))
    pairs: list[Pair] = []
    result = run_checked(runner, cfg, str(out), _pair_inspector_for(runner, out, pairs, make=Pair))
    assert pairs and pairs[0].compared == result.report["crash_states_checked"] > 5
    assert pairs[0].kinds == kinds  # e.g. the stale states were among the ones compared
    if workload == "mini_recorder.json":
        assert result.report["design"]["records"]["max_loss_records"] > 0
    if workload == "atomic_small.json":
        assert pairs[0].classified == 3  # its three pwritev2 writes classified at the late states
    if workload == "failed_direct_write.json":
        assert any(e.kind == "maybe" for i in pairs[0].fast.h.inodes.values() for e in i.events)

"""The bulk content check (whole chunks at once, chunks unchanged since the
last crash state reused) against the sector-by-sector reference on the same
images: same findings, same loss-window rows, on clean, stale, torn, foreign
and zeroed data; first on tampered fixtures, then on real crash images."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from checkers.history import build_history
from checkers.oracle import ContentOracle
from checkers.workload_checks import log_marks
from common import require_exec
from conftest import WORKLOADS, PcEnv, needs_root_stack
from replay.logformat import LogReader
from test_oracle import Run
from workloads.pattern import CHUNK, generate
from workloads.plan import build_plan
from workloads.results import read_records

pytestmark = require_exec


def verdicts(found: list) -> list[tuple[str, str, str]]:
    return [(f.kind, f.detail, json.dumps(f.evidence, sort_keys=True, default=str)) for f in found]


class Pair:
    """The same history checked twice: bulk (the default) and sector by sector."""

    def __init__(self, history: Any, wid: int, invariants: dict | None = None) -> None:
        self.bulk = ContentOracle(history, wid, "ext4", invariants)
        self.ref = ContentOracle(history, wid, "ext4", invariants)
        self.ref.bulk = False
        self.compared = 0
        self.kinds: set[str] = set()

    def compare(self, mnt: str, point: int, state_id: str | None = None) -> list:
        a, b = self.bulk.inspect(mnt, point, state_id), self.ref.inspect(mnt, point, state_id)
        assert verdicts(a) == verdicts(b), f"crash point {point} {state_id}"
        assert self.bulk.loss_rows == self.ref.loss_rows
        self.compared += 1
        self.kinds |= {f.kind for f in a}
        return a


OPS = [
    {"op": "open", "path": "rec", "flags": ["O_CREAT", "O_RDWR"], "fd": "r"},
    {"op": "fallocate", "fd": "r", "mode": ["KEEP_SIZE"], "offset": 0, "length": 262144},
    {"op": "open", "path": "B", "flags": ["O_CREAT", "O_RDWR"], "fd": "b"},
    {"op": "pwrite", "fd": "b", "offset": 0, "length": 20480},
    {"op": "repeat", "count": 6, "ops": [{"op": "write", "fd": "r", "length": 8192}]},
    {"op": "fsync", "fd": "r"},
    {"op": "pwrite", "fd": "b", "offset": 4096, "length": 6000},
    {"op": "fdatasync", "fd": "b"},
    {"op": "repeat", "count": 6, "ops": [{"op": "write", "fd": "r", "length": 8192}]},
    {"op": "open", "path": "C", "flags": ["O_CREAT", "O_RDWR", "O_SYNC"], "fd": "c"},
    {"op": "pwrite", "fd": "c", "offset": 1000, "length": 9000},
    {"op": "fallocate", "fd": "b", "mode": ["PUNCH_HOLE", "KEEP_SIZE"], "offset": 1024, "length": 4096},
    {"op": "ftruncate", "fd": "b", "length": 15000},
    {"op": "close", "fd": "r"}, {"op": "close", "fd": "b"}, {"op": "close", "fd": "c"},
]
INVARIANTS = {"records": {"path": "rec", "record_bytes": 8192, "period_us": 1000}}


def tamper(rng: random.Random, root: Path, foreign: bytes) -> str:
    """Damage one file the way a broken file system could; returns what was done."""
    name = rng.choice(["rec", "B", "C"])
    path = root / name
    data = bytearray(path.read_bytes())
    if not data:
        return "nothing"
    what = rng.choice(["zeros", "foreign", "other-wid", "torn", "shifted", "garbage", "shorter", "longer", "unaligned"])
    at = rng.randrange(0, max(1, len(data) // CHUNK)) * CHUNK
    if what == "zeros":
        n = len(data[at:at + CHUNK * rng.randint(1, 8)])
        data[at:at + n] = bytes(n)
    elif what == "foreign":  # another file's chunk
        data[at:at + CHUNK] = foreign[:len(data[at:at + CHUNK])]
    elif what == "other-wid":  # the right writer of another workload
        data[at:at + CHUNK] = generate(0xBEEF, 1, 3, 0, at, len(data[at:at + CHUNK]))
    elif what == "torn":  # the first half of the chunk from a zeroed or older state
        data[at:at + CHUNK // 2] = bytes(len(data[at:at + CHUNK // 2]))
    elif what == "shifted":  # a chunk one place off
        src = data[at + CHUNK:at + 2 * CHUNK]
        data[at:at + len(src)] = src
    elif what == "garbage":
        data[at + 7] ^= 0x5A
    elif what == "shorter":
        del data[rng.randrange(0, len(data)):]
    elif what == "longer":
        data += rng.choice([bytes(1000), foreign[:700]])
    else:
        data[at + 100:at + 700] = bytes(len(data[at + 100:at + 700]))
    path.write_bytes(bytes(data))
    return f"{what} {name}@{at}"


def tampered_trials(run: Run, pair: Any, rng: random.Random, trials: int, also: Any = None) -> None:
    """TRIALS times: the run's files as it left them, up to 3 tamperings (and ALSO(trial),
    if given, which may damage more and says what), then PAIR compares 7 crash points."""
    pristine = {p.name: p.read_bytes() for p in run.dir.iterdir()}
    foreign = generate(run.plan.wid, 99, 1, 0, 0, 4096)
    points = [i for i, _ in run.marks]
    for trial in range(trials):
        for name, data in pristine.items():
            (run.dir / name).write_bytes(data)
        done = [tamper(rng, run.dir, foreign) for _ in range(rng.randint(0, 3))]
        done += [also(trial)] if also else []
        for point in rng.sample(points, 6) + [points[-1]]:
            pair.compare(str(run.dir), point, f"t{trial}:{done}")


def test_bulk_and_sector_checks_agree_on_tampered_images(tmp_path: Path) -> None:
    run = Run(tmp_path, OPS)
    pair = Pair(run.history, run.plan.wid, INVARIANTS)
    tampered_trials(run, pair, random.Random(16), 60)
    # The tampering produced the kinds the bulk check must get right, not only clean states.
    assert pair.compared > 300 and {"durability", "stale-data"} <= pair.kinds


def test_unchanged_chunks_keep_their_verdict_only_while_unchanged(tmp_path: Path) -> None:
    """The reuse across crash states: the same path checked again after a change
    in one chunk must see that chunk (and a change back, too)."""
    run = Run(tmp_path, OPS)
    pair = Pair(run.history, run.plan.wid, INVARIANTS)
    end = run.marks[-1][0]
    rec = run.dir / "rec"
    good = rec.read_bytes()
    for flip in (0, 17, 50, 95):
        pair.compare(str(run.dir), end)
        at = flip * CHUNK + 40
        with open(rec, "r+b") as f:  # in place: the file's allocation stays as the workload left it
            f.seek(at)
            f.write(bytes([good[at] ^ 1]))
        assert pair.compare(str(run.dir), end), "a flipped byte in fsynced data must be found"
        with open(rec, "r+b") as f:
            f.seek(at)
            f.write(good[at:at + 1])
    assert pair.compare(str(run.dir), end) == []


@pytest.mark.e2e
@needs_root_stack
@pytest.mark.parametrize("workload,opts,kinds", [
    ("stale_writeback.json", ["--mount-opts", "data=writeback,nodelalloc", "--size", "32"], {"stale-data"}),
    ("mini_recorder.json", ["--reorder", "drop-one,torn:512", "--size", "32"], set()),
])
def test_bulk_and_sector_checks_agree_on_real_crash_images(pc: PcEnv, monkeypatch: pytest.MonkeyPatch,
                                                           workload: str, opts: list[str], kinds: set[str]) -> None:
    from harness.pipeline.config import RunConfig
    from harness.pipeline.run import run_checked
    from workloads.runner import load_runner

    monkeypatch.setenv("POWERCUT_STATE_DIR", str(pc.state))
    monkeypatch.setenv("POWERCUT_SCRATCH", str(pc.scratch))
    args = dict(zip(opts[::2], opts[1::2]))
    cfg = RunConfig.parse({"fs": "ext4", "quiet": True, "jobs": 2, "size_mib": int(args["--size"]),
                           "mount_opts": args.get("--mount-opts"), "reorder": args.get("--reorder", "drop-one")})
    out = pc.tmp / "out"
    runner = load_runner(str(WORKLOADS / workload))
    pairs: list[Pair] = []
    result = run_checked(runner, cfg, str(out), _pair_inspector_for(runner, out, pairs))
    assert pairs and pairs[0].compared == result.report["crash_states_checked"] > 10
    assert pairs[0].kinds == kinds  # the stale states were among the ones compared
    if workload == "mini_recorder.json":
        assert result.report["design"]["records"]["max_loss_records"] > 0


def _pair_inspector_for(runner: Any, out: Path, pairs: list[Any], make: Any = Pair):
    """An inspector comparing the two oracles of MAKE(history, wid, invariants) at every state."""
    def inspect(mnt: str, cs: Any) -> list:
        if not pairs:
            with LogReader(str(out / "recording.log")) as reader:
                marks = log_marks(reader)
            records = out / "records.bin"
            history = build_history(runner.plan, read_records(str(records), runner.plan), marks)
            pairs.append(make(history, runner.plan.wid, dict(runner.workload.invariants or {})))
        pairs[0].compare(mnt, cs.point, cs.id)
        return []
    return inspect

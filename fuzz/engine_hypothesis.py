"""The hypothesis engine: random workloads from workloads/strategies.py.

Hypothesis generates; powercut shrinks. Each round is one Hypothesis run of
ROUND_EXAMPLES examples with its own seed (campaign seed, worker, round). A
workload whose findings include a signature nobody saved yet is shrunk by
delta debugging (fuzz/minimize.py, through Worker.triage) to its end, then
saved; the round goes on generating. Hypothesis' own shrinker is not used:
it tells bugs apart by where an exception is raised, while a crash bug's
signature moves as ops go (the last op before the crash point changes), so
its shrinks ended as "flaky" after a run or two and saved workloads of 20
ops. Known signatures pass: a campaign keeps exploring past a bug it has saved.

With --coverage-target, where runs have kernel coverage (vm backend,
fuzz/coverage.py), each example reports how much of the file system's code
it ran to Hypothesis' `target()` (`reach`: recovery-path functions weighed
most), and the target phase hill-climbs toward workloads that run more of it.
A stationary score, not the run's novelty: Hypothesis' optimiser compares
scores of examples, and novelty falls to zero when an example is run again.

Settings for expensive examples (peers.md): no deadline, no explain or
shrink phase, health checks about slow or large data off. The example
database is CAMPAIGN/hypothesis-db unless --hypothesis-db names a shared
directory or a Redis URL; in a joined campaign (--coordinator) it is in the
coordinator's Redis, under the campaign's keys.

A workload whose new finding was saved ends its round as a failure
(NewFinding), so Hypothesis keeps it in the example database; each worker's
first round on every machine sharing that database replays it first
(Phase.reuse; later rounds only generate). The replay Hypothesis makes of a
failure before reporting it is answered from memory, not run again. A
joined campaign's database forgets nothing (Hypothesis deletes a replayed
example that no longer fails: here it passes because its bug is saved, and
the next machine to join should still replay it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings, target
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.extra.redis import RedisExampleDatabase

from checkers.fsrules import Semantics
from foundation.errors import UsageError
from foundation.options import Option
from fuzz.engine import FuzzEngine, OptionGroup, register_engine
from fuzz.coverage import reach, run_hits
from fuzz.trial import op_count
from fuzz.worker import Worker
from workloads.strategies import workloads

ROUND_EXAMPLES = 20


def parse_ops_range(text: str | None) -> list[int] | None:
    if not text:
        return None
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise UsageError(f"--ops {text}: expected LO-HI with 1 <= LO <= HI, e.g. 5-20")
    return [int(lo), int(hi)]


def _check(options: dict[str, Any]) -> None:
    if not 1 <= options["min_ops"] <= options["max_ops"]:
        raise UsageError("--min-ops/--max-ops: need 1 <= min <= max")


GENERATION = OptionGroup("generated workloads (the hypothesis engine, and engines that use it)", (
    Option("min_ops", "--min-ops", type=int, default=2,
           help="fewest op records in a generated workload (default 2; a record is an op and maybe a "
                "persistence op after it)"),
    Option("max_ops", "--max-ops", type=int, default=10, help="most op records (default 10)"),
    Option("ops_range", "--ops", metavar="LO-HI", parse=parse_ops_range,
           help="keep only workloads of LO..HI ops as the executor runs them (opens and persistence ops "
                "count), e.g. 5-20; shrinking stays in the range too"),
    Option("coverage_target", "--coverage-target", action="store_true", default=False,
           help="vm: give Hypothesis each example's kernel coverage (recovery-path functions weighed 3x) "
                "through target(), and run its target phase (hill-climbing toward workloads that run more "
                "of the file system's code); off by default until a benchmark shows it helps"),
    Option("hypothesis_db", "--hypothesis-db", metavar="DIR|redis://HOST:PORT/N",
           help="example database to share between machines (default: CAMPAIGN/hypothesis-db)"),
), _check)


class NewFinding(Exception):
    """A generated workload showed a bug nobody had saved (it is saved now)."""


def example_database(spec: str) -> ExampleDatabase:
    """A directory, or redis://HOST:PORT/DB."""
    if spec.startswith("redis://"):
        import redis
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    os.makedirs(spec, exist_ok=True)
    return DirectoryBasedExampleDatabase(spec)


class Unforgetting(ExampleDatabase):
    """DB without deletes: every machine that joins replays every failing example found so far."""

    def __init__(self, db: ExampleDatabase) -> None:
        super().__init__()
        self.db = db

    def save(self, key: bytes, value: bytes) -> None:
        self.db.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.db.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        pass

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.db.save(dest, value)


def worker_database(w: Worker) -> ExampleDatabase:
    if w.coord is not None:
        return Unforgetting(RedisExampleDatabase(w.coord.r, key_prefix=w.coord.key("hyp").encode() + b":"))
    return example_database(w.options.get("hypothesis_db") or w.campaign.sub("hypothesis-db"))


def failed(doc: dict[str, Any]) -> None:
    """One place that raises NewFinding: Hypothesis tells failures apart by where they are raised."""
    raise NewFinding(doc["name"])


class HypothesisEngine(FuzzEngine):
    name = "hypothesis"
    summary = "random workloads from the op vocabulary (the default on the host's kernel)"
    groups = (GENERATION,)
    default_on = "host"

    def run(self, w: Worker) -> None:
        run(w)

    def uses_kernel_coverage(self, options: Mapping[str, Any]) -> bool:
        return bool(options.get("coverage_target"))


def run(w: Worker) -> None:
    rounds = Rounds(w)
    while not w.should_stop():
        rounds.next()


class Rounds:
    """A worker's Hypothesis rounds, one after another (each its own seed)."""

    def __init__(self, w: Worker, examples: int = ROUND_EXAMPLES) -> None:
        self.w, self.examples = w, examples
        self.db = worker_database(w)
        lo, hi = w.options.get("ops_range") or (0, 1 << 30)
        sem = Semantics(fs=w.cfg.fs, mkfs_opts=w.cfg.mkfs_opts)  # clones, exchanges only where they work
        self.generated = workloads(w.options["min_ops"], w.options["max_ops"], sem.reflink(), sem.exchange(),
                                   sem.f2fs_atomic()).filter(
            lambda d: lo <= op_count(d) <= hi)
        self.done = w.campaign.totals().workloads  # a resumed campaign continues with fresh seeds
        self.n = 0

    def next(self) -> None:
        """One round of up to EXAMPLES workloads."""
        w = self.w
        self.n += 1
        n, done, calls = self.n, self.done, 0
        failing: list[str] = []  # the workload of this round's NewFinding, as JSON

        @settings(database=self.db, max_examples=self.examples, deadline=None, report_multiple_bugs=False,
                  phases=[Phase.explicit, *([Phase.reuse] if n == 1 else []), Phase.generate,
                          *([Phase.target] if w.options.get("coverage_target") else [])],
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False)
        @seed(hash((w.seed, w.number, done, n)) & 0xFFFFFFFF)
        @given(self.generated)
        def example(doc: dict[str, Any]) -> None:
            nonlocal calls
            text = json.dumps(doc, sort_keys=True)
            if failing and text == failing[0]:
                failed(doc)  # Hypothesis' replay of the failure (even when stopping: else it is "flaky")
            if w.should_stop():
                return
            calls += 1
            doc["name"] = f"hyp-{w.name}-{done}-{n}-{calls}"
            trial = w.run(doc, engine="hypothesis")
            hits = run_hits(trial.result.report) if trial is not None and w.options.get("coverage_target") else None
            if hits is not None:
                target(reach(hits), label="kernel coverage")
            if trial is not None and w.triage(trial):
                failing.append(text)
                failed(doc)

        try:
            example()
        except NewFinding:
            return


register_engine(HypothesisEngine())

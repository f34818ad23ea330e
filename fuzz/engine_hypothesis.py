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

Settings for expensive examples (peers.md): no deadline, no explain or
shrink phase, health checks about slow or large data off. The example
database is CAMPAIGN/hypothesis-db unless --hypothesis-db names a shared
directory or a Redis URL.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from fuzz.trial import op_count
from fuzz.worker import Worker
from workloads.strategies import workloads

ROUND_EXAMPLES = 20


def example_database(spec: str) -> ExampleDatabase:
    """A directory, or redis://HOST:PORT/DB (needs the `redis` package; not installed by default)."""
    if spec.startswith("redis://"):
        import redis  # optional: only for databases shared through Redis
        from hypothesis.extra.redis import RedisExampleDatabase
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    os.makedirs(spec, exist_ok=True)
    return DirectoryBasedExampleDatabase(spec)


def run(w: Worker) -> None:
    rounds = Rounds(w)
    while not w.should_stop():
        rounds.next()


class Rounds:
    """A worker's Hypothesis rounds, one after another (each its own seed)."""

    def __init__(self, w: Worker, examples: int = ROUND_EXAMPLES) -> None:
        self.w, self.examples = w, examples
        self.db = example_database(w.options.get("hypothesis_db") or w.campaign.sub("hypothesis-db"))
        lo, hi = w.options.get("ops_range") or (0, 1 << 30)
        self.generated = workloads(w.options["min_ops"], w.options["max_ops"]).filter(
            lambda d: lo <= op_count(d) <= hi)
        self.done = w.campaign.totals().workloads  # a resumed campaign continues with fresh seeds
        self.n = 0

    def next(self) -> None:
        """One round of up to EXAMPLES workloads."""
        w = self.w
        self.n += 1
        n, done, calls = self.n, self.done, 0

        @settings(database=self.db, max_examples=self.examples, deadline=None,
                  phases=[Phase.explicit, Phase.reuse, Phase.generate],
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False)
        @seed(hash((w.seed, w.number, done, n)) & 0xFFFFFFFF)
        @given(self.generated)
        def example(doc: dict[str, Any]) -> None:
            nonlocal calls
            if w.should_stop():
                return
            calls += 1
            doc["name"] = f"hyp-{w.name}-{done}-{n}-{calls}"
            trial = w.run(doc, engine="hypothesis")
            if trial is not None:
                w.triage(trial)

        example()

"""The hypothesis engine: random workloads from workloads/strategies.py,
shrunk by Hypothesis itself.

Each round is one Hypothesis run of ROUND_EXAMPLES examples with its own
seed (campaign seed, worker, round). A workload whose findings include a
signature nobody saved yet raises the exception class of that finding's
kind: Hypothesis then shrinks, and since it tells bugs apart by exception
type, a shrink never wanders from (say) a stale-data bug to an fsck one.
Its last call is the shrunk example, so that run directory is the one saved.
Known signatures pass: a campaign keeps exploring past a bug it has saved.

Settings for expensive examples (peers.md): no deadline, no explain phase,
one bug per run, health checks about slow or large data off. The example
database is CAMPAIGN/hypothesis-db unless --hypothesis-db names a shared
directory or a Redis URL.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import Flaky

from checkers.findings import KINDS
from fuzz.trial import Signature, Trial
from fuzz.worker import Worker
from workloads.strategies import workloads

ROUND_EXAMPLES = 20


class FindingViolation(Exception):
    """A workload showed a finding with a new signature."""

    kind = ""


# One exception class per finding kind, e.g. StaleDataViolation.
VIOLATIONS: dict[str, type[FindingViolation]] = {
    k: type("".join(w.title() for w in k.split("-")) + "Violation", (FindingViolation,), {"kind": k})
    for k in KINDS
}


def example_database(spec: str) -> ExampleDatabase:
    """A directory, or redis://HOST:PORT/DB (needs the `redis` package; not installed by default)."""
    if spec.startswith("redis://"):
        import redis  # noqa: PLC0415 - optional, only for shared databases
        from hypothesis.extra.redis import RedisExampleDatabase
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    os.makedirs(spec, exist_ok=True)
    return DirectoryBasedExampleDatabase(spec)


def run(w: Worker) -> None:
    db = example_database(w.options.get("hypothesis_db") or w.campaign.sub("hypothesis-db"))
    min_ops, max_ops = w.options["min_ops"], w.options["max_ops"]
    done = w.campaign.totals().workloads  # a resumed campaign continues with fresh seeds
    rnd = 0
    while not w.should_stop():
        rnd += 1
        failing: dict[str, Any] = {}

        @settings(database=db, max_examples=ROUND_EXAMPLES, deadline=None, report_multiple_bugs=False,
                  phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False)
        @seed(hash((w.seed, w.number, done, rnd)) & 0xFFFFFFFF)
        @given(workloads(min_ops, max_ops))
        def example(doc: dict[str, Any]) -> None:
            if w.should_stop():
                return
            doc["name"] = f"hyp-{w.name}-{done}-{rnd}"
            shrinking = "original" in failing
            trial = w.run(doc, engine="hypothesis", shrink=shrinking)
            failing["runs"] = failing.get("runs", 0) + shrinking
            if trial is None:
                return
            new = w.new_signatures(trial)
            if new:
                sig = new[0][0]
                failing.setdefault("original", trial.doc)
                failing.update(trial=trial, sig=sig)
                raise VIOLATIONS[sig.kind](sig.key())

        try:
            example()
        except FindingViolation:
            save(w, failing["trial"], failing["sig"], failing["original"], failing["runs"])
        except Flaky:
            pass  # stopped while shrinking, or the bug did not show again: nothing to save


def save(w: Worker, trial: Trial, sig: Signature, original: dict[str, Any], runs: int) -> None:
    if w.store.claim(sig):
        w.save(trial, sig, original, {"method": "hypothesis", "runs": runs})

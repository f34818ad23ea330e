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
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import Flaky

from checkers.findings import KINDS
from fuzz.trial import Signature, Trial, op_count
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
        import redis  # optional: only for databases shared through Redis
        from hypothesis.extra.redis import RedisExampleDatabase
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    os.makedirs(spec, exist_ok=True)
    return DirectoryBasedExampleDatabase(spec)


@dataclass
class _Round:
    """One Hypothesis run: its calls, and the failing example it is shrinking."""

    calls: int = 0
    shrink_runs: int = 0
    original: dict[str, Any] | None = None   # the first failing workload
    first: Trial | None = None               # its run, kept: saved unshrunk if the shrink never ends
    trial: Trial | None = None               # the latest failing one: the shrunk one at the end
    sig: Signature | None = None


def run(w: Worker) -> None:
    db = example_database(w.options.get("hypothesis_db") or w.campaign.sub("hypothesis-db"))
    min_ops, max_ops = w.options["min_ops"], w.options["max_ops"]
    lo, hi = w.options.get("ops_range") or (0, 1 << 30)
    generated = workloads(min_ops, max_ops).filter(lambda d: lo <= op_count(d) <= hi)
    done = w.campaign.totals().workloads  # a resumed campaign continues with fresh seeds
    n = 0
    while not w.should_stop():
        n += 1
        r = _Round()

        @settings(database=db, max_examples=ROUND_EXAMPLES, deadline=None, report_multiple_bugs=False,
                  phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False)
        @seed(hash((w.seed, w.number, done, n)) & 0xFFFFFFFF)
        @given(generated)
        def example(doc: dict[str, Any]) -> None:
            if w.should_stop():
                return
            r.calls += 1
            doc["name"] = f"hyp-{w.name}-{done}-{n}-{r.calls}"
            shrinking = r.original is not None
            r.shrink_runs += shrinking
            trial = w.run(doc, engine="hypothesis", shrink=shrinking)
            if trial is None:
                return
            if r.sig is not None and any(s == r.sig for s, _ in trial.signatures()):
                # Shrinking stays on its bug even if another worker saved the
                # same signature meanwhile (then it is no longer "new").
                r.trial = trial
                raise VIOLATIONS[r.sig.kind](r.sig.key())
            new = w.new_signatures(trial)
            if new:
                r.sig = new[0][0]
                if r.original is None:
                    r.original = trial.doc
                    r.first = w.keep(trial, os.path.join(w.work, "first-failure"))
                r.trial = trial
                raise VIOLATIONS[r.sig.kind](r.sig.key())

        try:
            example()
        except FindingViolation:
            assert r.trial is not None and r.sig is not None and r.original is not None
            if w.store.claim(r.sig):
                w.save(r.trial, r.sig, r.original, {"method": "hypothesis", "runs": r.shrink_runs})
        except Flaky:
            # Stopped while shrinking, or the bug did not show again: save the
            # first failing run as it was (its crash states are in its own log).
            if r.first is not None and r.sig is not None and w.store.claim(r.sig):
                w.save(r.first, r.sig, r.first.doc, {"method": "none (stopped or not reproduced while shrinking)",
                                                     "runs": r.shrink_runs})

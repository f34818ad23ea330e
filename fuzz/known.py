"""A campaign's documented bugs: which signatures of a run are bugs docs/bugs/ names
(checkers/documented_bugs.py), so the worker saves them unshrunk and the report counts them.

The match is made on the workload as generated, before any shrink: a shape is
op kinds in order, and a shrink only removes ops, so a workload that does not
hold a shape never comes to hold it while shrinking (with the default
`--shrink-match signature`, its signature stays too).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from checkers.documented_bugs import Triage, triage
from fuzz.trial import Signature, Trial
from harness.pipeline.config import RunConfig


def _triage(trial: Trial, key: str, cfg: RunConfig) -> Triage:
    return triage(fs=cfg.fs, mkfs_opts=cfg.mkfs_opts, signature=key, doc=trial.doc,
                  kernel=str(trial.result.report.get("kernel", "")), mount_opts=cfg.mount_opts or "")


def documented_signatures(trial: Trial, cfg: RunConfig) -> dict[str, str]:
    """Signature key -> documented bug id, for each of TRIAL's signatures that is one."""
    out = {}
    for sig, _ in trial.signatures():
        t = _triage(trial, sig.key(), cfg)
        if t.verdict == "documented":
            out[sig.key()] = t.bug
    return out


def finding_triage(trial: Trial, sigs: list[Signature], cfg: RunConfig) -> Triage:
    """The triage of a finding about to be saved: documented if any of its signatures is."""
    found = [_triage(trial, s.key(), cfg) for s in sigs]
    return next((t for t in found if t.verdict == "documented"), found[0])


def hits(entries: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Documented bug id -> how many workloads showed it (shrink runs not counted)."""
    n: Counter[str] = Counter()
    for e in entries:
        if not e.get("shrink"):
            n.update(set(e.get("known_bugs", {}).values()))
    return dict(sorted(n.items()))

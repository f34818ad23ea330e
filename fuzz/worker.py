"""What every campaign worker does, whatever generates its workloads.

A worker is one process with its own scratch directory (and so its own
recorded device per workload): it runs workloads in-process through the
run pipeline, journals each one, and triages findings: a signature nobody
has saved yet is claimed, shrunk and saved (fuzz/store.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from typing import Any

from checkers.crashwalk.walk import Inspect
from checkers.findings import Finding
from harness.backends import BackendOpener
from foundation.errors import PowercutError, Terminated
from harness.pipeline.config import RunConfig
from fuzz.coordinator import Coordinator, CoordinatorLost
from fuzz.coverage import CoverageMap, journal_coverage, run_hits
from fuzz.known import documented_signatures, finding_triage
from fuzz.layout import CampaignDir, remove_owned
from fuzz.minimize import Shrinker
from fuzz.shared_store import SharedFindingStore
from fuzz.store import FindingStore
from fuzz.trial import Signature, Trial, run_doc

MAX_CONSECUTIVE_ERRORS = 3


class Budget:
    """A limit shared by all workers (a counter in shared memory)."""

    def __init__(self, ctx: Any, limit: int) -> None:
        self.limit = limit
        self.count = ctx.Value("q", 0)

    def spent(self) -> bool:
        return bool(self.count.value >= self.limit)


class WorkloadBudget(Budget):
    """--max-workloads N across all workers: each new workload claims one of N slots before it
    starts (shrink runs do not), so a campaign runs N workloads, not N plus one per busy worker."""

    def claim(self) -> bool:
        with self.count.get_lock():
            if self.count.value >= self.limit:
                return False
            self.count.value += 1
            return True


class FindingBudget(Budget):
    """--max-findings N: the worker that saves the N-th finding of the session stops the
    campaign at once (a poll of the findings directory by the campaign process would let a
    worker start another workload between polls, and maybe save another finding)."""

    def add(self) -> bool:
        """Count one saved finding; True once the budget is spent."""
        with self.count.get_lock():
            self.count.value += 1
            return bool(self.count.value >= self.limit)


class Stopped(BaseException):
    """The worker was told to stop (SIGTERM). A BaseException, so it unwinds through
    Hypothesis, which would take the pipeline's Terminated (an Exception) for a
    failing example and go on shrinking it."""


@dataclass
class Worker:
    campaign: CampaignDir
    cfg: RunConfig
    name: str                     # journal and scratch name, e.g. "w0"
    number: int                   # 0 .. jobs-1
    jobs: int
    seed: int
    deadline: float               # time.time() at which to stop starting new work
    stop: Event
    options: dict[str, Any] = field(default_factory=dict)
    errors: int = 0
    opener: BackendOpener | None = None   # the worker's live vm guest (--backend vm)
    budget: WorkloadBudget | None = None  # --max-workloads, shared by all workers
    findings_budget: FindingBudget | None = None  # --max-findings, shared by all workers
    coord: Coordinator | None = None      # --coordinator: the campaign is joined with other machines
    last_entry: dict[str, Any] = field(default_factory=dict)  # the journal entry of the last run
    coverage: CoverageMap = field(default_factory=CoverageMap)  # kernel coverage of this worker's runs (vm)

    def __post_init__(self) -> None:
        path = self.campaign.sub("findings")
        self.store = FindingStore(path) if self.coord is None else SharedFindingStore(path, self.coord)
        self.work = self.campaign.work_dir(self.name)

    def should_stop(self) -> bool:
        return self.stop.is_set() or time.time() >= self.deadline

    def run(self, doc: dict[str, Any], *, inspect_extra: Inspect | None = None,
            **journal: Any) -> Trial | None:
        """Run DOC and journal it; None if the harness failed (journaled too; repeated failures stop the worker)."""
        if not journal.get("shrink") and self.budget is not None and not self.budget.claim():
            self.stop.set()
            raise Stopped()
        try:
            trial = run_doc(doc, self.cfg, self.work, inspect_extra, self.opener)
        except Terminated as e:  # the run has torn down: now stop the worker
            raise Stopped() from e
        except PowercutError as e:
            self.errors += 1
            self._journal({"t": round(time.time(), 3), "name": doc["name"], "error": str(e), **journal})
            if self.errors >= MAX_CONSECUTIVE_ERRORS:
                raise
            return None
        self.errors = 0
        hits = run_hits(trial.result.report)
        if hits is not None:
            trial.novelty = self.coverage.add(hits)
            journal["coverage"] = journal_coverage(hits, trial.novelty)
        known = documented_signatures(trial, self.cfg)
        self._journal(trial.journal_entry(**journal, **({"known_bugs": known} if known else {})))
        trial.known_bugs = known
        return trial

    def _journal(self, entry: dict[str, Any]) -> None:
        """Append ENTRY to this worker's journal; in a joined campaign, to the shared journal too
        (an exhaustive index's entry goes there only when its position is completed)."""
        self.last_entry = entry
        self.campaign.append(self.name, entry)
        if self.coord is not None and (entry.get("index") is None or "error" in entry):
            try:
                self.coord.append(entry)
            except CoordinatorLost:
                # Kept here (the journal); the machine stops, and the campaign says why when it does.
                self.stop.set()

    def new_signatures(self, trial: Trial) -> list[tuple[Signature, Finding]]:
        known = self.store.known()
        return [(s, f) for s, f in trial.signatures() if s.key() not in known]

    def triage(self, trial: Trial) -> bool:
        """Shrink (delta debugging) and save the first new bug TRIAL shows; True if it did.
        Only one: its run directory goes to that finding; other new bugs show up again
        in later workloads.

        The shrink runs to its end, bounded only by --shrink-seconds and its run
        budget: a campaign whose duration (or --max-*) is up waits for it. Only a
        Ctrl-C or SIGTERM cuts it short; the best run so far is saved all the same,
        and finding.json says the shrink is incomplete and why."""
        for sig, _ in self.new_signatures(trial):
            if trial.known_bugs.get(sig.key()) in self.store.documented_saved():
                # Saved once already (another crash op or fsck line of the same bug): the journal
                # counts it (report.json known_bug_hits); another directory would say nothing new.
                continue
            if not self.store.claim(sig):
                continue
            if sig.key() in trial.known_bugs:
                # A documented bug (checkers/documented_bugs.py) costs no shrink: saved as found
                # (its workload, reproducer and crash image), counted, and the campaign moves on.
                bug = trial.known_bugs[sig.key()]
                self.save(trial, sig, trial.doc, {"method": "none", "runs": 0, "complete": False, "known_bug": bug,
                                                  "cut_short": f"a documented bug ({bug}), saved as found"})
                return True
            shrinker = Shrinker(self._shrink_run, sig, os.path.join(self.work, "best"),
                                deadline=time.monotonic() + float(self.options.get("shrink_seconds", 600)),
                                match=str(self.options.get("shrink_match", "signature")))
            original = trial.doc
            best = self.keep(trial, shrinker.best_dir)
            try:
                best = shrinker.shrink(best)
            except Stopped:
                shrinker.cut_short = "the campaign was interrupted (Ctrl-C or SIGTERM)"
                self.save(self._latest(best, shrinker), sig, original, shrink_info(shrinker))
                raise
            self.save(best, sig, original, shrink_info(shrinker))
            return True
        return False

    @staticmethod
    def _latest(first: Trial, shrinker: Shrinker) -> Trial:
        """The smallest failing run kept so far (the shrinker moves each one to best_dir)."""
        return shrinker.best or first

    def keep(self, trial: Trial, path: str) -> Trial:
        """Move TRIAL's run directory to PATH, out of the way of the next run."""
        remove_owned(path)
        os.replace(trial.out_dir, path)
        trial.out_dir = path
        return trial

    def _shrink_run(self, doc: dict[str, Any]) -> Trial:
        trial = self.run(doc, shrink=True)
        if trial is None:
            raise PowercutError(f"the harness failed while shrinking {doc['name']}")
        return trial

    def save(self, trial: Trial, wanted: Signature, original: dict[str, Any], shrink: dict[str, Any]) -> str:
        """Save TRIAL's finding of WANTED's kind (the one with WANTED's signature if it still has it);
        its directory, or "" if another machine of a joined campaign saved it first."""
        sigs = [(s, f) for s, f in trial.signatures() if s.kind == wanted.kind]
        sig, finding = next(((s, f) for s, f in sigs if s == wanted), sigs[0])
        shrink = {**shrink, "ops_before": sum(len(t["ops"]) for t in original["threads"])}
        d = self.store.save(trial, sig, finding, self.cfg, original=original,
                            also=[wanted] if wanted != sig else [], shrink=shrink,
                            triage=finding_triage(trial, [sig, wanted], self.cfg).to_json())
        if d and self.findings_budget is not None and self.findings_budget.add():
            self.stop.set()  # before this worker's next workload, not at the campaign's next poll
        return d


def shrink_info(shrinker: Shrinker) -> dict[str, Any]:
    """finding.json's "shrink": how, how many runs, and whether it got to its end."""
    info: dict[str, Any] = {"method": "delta debugging", "runs": shrinker.runs, "complete": shrinker.complete}
    if shrinker.cut_short:
        info["cut_short"] = shrinker.cut_short
    return info

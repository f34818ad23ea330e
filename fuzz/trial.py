"""One generated workload through the run pipeline, and the signatures of what it found.

A finding's signature is (kind, op, rule): the finding kind, the kind of op
it is about (the fsync whose promise broke) and the persistence rule
(checkers/fsrules.py). Mount and fsck findings have no op or rule: theirs
is (kind, "-", what the file system said), the errno and first kernel log
line of the refused mount, or fsck's first problem, with device names and
numbers taken out, since one such bug shows at many crash points after
different ops. (Without that evidence: the last op completed before the
crash point.) Findings with the same signature are one bug for
deduplication and for shrinking.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from checkers.crashwalk.walk import Inspect
from checkers.findings import KINDS, Finding
from checkers.crashwalk.recovery import first_problem
from checkers import unflushed_sync
from fuzz.coverage import Novelty
from fuzz.layout import fresh_dir
from harness.backends import BackendOpener
from harness.pipeline.config import RunConfig
from harness.pipeline.run import RunResult, run_checked
from workloads.runner import ExecutorWorkload
from workloads.marks import parse_mark
from workloads.plan import Plan

RUN_DIR = "run"


@dataclass(frozen=True, order=True)
class Signature:
    kind: str
    op: str
    rule: str

    def key(self) -> str:
        return f"{self.kind}|{self.op}|{self.rule}"

    @classmethod
    def parse(cls, key: str) -> "Signature":
        kind, op, rule = key.split("|")
        return cls(kind, op, rule)


def signature(f: Finding, plan: Plan) -> Signature:
    op = str(f.evidence.get("op") or "").split("(")[0]
    if not op and f.crash_mark:
        mark = parse_mark(f.crash_mark)
        if mark is not None and mark.seq is not None:
            op = plan.by_seq()[mark.seq][1].kind
    rule = str(f.evidence.get("rule") or "-")
    if f.kind == "mount" and f.evidence.get("errno"):
        # One refusal is one bug whatever op came last: key it by what the
        # file system said (errno, its first kernel log line), not by the op.
        op, rule = "-", problem_key(" ".join([f.evidence["errno"], *(f.evidence.get("kernel_log") or [])[:1]]))
    elif f.kind == "fsck" and f.evidence.get("fsck_output"):
        op, rule = "-", problem_key(first_problem(f.evidence["fsck_output"]))
    if f.evidence.get(unflushed_sync.TAG) is not None:
        rule += unflushed_sync.SUFFIX  # a state that lost a sync's unflushed write: its own bug
    return Signature(f.kind, op or "-", rule)


def problem_key(text: str) -> str:
    """TEXT with what differs between crash states of one bug taken out (device names,
    numbers), in characters a signature key and a claim file name can hold."""
    text = re.sub(r"\((?:device )?[a-z]+\d+\)", "(DEV)", text)
    text = re.sub(r"\b\d+\b", "N", text)
    text = re.sub(r"[^A-Za-z0-9 ().,:_=-]", "_", text).strip()
    return text[:80] or "-"


@dataclass
class Trial:
    doc: dict[str, Any]
    out_dir: str
    result: RunResult
    plan: Plan
    seconds: float
    novelty: Novelty | None = None  # what the run added to its worker's kernel coverage (vm backend)
    known_bugs: dict[str, str] = field(default_factory=dict)  # signature key -> documented bug (fuzz/known.py)

    @property
    def findings(self) -> list[Finding]:
        return self.result.findings

    def signatures(self) -> list[tuple[Signature, Finding]]:
        """One (signature, first finding) per signature, in finding-kind order then log order."""
        seen: dict[Signature, Finding] = {}
        for f in sorted(self.findings, key=lambda f: (KINDS.index(f.kind), f.crash_point or 0)):
            seen.setdefault(signature(f, self.plan), f)
        return list(seen.items())

    def journal_entry(self, **extra: Any) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for f in self.findings:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return {"t": round(time.time(), 3), "name": self.doc["name"], "digest": digest(self.doc), "ops": op_count(self.doc),
                "states": self.result.report["crash_states_checked"], "entries": self.result.report["log_entries"],
                "seconds": round(self.seconds, 3), "kinds": kinds,
                **({"signatures": sorted(s.key() for s, _ in self.signatures())} if kinds else {}),
                "mount_retries": len(self.result.report.get("mount_retries", [])),
                "device_waits": len(self.result.report.get("device_waits", [])),
                "recovery_states": (self.result.report.get("recovery_crash") or {}).get("states_checked", 0),
                "expected_damage": (self.result.report.get("expected_damage") or {}).get("count", 0), **extra}


def digest(doc: dict[str, Any]) -> str:
    """What identifies workload DOC whatever its name (the same workload run on two machines)."""
    return hashlib.sha256(json.dumps(doc["threads"], sort_keys=True).encode()).hexdigest()[:16]


def op_count(doc: dict[str, Any]) -> int:
    return sum(len(t["ops"]) for t in doc["threads"])


def run_doc(doc: dict[str, Any], cfg: RunConfig, work_dir: str,
            inspect_extra: Inspect | None = None, opener: BackendOpener | None = None) -> Trial:
    """Run workload DOC in WORK_DIR/run (replacing what was there); the run directory
    keeps the workload, log, records and report: everything `powercut recheck` needs."""
    out = fresh_dir(os.path.join(work_dir, RUN_DIR))
    workload = ExecutorWorkload(doc, {"generated": doc["name"]})  # saves OUT/workload.json
    t0 = time.monotonic()
    result = run_checked(workload, cfg, out, inspect_extra, opener)
    return Trial(doc, out, result, workload.plan, time.monotonic() - t0)

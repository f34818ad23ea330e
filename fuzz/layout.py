"""The campaign directory: its layout, its configuration and its journal.

    CAMPAIGN/campaign.json      the options the campaign was started with (--resume reads them)
    CAMPAIGN/journal/W.jsonl    one line per workload run by worker W, appended as it finishes
    CAMPAIGN/findings/NNN-KIND/ one deduplicated, shrunk finding (fuzz/store.py)
    CAMPAIGN/hypothesis-db/     Hypothesis example database (hypothesis engine)
    CAMPAIGN/afl/               AFL++ sync directory: seeds/, one output dir per instance
    CAMPAIGN/pending/W-target/  inputs an AFL++ target found a new finding with, for worker W
    CAMPAIGN/work/W/            scratch of worker W (the workload being run), removed as it goes
    CAMPAIGN/report.json        the campaign report, written when the campaign stops

The journal is the campaign's memory: it is appended (and fsync'd) after
every workload, so a killed campaign loses at most the workloads in flight,
and totals, progress and --resume are all computed from it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from foundation.jsondoc import write_json
from foundation import jsonl, ownership
from foundation.errors import UsageError
from harness.backends.vm.recovery import state_profile

CONFIG = "campaign.json"


@dataclass
class Totals:
    workloads: int = 0            # generated workloads run
    shrink_runs: int = 0          # runs of candidates while shrinking findings
    errors: int = 0               # runs the harness failed on
    first_error: str = ""         # what the first of them said
    states: int = 0
    seconds: float = 0.0                                  # summed over workers
    kinds: Counter[str] = field(default_factory=Counter)  # findings (crash states) by kind
    ops: Counter[int] = field(default_factory=Counter)    # generated workloads by op count
    mount_retries: int = 0        # crash states that mounted only at the second try (no finding)
    device_waits: int = 0         # recovery mounts that waited for a busy device (no finding)
    recovery_states: int = 0      # crash states inside recoveries checked (--recovery-crash)
    expected_damage: int = 0      # damage the configuration documents (checkers/known_damage.py): not findings
    indices: set[int] = field(default_factory=set)        # exhaustive indices done
    signatures: set[str] = field(default_factory=set)     # signature keys the generated workloads showed


class CampaignDir:
    def __init__(self, path: str) -> None:
        self.path = path

    def sub(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    # -- configuration -----------------------------------------------------
    @classmethod
    def create(cls, path: str, config: dict[str, Any]) -> "CampaignDir":
        if os.path.exists(os.path.join(path, CONFIG)):
            raise UsageError(f"--out {path}: holds a campaign already; continue it with --resume {path}")
        ownership.make_dir(path)
        c = cls(path)
        for d in ("journal", "findings", "work"):
            ownership.make_dir(c.sub(d))
        c._write_json(CONFIG, config)
        return c

    @classmethod
    def open(cls, path: str) -> "CampaignDir":
        if not os.path.isfile(os.path.join(path, CONFIG)):
            raise UsageError(f"--resume {path}: no campaign there ({CONFIG} missing)")
        ownership.require_owned(path, "resume")
        return cls(path)

    def config(self) -> dict[str, Any]:
        with open(self.sub(CONFIG)) as f:
            return dict(json.load(f))

    def update_config(self, **changes: Any) -> None:
        self._write_json(CONFIG, {**self.config(), **changes})

    def _write_json(self, name: str, obj: Any) -> None:
        write_json(self.sub(name), obj)

    def add_guest_stats(self, worker: str, stats: dict[str, Any]) -> None:
        """Add one worker session's vm guest costs to CAMPAIGN/guests/WORKER.json (summed over sessions)."""
        ownership.make_dir(self.sub("guests"))
        path = self.sub("guests", f"{worker}.json")
        old: dict[str, Any] = {}
        if os.path.exists(path):
            with open(path) as f:
                old = json.load(f)
        jobs = dict(old.get("job_seconds", {}))
        for k, v in stats["job_seconds"].items():
            jobs[k] = round(jobs.get(k, 0.0) + v, 3)
        self._write_json(os.path.join("guests", f"{worker}.json"),
                         {"boots": old.get("boots", 0) + stats["boots"],
                          "lost": old.get("lost", 0) + stats["lost"],
                          "boot_seconds": round(old.get("boot_seconds", 0.0) + stats["boot_seconds"], 2),
                          "job_seconds": jobs,
                          "state_seconds": _add(old.get("state_seconds", {}), stats.get("state_profile", {}))})

    def guest_stats(self) -> dict[str, Any]:
        """The vm guests' costs summed over workers (empty for the fuse backend)."""
        total: dict[str, Any] = {}
        seconds: dict[str, float] = {}
        d = self.sub("guests")
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, name)) as f:
                g = json.load(f)
            total["boots"] = total.get("boots", 0) + g["boots"]
            total["lost"] = total.get("lost", 0) + g.get("lost", 0)
            total["boot_seconds"] = round(total.get("boot_seconds", 0.0) + g["boot_seconds"], 2)
            jobs = total.setdefault("job_seconds", {})
            for k, v in g["job_seconds"].items():
                jobs[k] = round(jobs.get(k, 0.0) + v, 3)
            seconds = _add(seconds, g.get("state_seconds", {}))
        if seconds:   # where a guest crash state's time went, over every worker
            total["state_profile"] = state_profile(seconds)
        return total

    def note_worker_error(self, worker: str, line: str) -> None:
        """Why WORKER ended early (one line), for the campaign report (CAMPAIGN/workers/WORKER.error)."""
        ownership.make_dir(self.sub("workers"))
        fd = ownership.create_file(self.sub("workers", f"{worker}.error"))
        with os.fdopen(fd, "w") as f:
            f.write(line + "\n")

    def worker_errors(self) -> dict[str, str]:
        """WORKER -> the line it ended with, for the workers that failed in this session."""
        d = self.sub("workers")
        out = {}
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, name)) as f:
                out[name.removesuffix(".error")] = f.read().strip()
        return out

    def clear_worker_errors(self) -> None:
        d = self.sub("workers")
        if os.path.isdir(d) and ownership.is_owned(d):
            shutil.rmtree(d)

    def write_report(self, report: dict[str, Any]) -> str:
        self._write_json("report.json", report)
        return self.sub("report.json")

    # -- journal -------------------------------------------------------------
    def journal_path(self, worker: str) -> str:
        return self.sub("journal", f"{worker}.jsonl")

    def append(self, worker: str, entry: dict[str, Any]) -> None:
        jsonl.append(self.journal_path(worker), entry)

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every journal entry of every worker (of every session)."""
        jdir = self.sub("journal")
        for name in sorted(os.listdir(jdir)) if os.path.isdir(jdir) else []:
            yield from jsonl.read(os.path.join(jdir, name))

    def totals(self) -> Totals:
        return totals_of(self.entries())

    # -- scratch -------------------------------------------------------------
    def work_dir(self, worker: str) -> str:
        return ownership.make_dir(self.sub("work", worker))

    def clear_work(self) -> None:
        """Scratch left by a killed campaign: only what powercut made."""
        work = self.sub("work")
        for name in os.listdir(work) if os.path.isdir(work) else []:
            p = os.path.join(work, name)
            if ownership.is_owned(p):
                shutil.rmtree(p)


def totals_of(entries: Iterable[dict[str, Any]]) -> Totals:
    """The totals of journal ENTRIES (one campaign directory's, or a joined campaign's in Redis)."""
    t = Totals()
    for e in entries:
        if "error" in e:
            t.errors += 1
            t.first_error = t.first_error or f"{e.get('name', '?')}: {e['error']}"
            continue
        if e.get("shrink"):
            t.shrink_runs += 1
        else:
            t.workloads += 1
            if "ops" in e:
                t.ops[e["ops"]] += 1
            t.signatures.update(e.get("signatures", []))
        t.states += e.get("states", 0)
        t.seconds += e.get("seconds", 0.0)
        t.kinds.update(e.get("kinds", {}))
        t.mount_retries += e.get("mount_retries", 0)
        t.device_waits += e.get("device_waits", 0)
        t.recovery_states += e.get("recovery_states", 0)
        t.expected_damage += e.get("expected_damage", 0)
        if e.get("index") is not None:
            t.indices.add(e["index"])
    return t


def remove_owned(path: str) -> None:
    """Remove PATH if it exists; only if powercut made it."""
    if os.path.lexists(path):
        ownership.require_owned(path, "remove")
        shutil.rmtree(path)


def fresh_dir(path: str) -> str:
    """PATH as a new empty powercut directory (removing the previous one powercut made)."""
    remove_owned(path)
    return ownership.make_dir(path)


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(a.get(k, 0.0) + b.get(k, 0.0), 3) for k in {*a, *b}}

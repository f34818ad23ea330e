"""The whole of a joined campaign, from Redis: the live status and the merged report.

The merged report has the fields a single machine's report.json has,
computed from every machine's journal entries in Redis (each exhaustive
position counted once, from the run that completed it), plus "machines"
(what each said last) and "joined" (leases, duplicates, positions given
up). Its findings are laid out as one campaign's: OUT/findings/NNN-KIND/.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from typing import Any

from foundation import ownership
from foundation.errors import UsageError
from foundation.jsondoc import write_json
from fuzz import campaign_report
from fuzz.campaign import saved_entry, totals_fields
from fuzz.coordinator import Coordinator
from fuzz.engines import engine as fuzz_engine
from fuzz.layout import totals_of
from fuzz.status import clock


def campaign_config(coord: Coordinator) -> dict[str, Any]:
    coord.ping()
    config = coord.config()
    if config is None:
        raise UsageError(f"no campaign {coord.name} on {coord.url}")
    return config


def merged_report(coord: Coordinator) -> dict[str, Any]:
    config = campaign_config(coord)
    snap = coord.snapshot()
    t = totals_of([*coord.done_entries(), *coord.journal()])
    started = min((m["joined"] for m in snap["machines"].values()), default=time.time())
    stopped = max((s["t"] for s in snap["stats"].values()), default=time.time())
    elapsed = max(stopped - started, 1e-6)
    engine, options = config["engine"], config["options"]
    report: dict[str, Any] = {
        "powercut_campaign": 1, "engine": engine, "fs": config["run"]["fs"], "run": config["run"],
        "spec": {"engine": engine, "options": options}, "started": started, "stopped": stopped,
        "stop_reason": stop_reason(engine, options, snap),
        "elapsed_s": round(elapsed, 1), "workloads_per_minute": round(t.workloads * 60 / elapsed, 2),
        "crash_states_per_second": round(t.states / elapsed, 2), **totals_fields(t),
        "saved_findings": [saved_entry(f) for f in coord.findings().values()],
        "failed_workers": [],
        "machines": {m: {**info, **snap["stats"].get(m, {}), "alive": m in snap["alive"]}
                     for m, info in sorted(snap["machines"].items())},
        "joined": {"coordinator": coord.url, "campaign": coord.name, "leases_outstanding": snap["leases"],
                   "duplicate_runs": snap["duplicates"], "positions_given_up": snap["failed"]},
    }
    report.update(fuzz_engine(engine).space_report(options, snap["done"]))
    return report


def stop_reason(engine: str, options: dict[str, Any], snap: dict[str, Any]) -> str:
    if fuzz_engine(engine).exhausted(options, snap["done"], snap["failed"], snap["leases"]):
        return "exhausted"
    return "running" if snap["alive"] else "stopped"


def status_text(coord: Coordinator) -> str:
    config = campaign_config(coord)
    snap = coord.snapshot()
    now = time.time()
    lines = [f"campaign {coord.name} on {coord.url}: {config['engine']} on {config['run']['fs']}"]
    total_rate = 0.0
    for m, info in sorted(snap["machines"].items()):
        st = snap["stats"].get(m, {})
        alive = m in snap["alive"]
        total_rate += st.get("workloads_per_minute", 0.0) if alive else 0.0
        seen = f"last heard {clock(now - st['t'])} ago" if "t" in st else "no totals yet"
        lines.append(f"  {m} ({info['host']}, {info['jobs']} jobs, {'running' if alive else 'gone'}): "
                     f"{st.get('workloads', 0)} workloads ({st.get('workloads_per_minute', 0.0)}/min), "
                     f"saved {st.get('saved_findings', 0)}, {seen}")
    t = totals_of([*coord.done_entries(), *coord.journal()])
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(t.kinds.items())) or "none"
    space = fuzz_engine(config["engine"]).space_progress(config["options"], snap["done"])
    lines.append(f"  total: {t.workloads}{space} workloads, {round(total_rate, 2)}/min now on "
                 f"{len(snap['alive'])} machines; crash states {t.states}; findings: {kinds}; "
                 f"saved {snap['findings']}")
    lines.append(f"  leases outstanding: {snap['leases']}, duplicate runs: {snap['duplicates']}, "
                 f"positions given up: {snap['failed']}")
    return "\n".join(lines)


def write_merged(coord: Coordinator, out: str) -> dict[str, Any]:
    """OUT/report.json, OUT/report.md and OUT/findings/NNN-KIND/ of the whole campaign."""
    report = merged_report(coord)
    ownership.make_dir(out)
    findings = ownership.make_dir(os.path.join(out, "findings"))
    for n, f in coord.findings().items():
        data = coord.finding_files(n)
        if data is not None:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(findings, filter="data")
        else:
            ownership.make_dir(os.path.join(findings, f["dir"]))
            write_json(os.path.join(findings, f["dir"], "finding.json"), f)
    entries = [*coord.done_entries(), *coord.journal()]
    campaign_report.write(out, report, entries, f"{coord.name} (joined, {len(report['machines'])} machines)")
    return report

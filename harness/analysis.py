"""What a run of the timing executor adds to report.json: the latency section
with its figures, the generating scenario's own section, and latency findings."""

from __future__ import annotations

import os
from typing import Any

from checkers import latency
from checkers.findings import Finding
from harness.plots import latency_plots
from workloads import scenarios
from workloads.format import Workload
from workloads.plan import Plan
from workloads.results import read_records


def analyze_run(workload: Workload, plan: Plan, out_dir: str, records: str,
                facts: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """(report sections, latency findings) of the run whose records file is OUT_DIR/RECORDS;
    FACTS (sysctls, device tuning in force) are for the scenario's section."""
    results = read_records(os.path.join(out_dir, records), plan)
    lat = latency.summarize(results, workload)
    limits = {k: b.max_us for k, b in workload.budgets.items() if b.max_us is not None}
    lat["plots"] = latency_plots(results, out_dir, limits)
    sections: dict[str, Any] = {"latency": lat}
    generated = scenarios.of_workload(workload)
    if generated and workload.generator:
        mod, p = generated
        sections["scenario"] = {"name": workload.generator.name, **mod.analyze(results, p, facts)}
    findings = [Finding("latency", f["detail"], evidence={k: v for k, v in f.items() if k not in ("kind", "detail")})
                for f in latency.findings(lat, workload)]
    return sections, findings

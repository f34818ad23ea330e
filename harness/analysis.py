"""The generating scenario's own report section of a timing-executor run."""

from __future__ import annotations

from typing import Any

from workloads import scenarios
from workloads.format import Workload
from workloads.results import Results


def scenario_section(workload: Workload, results: Results, facts: dict[str, Any]) -> dict[str, Any] | None:
    """report.json's `scenario` section if a scenario generated WORKLOAD, else None.
    FACTS: what the run had in force ("sysctls", "device_tuning")."""
    generated = scenarios.of_workload(workload)
    if generated is None or workload.generator is None:
        return None
    mod, p = generated
    return {"name": workload.generator.name, **mod.analyze(results, p, facts)}

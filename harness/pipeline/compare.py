"""One workload run several ways, side by side in one report.

`powercut run W --mount-opts-matrix "barrier=1;barrier=0"` runs W once per
mount option set; `--param-matrix "queue_depth=4;128"` once per value of a
scenario parameter. Each variant is a complete run (recording, crash checks,
report.json, report.md, figures) in OUT/<n>-<variant>/. OUT/report.json and
OUT/report.md then put the variants next to each other: crash-check results,
latency per op kind, the scenario's headline numbers, and one CDF per op
kind with a curve per variant.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from checkers.crashwalk.recovery_modes import check_recovers
from foundation.jsondoc import write_json
from foundation import internal_error, ownership
from foundation.errors import UsageError
from harness.pipeline.config import RunConfig
from harness.pipeline.run import default_out_dir, run_workload
from harness.reports.markdown import profile_lines
from harness.reports.plots import NOT_PLOTTED, PLOT_DIR, cdf, slug
from harness.reports.report import summary
from foundation.mdtable import table
from workloads.runner import SCENARIO_PREFIX, WorkloadRunner, load_runner
from workloads import scenarios
from workloads.results import read_records

COLUMNS = ["count", "avg_us", "p50_us", "p99_us", "max_us"]


@dataclass(frozen=True)
class Variant:
    label: str
    mount_opts: str | None       # None: the run's own
    params: tuple[str, ...]      # scenario parameters ("key=value")


def variants(mount_opts_matrix: str, param_matrix: str, params: list[str]) -> tuple[str, list[Variant]]:
    """The dimension compared and its variants, from the matrix option given."""
    if mount_opts_matrix:
        dimension, items = "mount options", mount_opts_matrix.split(";")
        out = [Variant(item, item, tuple(params)) for item in items]
    else:
        key, sep, values = param_matrix.partition("=")
        if not sep or not key:
            raise UsageError(f"--param-matrix {param_matrix!r}: expected KEY=V1;V2;...")
        dimension, items = f"scenario parameter {key}", values.split(";")
        out = [Variant(f"{key}={v}", None, (*params, f"{key}={v}")) for v in items]
    if any(not i.strip() for i in items) or len(set(items)) != len(items):
        raise UsageError(f"the matrix {';'.join(items)!r} has an empty or repeated entry")
    return dimension, out


def _variant_summary(v: Variant, report: dict[str, Any], out_dir: str, run_dir: str) -> dict[str, Any]:
    lat = report.get("latency", {})
    out = {
        "label": v.label, "dir": os.path.relpath(run_dir, out_dir), "mount_opts": report["mount_opts"],
        "crash_points": report["crash_points"], "crash_states_checked": report["crash_states_checked"],
        "findings": len(report["findings"]), "finding_kinds": dict(Counter(f["kind"] for f in report["findings"])),
        "workload_s": round(lat.get("duration_us", 0) / 1e6, 3),
        "latency": {k: {c: s[c] for c in COLUMNS} for k, s in lat.get("kinds", {}).items() if k not in NOT_PLOTTED},
    }
    if "scenario" in report:
        out["headline"] = scenarios.get(report["scenario"]["name"]).headline(report["scenario"])
    return out


def _overlay_cdfs(out_dir: str, runs: list[tuple[Variant, WorkloadRunner, dict[str, Any], str]]) -> dict[str, str]:
    """Per op kind, one CDF with a curve per variant; kind -> PNG path relative to OUT_DIR."""
    series: dict[str, dict[str, list[float]]] = {}
    for v, runner, report, run_dir in runs:
        if runner.compiled is None:  # a program: no op latencies
            continue
        results = read_records(os.path.join(run_dir, report["workload"]["records"]), runner.compiled.plan)
        for r in results.records:
            if r.kind not in NOT_PLOTTED and not r.skipped:
                series.setdefault(r.kind, {}).setdefault(v.label, []).append(r.duration_ns / 1000)
    os.makedirs(os.path.join(out_dir, PLOT_DIR), exist_ok=True)
    files = {}
    for kind, curves in sorted(series.items()):
        files[kind] = os.path.join(PLOT_DIR, f"compare-cdf-{slug(kind)}.png")
        cdf(os.path.join(out_dir, files[kind]), f"{kind}: latency CDF by variant", curves)
    return files


def render(compare: dict[str, Any]) -> str:
    vs = compare["variants"]
    lines = [f"# powercut compare: {compare['workload']} on {compare['fs']}, by {compare['dimension']}", "",
             *table(["variant", "mount options", "crash states checked", "findings", "workload s", "report"],
                    [[v["label"], v["mount_opts"] or "defaults", f"{v['crash_states_checked']} at {v['crash_points']} points",
                      ", ".join(f"{k} {n}" for k, n in sorted(v["finding_kinds"].items())) or "none",
                      v["workload_s"], f"[report.md]({v['dir']}/report.md)"] for v in vs]),
             *profile_lines(compare.get("device_profile"))]
    kinds = sorted({k for v in vs for k in v["latency"]})
    for kind in kinds:
        lines += ["", f"## {kind}", "",
                  *table(["variant", "count", "avg us", "p50 us", "p99 us", "max us"],
                         [[v["label"], *(v["latency"][kind][c] for c in COLUMNS)] for v in vs if kind in v["latency"]])]
        if kind in compare["plots"]:
            lines += ["", f"![{kind} latency CDF by variant]({compare['plots'][kind]})"]
    if all("headline" in v for v in vs):
        names = list(vs[0]["headline"])
        lines += ["", "## Scenario numbers", "",
                  *table(["", *(v["label"] for v in vs)], [[n, *(v["headline"].get(n, "") for v in vs)] for n in names])]
    return "\n".join(lines) + "\n"


def run_matrix(spec: str, cfg: RunConfig, scale: float | None, params: list[str], out: str, *,
               mount_opts_matrix: str = "", param_matrix: str = "") -> int:
    """Runs every variant, then writes the comparison; exit status 1 if any variant has findings."""
    if param_matrix and not spec.startswith(SCENARIO_PREFIX):
        raise UsageError("--param-matrix is for scenario:NAME workloads")
    if mount_opts_matrix and cfg.mount_opts is not None:
        raise UsageError("give --mount-opts or --mount-opts-matrix, not both")
    dimension, vs = variants(mount_opts_matrix, param_matrix, params)
    runners = [load_runner(spec, scale, v.params) for v in vs]  # every variant is valid before any runs
    for v in vs:  # (CFG's own options were checked when they were parsed)
        check_recovers(v.mount_opts)
    out_dir = ownership.make_dir(out or default_out_dir(f"{runners[0].name}-compare", cfg.fs))
    internal_error.note_output_dir(out_dir)
    runs = []
    for i, (v, runner) in enumerate(zip(vs, runners)):
        run_dir = os.path.join(out_dir, f"{i + 1}-{slug(v.label)}")
        report = run_workload(runner, replace(cfg, mount_opts=v.mount_opts) if v.mount_opts is not None else cfg,
                              run_dir)
        print(summary(report, report["report_path"]))
        runs.append((v, runner, report, run_dir))
    compare = {
        "powercut_compare": 1, "workload": runners[0].name, "fs": cfg.fs, "dimension": dimension,
        "variants": [_variant_summary(v, report, out_dir, run_dir) for v, _, report, run_dir in runs],
        "plots": _overlay_cdfs(out_dir, runs),
        "device_profile": runs[0][2].get("device_profile"),  # one --device-profile for every variant
    }
    write_json(os.path.join(out_dir, "report.json"), compare)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(render(compare))
    print(f"powercut compare of {len(vs)} variants by {dimension}: "
          + "; ".join(f"{v['label']}: {v['findings']} finding(s)" for v in compare["variants"]))
    print(f"  report: {os.path.join(out_dir, 'report.json')}")
    return 1 if any(v["findings"] for v in compare["variants"]) else 0

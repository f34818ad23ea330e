"""A campaign's report.md: what a maintainer reads first.

The configuration and kernel, the campaign's progress over time (a PNG
drawn from the journal), one row per saved finding (kind, rule and its
evidence, the shrunk ops and the crash point in words, the kernels it was
seen on, its triage: a documented bug by name or new), the documented bugs
hit, expected damage apart, coverage where report.json has it, and links to
each finding's directory and reproducers. Everything comes from report.json,
the journal entries and the finding directories: the page says nothing they
do not.
"""

from __future__ import annotations

import json
import os
from typing import Any

from checkers.documented_bugs import triage_finding
from foundation.errors import UsageError
from foundation.mdtable import table
from harness.reports import export
from harness.reports.export.ops import describe
from harness.reports.export.report import crash_words
from harness.reports.markdown import CLOCK_WORDS
from harness.reports.plots import PLOT_DIR, campaign_progress

PROGRESS_PNG = os.path.join(PLOT_DIR, "progress.png")
EXPORT_DIR = "export-report"   # each finding's `powercut export --format report`, written with the page


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def _cell(text: str) -> str:
    return text.replace("\n", " ")


def _config_rows(report: dict[str, Any]) -> list[list[str]]:
    run, spec = report["run"], report.get("spec", {})
    vm = report.get("vm")
    if vm:
        kernel = f"{vm['kernel_spec']} in a vm guest ({vm.get('accel') or 'tcg'})"
    elif run.get("backend") == "vm":  # a joined campaign's merged report: each machine's guests
        kernel = f"{run.get('kernel', '?')} in vm guests"
    else:
        kernel = f"the host's, {report.get('host_kernel', '?')}"
    rows = [["engine", f"{report['engine']}, {spec.get('jobs', '?')} jobs, seed {spec.get('seed', '?')}"],
            ["file system", f"{report['fs']} (mkfs: {run.get('mkfs_opts') or 'defaults'}; "
                            f"mount: {run.get('mount_opts') or 'defaults'})"],
            ["backend, kernel under test", f"{run.get('backend', '?')}, {kernel}"],
            ["semantics", f"{run.get('semantics', 'posix')} (the oracle's tier of rules)"],
            ["crash points", f"{run.get('crash_points') or 'default'}; reorder {run.get('reorder')}; "
                             f"recovery {report.get('recovery', 'rw')}"],
            ["stopped", f"{report['stop_reason']} after {report['elapsed_s']} s "
                        f"(load at stop {report.get('loadavg_at_stop', '?')})"]]
    if report.get("joined"):
        j = report["joined"]
        rows.append(["joined campaign", f"{j.get('campaign')} on {j.get('coordinator')}"])
    return rows


def _totals_rows(report: dict[str, Any]) -> list[list[Any]]:
    kinds = ", ".join(f"{k} {n}" for k, n in report["findings_by_kind"].items()) or "none"
    rows: list[list[Any]] = [
        ["workloads", f"{report['workloads']} ({report['workloads_per_minute']}/min)"],
        ["crash states checked", f"{report['crash_states_checked']} ({report['crash_states_per_second']}/s)"],
        ["shrink runs", report["shrink_runs"]],
        ["findings (crash states, by kind)", kinds],
        ["saved findings (one per signature)", len(report["saved_findings"])],
        ["harness errors", report.get("harness_errors", 0)],
    ]
    if "exhaustive" in report:
        e = report["exhaustive"]
        rows.append([f"ordered seq-{e['seq']} space", f"{e['done']} of {e['space']} done"])
    o = report.get("ops_per_workload")
    if o:
        rows.append(["ops per workload", f"min {o['min']}, median {o['median']}, max {o['max']}"])
    return rows


def _progress_section(entries: list[dict[str, Any]], out_dir: str, t0: float) -> list[str]:
    runs = sorted((e for e in entries if "t" in e and "error" not in e), key=lambda e: e["t"])
    if not runs:
        return ["## Progress", "", "No workload finished: no figure (the journal is empty)."]
    ts = [(e["t"] - t0) / 60 for e in runs]
    os.makedirs(os.path.join(out_dir, PLOT_DIR), exist_ok=True)
    campaign_progress(os.path.join(out_dir, PROGRESS_PNG), ts, [bool(e.get("shrink")) for e in runs],
                      [int(e.get("states", 0)) for e in runs])
    return ["## Progress", "", f"Workloads and crash states over the campaign's time ({len(runs)} runs journaled, "
            "shrink runs included), and their rates per minute:", "", f"![progress]({PROGRESS_PNG})"]


def _finding_row(s: dict[str, Any], findings_dir: str, rel: str) -> tuple[list[str], str]:
    """One saved finding's row and its triage line."""
    d = os.path.join(findings_dir, s["dir"])
    info = _read(os.path.join(d, "finding.json")) or s
    doc = _read(os.path.join(d, "workload.json")) or info.get("original_workload") or {"threads": []}
    run = _read(os.path.join(d, "run", "report.json")) or {}
    kernels = sorted({k for k in [run.get("kernel"), *info.get("seen_on", [])] if k}) or ["?"]
    ev = info.get("evidence", {})
    rule = (f"`{ev['rule']}` ({ev.get('tier', 'posix')}): {ev.get('reference', '')}" if ev.get("rule")
            else {"fsck": "fsck clean after recovery", "mount": "the recovery mount succeeds",
                  "kernel": "no kernel WARNING or BUG"}.get(info.get("kind", ""), "-"))
    try:
        x = export.load(d)
        ops = "; ".join(f"{i + 1}. `{describe(op)}`" for i, op in enumerate(x.ops)) or "(none)"
        crash = crash_words(x)
        export.write(x, "report", os.path.join(d, EXPORT_DIR))
        repro = (f"[reproduce.sh]({rel}/reproduce.sh), [bug report and script]({rel}/{EXPORT_DIR}/{x.name}.md)")
    except (UsageError, KeyError, ValueError, OSError) as e:  # an export cannot be made of it (repeat ops, a cut directory): say why
        ops = "; ".join(f"`{describe(op)}`" for t in doc.get("threads", []) for op in t.get("ops", []))
        crash = f"crash state {info.get('state_id')} (no words: {e})"
        repro = f"[reproduce.sh]({rel}/reproduce.sh)"
    t = triage_finding(info, doc, kernels[0] if kernels != ["?"] else "")
    shrink = info.get("shrink", {})
    if shrink.get("known_bug"):
        shrunk = f"{info.get('ops')} ops, not shrunk (a documented bug)"
    else:
        shrunk = (f"{info.get('ops')} ops" + (f" (from {shrink['ops_before']})" if shrink.get("ops_before") else "")
                  + ("" if shrink.get("complete") else f"; not fully shrunk: {shrink.get('cut_short', '?')}"))
    row = [f"[{s['dir']}]({rel}/)", info.get("kind", "?"), _cell(rule), _cell(info.get("detail", "").split("\n")[0]),
           f"{shrunk}: {ops}", _cell(crash), ", ".join(kernels), t.line(), repro]
    return row, t.line()


def finding_rows(report: dict[str, Any], findings_dir: str, rel: str = "findings") -> list[tuple[list[str], str]]:
    return [_finding_row(s, findings_dir, f"{rel}/{s['dir']}") for s in report["saved_findings"]]


FINDING_HEADERS = ["finding", "kind", "rule and its evidence", "found", "shrunk ops", "crash point", "kernels seen on",
                   "triage", "reproducers"]


def _known_section(report: dict[str, Any]) -> list[str]:
    hits = report.get("known_bug_hits") or {}
    out = ["## Documented bugs hit", ""]
    if not hits:
        return out + ["None of the bugs docs/bugs/ documents showed (workloads are matched against their shapes: "
                      "checkers/documented_bugs.json)."]
    return out + ["Workloads that showed a documented bug (each saved once, not shrunk; later ones only counted):",
                  "", *table(["documented bug", "workloads"], [[b, n] for b, n in hits.items()])]


def _flat(prefix: str, v: Any) -> list[list[str]]:
    if isinstance(v, dict):
        return [r for k, sub in v.items() for r in _flat(f"{prefix}.{k}" if prefix else str(k), sub)]
    if isinstance(v, list) and len(v) > 12:
        return [[prefix, f"{len(v)} values: {json.dumps(v[:6])[:-1]}, ..."]]
    return [[prefix, json.dumps(v) if isinstance(v, (list, bool)) or v is None else str(v)]]


def _coverage_section(cov: Any) -> list[str]:
    """report.json `coverage`, whatever its fields (another part of powercut fills it)."""
    return ["## Coverage", "", *table(["figure", "value"], _flat("", cov))]


def _expected_section(report: dict[str, Any]) -> list[str]:
    return ["## Expected damage", "", f"{report['expected_damage']} findings of damage the configuration documents "
            "(e.g. ext4 without a journal before a completed sync), counted apart: not findings, not in the "
            "table above."]


def render(report: dict[str, Any], out_dir: str, entries: list[dict[str, Any]], findings_dir: str,
           title: str = "") -> tuple[str, list[str]]:
    """report.md's text and the one-line triage of each saved finding."""
    rows = finding_rows(report, findings_dir, os.path.relpath(findings_dir, out_dir))
    lines = [f"# powercut campaign: {title or report['engine'] + ' on ' + report['fs']}", "",
             "## Configuration", "", *table(["", ""], _config_rows(report)), "",
             "## Totals", "", *table(["", ""], _totals_rows(report)), "",
             *_progress_section(entries, out_dir, report["started"]), "",
             "## Saved findings", ""]
    if rows:
        lines += [f"One row per saved finding ({len(rows)}); each directory holds finding.json, the shrunk "
                  "workload, its run, the crash image and fsck's output.", "",
                  *table(FINDING_HEADERS, [r for r, _ in rows])]
    else:
        lines.append("None.")
    if report.get("machines"):
        lines += ["", "## Machines", "", *table(["machine", "host", "workloads", "per minute", "saved findings"],
                  [[m, i.get("host", "?"), i.get("workloads", 0), i.get("workloads_per_minute", 0.0),
                    i.get("saved_findings", 0)] for m, i in report["machines"].items()])]
    lines += ["", *_known_section(report)]
    if report.get("expected_damage"):
        lines += ["", *_expected_section(report)]
    if report.get("coverage") is not None:
        lines += ["", *_coverage_section(report["coverage"])]
    if report.get("latency_clock") in CLOCK_WORDS:
        lines += ["", "## Latency", "", CLOCK_WORDS[report["latency_clock"]]]
    for name, line in report.get("worker_errors", {}).items():
        lines += ["", f"Worker {name} failed: {line}"]
    return "\n".join(lines) + "\n", [t for _, t in rows]


def write_page(report: dict[str, Any], out_dir: str, entries: list[dict[str, Any]], findings_dir: str,
               title: str = "") -> tuple[str, list[str]]:
    """OUT_DIR/report.md (and its figure); its path and the triage lines."""
    text, triage = render(report, out_dir, entries, findings_dir, title)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write(text)
    return path, triage

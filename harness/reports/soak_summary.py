"""One table of numbers for several fuzz campaigns (what `make soak` ran).

Reads each campaign's report.json (written by `powercut fuzz`) and prints a
Markdown table, one row per configuration; `--json` also writes the rows.
Usage: python -m harness.reports.soak_summary [--json OUT.json] DIR...
where each DIR is a campaign directory or a directory holding campaigns.
Exit status: 0 no findings, 1 findings, 2 no campaign report found.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from foundation.jsondoc import write_json
from foundation.mdtable import table


def campaign_reports(dirs: list[str]) -> list[str]:
    """report.json of each campaign named, or of each campaign directly under a named directory."""
    found: list[str] = []
    for d in dirs:
        own = os.path.join(d, "report.json")
        if os.path.isfile(own):
            found.append(own)
            continue
        if os.path.isdir(d):
            found += sorted(p for e in os.listdir(d)
                            if os.path.isfile(p := os.path.join(d, e, "report.json")))
    return found


def row(path: str, report: dict[str, Any]) -> dict[str, Any]:
    run = report["run"]
    ops = report.get("ops_per_workload") or {}
    kernel = report.get("host_kernel", "?") if "vm" not in report else report["vm"].get("kernel_spec", "?")
    return {
        "campaign": os.path.dirname(path),
        "fs": report["fs"], "mkfs_opts": run.get("mkfs_opts", ""), "mount_opts": run.get("mount_opts", ""),
        "semantics": run.get("semantics", "posix"), "backend": run.get("backend", "fuse"), "kernel": kernel,
        "engine": report["engine"], "jobs": report["spec"].get("jobs"),
        "elapsed_s": report["elapsed_s"], "stop_reason": report["stop_reason"],
        "workloads": report["workloads"],
        "ops_min": ops.get("min"), "ops_max": ops.get("max"),
        "crash_states": report["crash_states_checked"],
        "findings_by_kind": report["findings_by_kind"],
        "saved_signatures": [s["signature"] for s in report["saved_findings"]],
        "failed_workers": report["failed_workers"],
        "loadavg_at_stop": report.get("loadavg_at_stop"),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    def config(r: dict[str, Any]) -> str:
        extra = " ".join(x for x in (r["mkfs_opts"], r["mount_opts"] and f"-o {r['mount_opts']}") if x)
        return f"{r['fs']} {extra}".strip()

    def findings(r: dict[str, Any]) -> str:
        return ", ".join(f"{k} {n}" for k, n in r["findings_by_kind"].items()) or "none"

    return "\n".join(table(
        ["configuration", "semantics", "kernel", "engine", "time", "workloads", "ops", "crash states",
         "findings (states)", "distinct signatures"],
        [[config(r), r["semantics"], r["kernel"], r["engine"], f"{r['elapsed_s'] / 60:.1f} min", r["workloads"],
          f"{r['ops_min']}-{r['ops_max']}", r["crash_states"], findings(r), len(r["saved_signatures"])]
         for r in rows]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="soak_summary", description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    paths = campaign_reports(args.dirs)
    if not paths:
        print(f"soak_summary: no campaign report.json in {' '.join(args.dirs)}", file=sys.stderr)
        return 2
    reports = []
    for p in paths:
        with open(p) as f:
            reports.append((p, json.load(f)))
    rows = [row(p, r) for p, r in sorted(reports, key=lambda pr: pr[1].get("started", 0))]  # in the order they ran
    if args.json:
        write_json(args.json, {"campaigns": rows}, indent=1)
    print(markdown(rows))
    return 1 if any(r["findings_by_kind"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""report.md: a run's report.json as Markdown, with its latency figures.

Everything shown is read from the report dict (and the PNGs it names), so
the Markdown never says anything report.json does not.
"""

from __future__ import annotations

import os
import shlex
from collections import Counter
from collections.abc import Sequence
from typing import Any

from foundation.mdtable import table
from harness.reports.plots import NOT_PLOTTED
from harness.reports.report import budget_line
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, DEFAULT_BUDGET
from workloads import scenarios

MAX_FINDINGS = 50
STAT_COLUMNS = ["count", "avg_us", "p50_us", "p99_us", "p999_us", "max_us", "deadline_misses", "budget_violations"]


def stats_table(by_kind: dict[str, dict[str, Any]]) -> list[str]:
    """One row per op kind with the latency columns of checkers.latency."""
    return table(["op", "count", "avg us", "p50 us", "p99 us", "p99.9 us", "max us", "deadline misses",
                  "budget violations", "errors"],
                 [[k, *(s[c] for c in STAT_COLUMNS), s["errors"]] for k, s in by_kind.items()])


def reproduce_command(report: dict[str, Any], out_dir: str) -> str | None:
    """The `powercut run` command that reruns this run's saved workload, if it has one."""
    saved = report["workload"].get("saved")
    if not saved:
        return None
    cmd = ["powercut", "run", os.path.join(out_dir, saved), "--fs", report["fs"]]
    for flag, key in (("--mkfs-opts", "mkfs_opts"), ("--mount-opts", "mount_opts"), ("--semantics", "semantics")):
        if report.get(key):
            cmd += [flag, report[key]]
    if report.get("crash_point_kinds", DEFAULT_POINTS) != DEFAULT_POINTS:
        cmd += ["--crash-points", report["crash_point_kinds"]]
    if report.get("max_states", DEFAULT_BUDGET) != DEFAULT_BUDGET:
        cmd += ["--max-states", report["max_states"]]
    return shlex.join(cmd)


def _run_section(report: dict[str, Any], out_dir: str) -> list[str]:
    w = report["workload"]
    gen = w.get("scenario")
    what = (f"scenario `{gen['name']}`, scale {gen['scale']}" if gen else
            f"`{w.get('file') or shlex.join(w.get('command', []))}`")
    device = f"{report['device_bytes'] >> 20} MiB, {report['sector_size']}-byte sectors"
    if report.get("device_tuning"):
        device += "; " + ", ".join(f"{k} = {v}" for k, v in report["device_tuning"].items())
    rows = [
        ["file system", f"{report['fs']} (mkfs: {report['mkfs_opts'] or 'defaults'}; "
                        f"mount: {report['mount_opts'] or 'defaults'})"],
        ["backend, kernel", f"{report['backend']}, {report['kernel']}"],
        ["semantics", f"{report.get('semantics', 'posix')} (the oracle's tier of rules, docs/semantics.md)"],
        ["device", device],
        ["workload", what + (f" (exit {w['exit_code']})" if w.get("exit_code") else "")],
        ["log", f"{report['log']}: {report['log_entries']} entries"],
        ["crash states checked", f"{report['crash_states_checked']} at {report['crash_points']} crash points "
                                 f"({report.get('crash_point_kinds', 'default')}; reorder: {report.get('reorder', 'none')})"],
        *([["crash-point budget", budget_line(report["budget"])]] if report.get("budget") else []),
        ["findings", ", ".join(f"{k} {n}" for k, n in sorted(Counter(f["kind"] for f in report["findings"]).items()))
         or "none"],
    ]
    if w.get("sysctls"):
        rows.append(["sysctls", ", ".join(f"{k} = {v}" for k, v in w["sysctls"].items())])
    cmd = reproduce_command(report, out_dir)
    if cmd:
        rows.append(["rerun", f"`{cmd}`"])
    return ["## Run", "", *table(["", ""], rows)]


def _rule(f: dict[str, Any]) -> str:
    ev = f.get("evidence", {})
    return f"{ev['rule']} ({ev.get('tier', 'posix')})" if ev.get("rule") else ""


def promise_key(f: dict[str, Any]) -> tuple[str, str, str]:
    """What a finding says was broken: its kind, rule and the op whose promise it was. Findings of
    one key are one violated promise seen in several crash states; fsck, mount, corruption and
    kernel findings (no rule) are one per kind: recovery gives a consistent, readable file system."""
    ev = f.get("evidence", {})
    return f["kind"], str(ev.get("rule") or ""), str(ev.get("op") or "")


def grouped(findings: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """FINDINGS by promise_key, in the order each key first shows."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for f in findings:
        groups.setdefault(promise_key(f), []).append(f)
    return list(groups.values())


def state_list(findings: list[dict[str, Any]]) -> str:
    """The crash states a group holds in: a range of crash points where they are consecutive, else a list."""
    ids = [f.get("state_id") or (f"p{f['crash_point']}" if f.get("crash_point") is not None else "") for f in findings]
    ids = list(dict.fromkeys(i for i in ids if i)) or ["(no crash state: " + findings[0]["kind"] + ")"]
    if len(ids) > 6:
        points = sorted({f["crash_point"] for f in findings if f.get("crash_point") is not None})
        span = f"crash points {points[0]}..{points[-1]}" if points else ""
        return f"{len(ids)} states ({span}): {', '.join(ids[:3])}, ..., {ids[-1]}"
    return ", ".join(ids)


def _evidence_lines(f: dict[str, Any]) -> list[str]:
    """A finding's evidence in full (the first state of its group)."""
    ev = f.get("evidence", {})
    out = [f"- detail: {f['detail']}"]
    for k in ("path", "op", "expected", "found", "rule", "tier", "reference", "mount_error", "errno"):
        if ev.get(k):
            out.append(f"- {k}: {ev[k]}")
    if ev.get("fsck_output"):
        out += ["- fsck:", "", "```", ev["fsck_output"].rstrip()[:4000], "```"]
    if ev.get("kernel_log"):
        out += ["- kernel log:", "", "```", "\n".join(ev["kernel_log"])[:4000], "```"]
    return out


def _findings_section(findings: list[dict[str, Any]]) -> list[str]:
    out = ["## Findings", ""]
    if not findings:
        return out + ["None: every crash state recovered and passed fsck, and no latency budget was exceeded."]
    groups = grouped(findings)
    out += [f"{len(findings)} findings in crash states, {len(groups)} violated promises (one row each: kind, rule "
            "and the op whose promise broke; fsck, mount, corruption and kernel findings one row per kind):", ""]
    out += table(["#", "kind", "rule (tier)", "op", "crash states", "first state's detail"],
                 [[n + 1, g[0]["kind"], _rule(g[0]), g[0].get("evidence", {}).get("op", ""), state_list(g),
                   g[0]["detail"].splitlines()[0][:200]] for n, g in enumerate(groups)])
    for n, g in enumerate(groups):
        where = f" (state {g[0]['state_id']})" if g[0].get("state_id") else ""
        out += ["", f"### {n + 1}. {g[0]['kind']}{where}", "", *_evidence_lines(g[0])]
        details = list(dict.fromkeys(f["detail"].splitlines()[0] for f in g[1:]))
        others = [d for d in details if d != g[0]["detail"].splitlines()[0]]
        if others:
            out += ["", f"In the other states of this row ({len(others)} other wordings):", "",
                    *(f"- {d[:200]}" for d in others[:MAX_FINDINGS])]
    return out


def _expected_damage_section(known: dict[str, Any]) -> list[str]:
    """Damage the configuration documents (checkers/known_damage.py): counted, not findings."""
    by_kind = ", ".join(f"{k} {n}" for k, n in known["by_kind"].items()) or "none"
    out = ["## Expected damage", "", f"{known['why']}. Counted here, not reported as findings: "
           f"{known['count']} ({by_kind}) in {known['crash_states']} crash states.", ""]
    if known["rows"]:
        out += table(["kind", "state", "crash point", "detail"],
                     [[r["kind"], r.get("state_id") or "", r["crash_point"], r["detail"].splitlines()[0][:160]]
                      for r in known["rows"][:MAX_FINDINGS]])
    return out


CLOCK_WORDS = {
    "emulated": "**Measured in an emulated guest** (QEMU TCG): these times are the emulator's, not a disk's or a "
                "CPU's; they compare nothing with hardware. Latency figures mean something on a host backend "
                "(fuse, dm) on the hardware under test.",
    "virtualised": "**Measured in a virtualised guest** (KVM): the guest's virtual disk and scheduler are in every "
                   "figure; for the hardware's own figures use a host backend (fuse, dm) on it.",
}


def clock_note(report: dict[str, Any]) -> list[str]:
    """The sentence latency tables carry when their clock is not the host's (report.json latency_clock)."""
    note = CLOCK_WORDS.get(report.get("latency_clock", "host"))
    return [note, ""] if note else []


def _latency_section(lat: dict[str, Any], report: dict[str, Any]) -> list[str]:
    ov, between = lat["overhead_ns"], lat["between_ops"]
    out = ["## Latency", "", *clock_note(report),
           f"Workload time {lat['duration_us'] / 1e6:.3f} s. Timing overhead inside every measured latency "
           f"(the executor's two clock reads): {ov['min']} ns min, {ov['median']} ns median. "
           f"The executor's own time between two ops of a thread (data pattern, mark write): "
           f"p50 {between['p50_us']} us, p99 {between['p99_us']} us, max {between['max_us']} us.",
           *_device_lines(lat), "", "### All threads", "", *stats_table(lat["kinds"])]
    for name, kinds in lat["threads"].items():
        out += ["", f"### Thread `{name}`", "", *stats_table(kinds)]
    if lat["repeats"]:
        out += ["", "### Periodic repeats", "",
                *table(["repeat", "thread", "period us", "iterations", "deadline misses", "p99 late us", "max late us"],
                       [[k, r["thread"], r["period_us"], r["iterations"], r["deadline_misses"], r["p99_late_us"],
                         r["max_late_us"]] for k, r in lat["repeats"].items()])]
    return out


RECORDER_NAMES = {"fuse": "FUSE recorder", "dm": "kernel's dm-log-writes"}


def _device_lines(lat: dict[str, Any]) -> list[str]:
    """What the recorded device adds to every latency: the recorder's own overhead
    (calibrated in this invocation) and the device profile it played."""
    out = []
    cal = lat.get("recorder_overhead")
    if cal:
        out += ["", f"Recorder overhead, measured in this invocation ({cal['fsyncs']} fsyncs of 4 KiB on ext4, "
                f"load {cal['load_avg_1min']}): fsync p50 {cal['recorder_p50_us']} us through the "
                f"{RECORDER_NAMES.get(cal.get('backend', 'fuse'), 'recorder')} vs "
                f"{cal['loop_p50_us']} us on a plain loop device, {cal['ratio']}x."]
    return out + profile_lines(lat.get("device_profile"))


def profile_lines(prof: dict[str, Any] | None) -> list[str]:
    """The device profile the recorder played (a run's or a comparison's), if any."""
    if not prof:
        return []
    keys = ", ".join(f"{k} {v}" for k, v in prof.items() if k != "name")
    return ["", f"Device profile `{prof['name']}` played by the recorder ({keys}): latencies include it on purpose."]


def _records_section(records: dict[str, Any]) -> list[str]:
    """The content oracle's loss window of a periodic recorder (report.json `design.records`)."""
    out = ["## Records after a crash", "",
           "What the content oracle found of the declared records (`invariants.records`) at every crash point "
           "it mounted:", "",
           *table(["crash points", "max records lost", "max ms of recording lost", "median records lost",
                   "torn tails"],
                  [[records["crash_points"], records["max_loss_records"], records["max_loss_ms"],
                    records["median_loss_records"], records["torn_tails"]]])]
    log = records.get("from_log")
    if log:
        out += ["", f"From the log alone, at all {log['crash_points']} crash points: at least "
                f"{log['max_loss_records_lower']} and at most {log['max_loss_records_upper']} records "
                f"({log['max_loss_ms_lower']}-{log['max_loss_ms_upper']} ms) lost at worst (the bounds: records "
                f"whose chunks had all reached the device; records a completed fsync covered). "
                f"{log['mounted_compared']} mounted counts checked against them, {log['mounted_outside_count']} "
                f"outside."]
    return out


def _untorn_section(report: dict[str, Any]) -> list[str]:
    """The statx limits in force and the pwritev2 writes torn per crash state
    (report.json `statx`, `torn_writes`; checkers/untorn.py)."""
    out = ["## Untorn writes", ""]
    for s in report.get("statx", []):
        out.append(f"- statx of `{s['path']}` (op {s['op']}): " + (
            f"atomic write unit {s['atomic_unit_min']}..{s['atomic_unit_max']} B, segments {s['atomic_segments_max']}, "
            f"direct I/O alignment {s['dio_offset_align']} B" if "atomic_unit_min" in s else f"errno {s['errno']}"))
    t = report.get("torn_writes")
    if t:
        out += ["", *table(["crash states with pwritev2 writes", "with a torn write", "torn writes max per state",
                            "torn RWF_ATOMIC writes"],
                           [[t["states"], t["states_torn"], t["torn_max"], t["torn_untorn_total"]]])]
    return out


def _figures_section(plots: dict[str, dict[str, str]], report: dict[str, Any]) -> list[str]:
    out = ["## Figures", "", *clock_note(report)]
    unplotted = sorted(set(report["latency"].get("kinds", {})) - set(plots))
    if unplotted:  # say why a kind in the tables has no figure
        out.append(f"No figures of {', '.join(unplotted)}: " + ("waits by design, not file-system latency."
                   if set(unplotted) <= NOT_PLOTTED else "no measured op of that kind (skipped or waits)."))
    for kind, files in plots.items():
        out += ["", f"### {kind}", "", f"![{kind} latency CDF]({files['cdf']})", "",
                f"![{kind} latency over time]({files['time']})"]
    return out


def render(report: dict[str, Any], out_dir: str) -> str:
    lines = [f"# powercut: {report['workload'].get('name', '')} on {report['fs']}", "",
             *_run_section(report, out_dir), "", *_findings_section(report["findings"])]
    if report.get("expected_damage"):
        lines += ["", *_expected_damage_section(report["expected_damage"])]
    if "latency" in report:
        lines += ["", *_latency_section(report["latency"], report)]
    if "scenario" in report:
        sec = report["scenario"]
        lines += ["", f"## Scenario `{sec['name']}`", "", *scenarios.get(sec["name"]).render(sec)]
    if report.get("design", {}).get("records"):
        lines += ["", *_records_section(report["design"]["records"])]
    if report.get("statx") or report.get("torn_writes"):
        lines += ["", *_untorn_section(report)]
    if report.get("latency", {}).get("plots"):
        lines += ["", *_figures_section(report["latency"]["plots"], report)]
    return "\n".join(lines) + "\n"


def write_markdown(out_dir: str, report: dict[str, Any]) -> str:
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write(render(report, out_dir))
    return path

"""The run pipeline as a library: record a workload on a fresh file system,
check every crash point, build the report. `powercut run`, its comparisons
(harness/compare.py), fuzz campaigns and the corpus runner all call
`run_workload` (the report) or `run_checked` (the report and what it was
built from: findings, the oracle's model, the crash points). `recheck` runs
only the checking half on a saved run directory, for one crash state: the
exact state a finding came from, rebuilt from the saved log."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from checkers.crashwalk.walk import Inspect, RecoveryOptions, WalkOptions, check_crash_states
from checkers.crashwalk.recovery_modes import mode_opts, recovery_name
from checkers.findings import Finding
from checkers.fsrules import DEFAULT_TIER, Semantics
from checkers.oracle import ContentOracle
from checkers.design import design_points
from checkers.workload_checks import WorkloadChecks, finish, prepare, records_path
from checkers.findings import fold_error_state, kernel_finding
from checkers.known_damage import known_damage, sync_marks
from checkers.unflushed_sync import SyncTails, tag_losses
from foundation import internal_error, ownership, sysres
from harness.backends import BackendOpener, engine
from foundation.errors import KernelFailure, Terminated, UsageError
from foundation.filesystems import FsType, get_fs
from harness.pipeline.checkrun import CheckRun, build_report
from harness.pipeline.config import RunConfig, check_size
from harness.reports.plots import BackgroundPlots
from foundation.progress import CrashProgress
from harness.reports.report import budget_line, latency_clock, write_report
from harness.backends import tools
from harness.reports.markdown import write_markdown
from foundation.runstate import RunState
from harness.backends.recording import Recording
from harness.backends.calibrate import recorder_vs_loop
from foundation.sparse import sparse_copy
from workloads.runner import ExecutorWorkload, WorkloadRunner, read_document
from replay.crashpoints import (DEFAULT as DEFAULT_POINTS, DEFAULT_BUDGET, EVERY_POINT, Budget, CrashPointSpec,
                               mark_range, select_crash_points)
from replay.crashstates import DEFAULT_REORDER, RECOVERY_LOG_DIR, CrashState, plan_for_log
from replay.logformat import LogReader
from workloads import scenarios
from workloads.results import read_records


CALIBRATION_FSYNCS = 1000  # ~2 s: 100 gave p50 ratios from 0.4x to 3.8x on this shared machine


def calibration_fsyncs() -> int:
    """The calibration's fsyncs per device: POWERCUT_CALIBRATION_FSYNCS, else CALIBRATION_FSYNCS.
    (The test suite takes fewer: its runs check the figures' presence and counts, not their precision.)"""
    text = os.environ.get("POWERCUT_CALIBRATION_FSYNCS", "")
    if not text:
        return CALIBRATION_FSYNCS
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"POWERCUT_CALIBRATION_FSYNCS={text!r}: a whole number of fsyncs, at least 1")
    return int(text)


@dataclass
class RunResult:
    report: dict[str, Any]
    findings: list[Finding]
    checks: WorkloadChecks          # the oracle (and its model of the workload) for JSON workloads
    log_path: str
    points: list[int]               # the crash points checked


def default_out_dir(name: str, fs: str) -> str:
    return os.path.join("out", f"{name}-{fs}-{time.strftime('%Y%m%d-%H%M%S')}")


@contextmanager
def terminate_as_exception() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Terminated("terminated")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def keep_image(src: str, dst: str) -> None:
    fd = ownership.create_file(dst)
    try:
        sparse_copy(src, fd)
    finally:
        os.close(fd)


def check_tools(fs: FsType) -> None:
    sysres.require_tools(fs.mkfs[0], fs.fsck[0], "mount", "umount", "losetup")


def _state_inspector(oracle: ContentOracle) -> Inspect:
    def inspect(mnt: str, cs: CrashState) -> list[Finding]:
        return oracle.inspect(mnt, cs.point, cs.id)
    return inspect


def run_workload(workload: WorkloadRunner, cfg: RunConfig, out_dir: str) -> dict[str, Any]:
    """Record WORKLOAD under CFG into OUT_DIR (created, or reused if powercut made
    it), check every crash point, write OUT_DIR/report.json; return the report
    (with `report_path`). Everything the run created is torn down, whatever happens."""
    return run_checked(workload, cfg, out_dir).report


def run_checked(workload: WorkloadRunner, cfg: RunConfig, out_dir: str,
                inspect_extra: Inspect | None = None, opener: BackendOpener | None = None) -> RunResult:
    """run_workload, returning what the report was built from too. INSPECT_EXTRA
    also reads every recovered crash image (after the content oracle). OPENER
    gives the backend instead of CFG (a campaign worker's live vm guest)."""
    fs = tools.for_fs(cfg.tools, get_fs(cfg.fs))
    size_mib = cfg.size_mib or max(fs.default_size_mib, workload.device.size_mib or 0)
    check_size(fs, size_mib)
    mount_opts = cfg.mount_opts if cfg.mount_opts is not None else workload.run_defaults.get("mount_opts", "")
    # A workload's suggestion is parsed here (a bad one fails before anything is recorded).
    kinds = cfg.crash_points or CrashPointSpec.parse(workload.run_defaults.get("crash_points", DEFAULT_POINTS))
    check_tools(fs)
    backend = opener(fs, workload) if opener else cfg.backend.open(fs, workload)
    out_dir = ownership.make_dir(out_dir)
    internal_error.note_output_dir(out_dir)
    log_path = os.path.join(out_dir, "recording.log")

    state = RunState.create(f"run {workload.name}")
    try:
        with terminate_as_exception():
            calibration = None
            device_cls = cfg.backend.engine.calibration_device(cfg.backend.options) if opener is None else None
            if cfg.calibrate and device_cls is not None and workload.compiled is not None:  # op latencies
                calibration = recorder_vs_loop(state, calibration_fsyncs(), device_cls)
            try:
                rec = backend.record(fs, cfg.mkfs_opts, mount_opts, workload, state, out_dir, size_mib << 20, log_path)
            except KernelFailure as e:
                unfinished = Recording(log_path, size_mib << 20, 0, kernel="")
                result = _kernel_died(e, CheckRun(unfinished, workload, fs, cfg, mount_opts, kinds, backend,
                                                  cfg.backend.name, state))
            else:
                if cfg.keep_image and rec.final_image:
                    keep_image(rec.final_image, os.path.join(out_dir, "final.img"))
                result = _check(CheckRun(rec, workload, fs, cfg, mount_opts, kinds, backend, cfg.backend.name, state,
                                         inspect_extra))
    finally:
        state.teardown_or_warn()
    lat = result.report.get("latency")
    if isinstance(lat, dict):  # next to the numbers they affect (report.md shows them there)
        if calibration:
            lat["recorder_overhead"] = calibration
        if result.report.get("device_profile"):
            lat["device_profile"] = result.report["device_profile"]
    result.report["report_path"] = write_report(out_dir, result.report)
    if cfg.markdown:
        result.report["markdown_path"] = write_markdown(out_dir, result.report)
    return result


def _kernel_died(e: KernelFailure, run: CheckRun) -> RunResult:
    """The result of a recording the kernel under test did not survive: one `kernel` finding, no crash walk."""
    findings = [kernel_finding(e.event)]
    report = build_report(run, log_entries=0, crash_points=0, states_checked=0, findings=findings,
                          extra={**run.backend.report_extra(), "recording": "the guest kernel died"})
    return RunResult(report, findings, WorkloadChecks(), run.rec.log_path, [])


def _check(run: CheckRun) -> RunResult:
    """The checking half of a run: every crash state of its recording's log (or only its
    state_ids), the report."""
    # Closed when the run is checked: a campaign worker runs thousands of these, and an fd left
    # open per run ended a 90-minute soak at fd 1024 (select() in the next recording's start).
    with LogReader(run.rec.log_path) as reader:
        return _check_log(reader, run)


def _check_log(reader: LogReader, run: CheckRun) -> RunResult:
    rec, cfg, fs, backend, mount_opts, image = run.rec, run.cfg, run.fs, run.backend, run.mount_opts, run.image
    out_dir = os.path.dirname(rec.log_path)
    first, last = mark_range(reader, cfg.start_mark, cfg.end_mark)
    points = select_crash_points(reader.entries(), run.kinds, first=first, last=last)
    checks = WorkloadChecks()
    inspect: Inspect | None = None
    compiled = run.workload.compiled   # None: a program, no model to check its crash states against
    if compiled is not None:
        checks = prepare(compiled.workload, compiled.plan, records_path(out_dir, rec.workload), reader,
                         Semantics(cfg.semantics, fs.name, cfg.mkfs_opts, mount_opts))
        if checks.oracle is not None:
            inspect = _state_inspector(checks.oracle)
    all_points = points
    budget = cfg.max_states
    if budget and not run.state_ids:
        points = _apply_budget(budget, points, checks, quiet=cfg.quiet)
    inspect = _combine(inspect, run.inspect_extra)
    modes, crash_spec = cfg.recovery, cfg.recovery_crash
    recovery = RecoveryOptions(modes, crash_spec, log_dir=os.path.join(out_dir, RECOVERY_LOG_DIR),
                               record=backend.recovery_recorder(fs, run.state, rec.device_bytes) if crash_spec else None)
    engines = {m: e for m in modes if (e := backend.recovery(fs, mode_opts(mount_opts, m), run.state, inspect))}
    plots = None
    if cfg.markdown and compiled is not None:  # drawn while the walk runs
        limits = {k: b.max_us for k, b in compiled.workload.budgets.items() if b.max_us is not None}
        plots = BackgroundPlots(records_path(out_dir, rec.workload), compiled.plan, out_dir, limits,
                                latency_clock(backend.report_extra()))
    try:
        walk_t0 = time.perf_counter()
        label = f"checking {fs.name}" + _budget_label(checks.report.get("budget"))
        with (nullcontext() if cfg.quiet else CrashProgress(label)) as progress:
            opts = WalkOptions(reorder=cfg.reorder, jobs=cfg.jobs, first_failure=cfg.first_failure,
                               inspect=inspect, engines=None if image else engines, progress=progress,
                               only=run.state_ids, recovery=recovery, image=image)
            result = check_crash_states(rec.log_path, points, fs=fs, mount_opts=mount_opts,
                                        device_bytes=rec.device_bytes, state=run.state, opts=opts)
        walk_s = time.perf_counter() - walk_t0
        figures = plots.result() if plots else None
    finally:
        if plots:
            plots.stop()
    finish(checks, reader, all_points)
    findings = fold_error_state(rec.findings + checks.findings + result.findings)
    history = checks.oracle.h if checks.oracle else None
    known = None if cfg.known_damage_findings else known_damage(fs.name, cfg.mkfs_opts, reader, history)
    expected: list[Finding] = []
    if known is not None:
        findings, expected = known.split(findings)
        tails = SyncTails(sync_marks(history), known.writes, known.flushes, cfg.backend.engine.logs_writes_at_flush)
        tag_losses(findings, plan_for_log(reader, [], cfg.reorder), tails)
    extra = {"crash_point_kinds": str(run.kinds), "device_tuning": rec.device_tuning, "tools": tools.report(cfg.tools, fs.name, fs.fsck_package),
             **checks.report, **backend.report_extra(),
             "max_states": str(budget or EVERY_POINT), "crash_points_all": len(all_points), "reorder": str(cfg.reorder),
             "crash_states_total": result.states_total,
             "crash_states_duplicate": result.states_duplicate, "stopped_at_first_failure": result.stopped_early,
             "mount_retries": result.mount_retries, "device_waits": result.device_waits, "recovery": recovery_name(modes),
             "recovery_checks": result.recovery_checks, "semantics": cfg.semantics,
             "crash_walk": {"seconds": round(walk_s, 3), "image_loads": result.image_loads,
                            "fsck_reused": result.fsck_reused,
                            **({"image_build_s": round(result.image_build_s, 3)} if engines and not image else {}),
                            "ms_per_state": round(1000 * walk_s / result.states_checked, 2)
                            if result.states_checked else None}}
    if known is not None:
        extra["expected_damage"] = known.report(expected)
    if cfg.known_damage_findings:
        extra["known_damage_findings"] = True
    if crash_spec:
        extra["recovery_crash"] = {"states_per_crash_state": crash_spec.budget, "rate": crash_spec.rate,
                                   "recoveries_recorded": result.recovery_crash_recorded,
                                   "recorded_mounts_failed": result.recovery_crash_unmounted,
                                   "states_checked": result.recovery_crash_states}
    if compiled is not None:
        results = read_records(records_path(out_dir, rec.workload), compiled.plan)
        section = scenarios.section(compiled.workload, results,
                                    {"sysctls": rec.workload.get("sysctls", {}), "device_tuning": rec.device_tuning,
                                     "torn_writes": checks.report.get("torn_writes")})
        if section:
            extra["scenario"] = section
        if figures is not None:
            extra["latency"]["plots"] = figures
    report = build_report(run, log_entries=reader.nr_entries, crash_points=len(points),
                          states_checked=result.states_checked, findings=findings, extra=extra)
    return RunResult(report, findings, checks, rec.log_path, points)


def _apply_budget(budget: Budget, points: list[int], checks: WorkloadChecks, quiet: bool) -> list[int]:
    """The crash points BUDGET keeps (design points from the oracle's model, if any).
    A budget that cuts, or one the user gave as a number, goes into the report
    (`budget`) and, unless QUIET, onto stderr before the walk."""
    o = checks.oracle
    must = design_points(o.h, points, o.records.paths if o.records else ()) if o is not None else set()
    kept = budget.choose(points, must)
    section = {"max_states": str(budget), "default": str(budget) == DEFAULT_BUDGET, "applied": len(kept) < len(points),
               "crash_points_all": len(points), "crash_points_checked": len(kept),
               "design_points": len(must & set(points)), "fraction_checked": round(len(kept) / max(1, len(points)), 6)}
    checks.report["budget"] = section
    if not quiet and section["applied"]:
        print(budget_line(section), file=sys.stderr, flush=True)
    return kept


def _budget_label(section: dict[str, Any] | None) -> str:
    if not section or not section["applied"]:
        return ""
    return f" ({section['crash_points_checked']} of {section['crash_points_all']} crash points)"


def _combine(a: Inspect | None, b: Inspect | None) -> Inspect | None:
    if a is None or b is None:
        return a or b
    return lambda mnt, cs: a(mnt, cs) + b(mnt, cs)


def recheck(run_dir: str, state_id: str, recovery: str | None = None, semantics: str | None = None,
            image: str | None = None) -> RunResult:
    """Check one crash state of the run saved in RUN_DIR again, rebuilt from its log
    (no new recording) and recovered by this host's kernel, in RECOVERY mode(s)
    (default: the run's). A state inside a recovery (`p57/r12`) is rebuilt from
    the recovery log the run kept for it. SEMANTICS: the tier (default: the
    saved run's). IMAGE: check this image instead of the rebuilt state, against
    that state's guarantees; it is copied, never written."""
    try:
        with open(os.path.join(run_dir, "report.json")) as f:
            saved = json.load(f)
        info = saved["workload"]
        recorded_by = saved.get("backend", "fuse")
        cfg = RunConfig.parse({"fs": saved["fs"], "mkfs_opts": saved["mkfs_opts"], "mount_opts": saved["mount_opts"],
                               "reorder": saved.get("reorder", DEFAULT_REORDER), "quiet": True,
                               "recovery": recovery or saved.get("recovery", "rw"),
                               "semantics": semantics or saved.get("semantics", DEFAULT_TIER),
                               "known_damage_findings": saved.get("known_damage_findings", False)})
        # Who recovers: this host's kernel, or (a vm run) a guest booting the kernel it was recorded on.
        cfg.backend = engine(recorded_by).recheck_config(saved)
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise UsageError(f"{run_dir}: not a powercut run directory ({e})") from None
    if info.get("type") != "json":
        raise UsageError(f"{run_dir}: only runs of JSON workloads can be re-checked")
    workload = ExecutorWorkload(read_document(os.path.join(run_dir, info["saved"])), {"file": info["saved"]})
    fs = get_fs(cfg.fs)
    check_tools(fs)
    if image is not None:
        check_image(image, saved["device_bytes"])
    rec = Recording(os.path.join(run_dir, saved["log"]), saved["device_bytes"], saved["sector_size"], info,
                    kernel=saved["kernel"], device_tuning=saved.get("device_tuning", {}))
    backend = cfg.backend.open(fs, workload)
    state = RunState.create(f"recheck {run_dir}")
    try:
        with terminate_as_exception():
            kinds = CrashPointSpec.parse(saved.get("crash_point_kinds", DEFAULT_POINTS))
            return _check(CheckRun(rec, workload, fs, cfg, cfg.mount_opts or "", kinds, backend, recorded_by, state,
                                   state_ids=(state_id,), image=image))
    finally:
        state.teardown_or_warn()


def check_image(path: str, device_bytes: int) -> None:
    """A supplied image must be a regular file of the recorded device's size."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise UsageError(f"--image {path}: {e.strerror}") from None
    if not os.path.isfile(path):
        raise UsageError(f"--image {path}: not a regular file (copy the device into an image file first)")
    if st.st_size != device_bytes:
        raise UsageError(f"--image {path}: {st.st_size} bytes, but the run's device had {device_bytes}")


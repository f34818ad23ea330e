"""A campaign: JOBS worker processes running one engine until the duration is
up, the engine runs out (exhaustive), a workload or finding budget is met,
or the user stops it (Ctrl-C, SIGTERM).

Workers run in their own sessions, so a Ctrl-C reaches only this process:
it sets the stop event and sends each worker one SIGTERM, which the run
pipeline turns into a teardown from the run state journal (no loop device,
mount or FUSE daemon is left); then the report is written as after a normal
stop. If the campaign process is killed (-9), the workers get SIGTERM as
their parent-death signal and tear down the same way; --resume continues. The parent only watches the journal (fuzz/layout.py) for the status
line and writes the report; it never touches a device.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import platform
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from foundation import internal_error
from foundation.cleanup import cleanup_dead_runs
from foundation.parentdeath import signal_on_parent_death
from checkers.crashwalk.recovery_modes import recovery_name
from foundation.errors import PowercutError, Terminated
from harness.pipeline.live import live_guest
from harness.pipeline.config import RunConfig
from harness.pipeline.run import terminate_as_exception
from harness.backends.vm import coverage as vm_coverage
from fuzz import campaign_report
from fuzz.coordinator import Coordinator, CoordinatorLost, Heartbeat
from fuzz.coverage import campaign_coverage
from fuzz.engines import FuzzEngine, engine as fuzz_engine
from fuzz.layout import CampaignDir, Totals
from fuzz.status import StatusLine, clock
from fuzz.shared_store import SharedFindingStore
from fuzz.store import FindingStore
from fuzz.worker import FindingBudget, Stopped, Worker, WorkloadBudget

POLL_S = 1.0
JOIN_S = 300.0


def _join_s() -> float:
    """How long a stopping worker may take beyond its shrink (POWERCUT_WORKER_STOP_S: tests)."""
    return float(os.environ.get("POWERCUT_WORKER_STOP_S", JOIN_S))


@dataclass
class CampaignSpec:
    engine: str
    duration_s: float
    jobs: int
    seed: int
    max_workloads: int = 0       # 0: no limit
    max_findings: int = 0        # 0: no limit
    options: dict[str, Any] = field(default_factory=dict)  # engine options (seq, shard, AFL and Hypothesis settings)

    @property
    def generator(self) -> FuzzEngine:
        """The registered engine (fuzz/engine.py)."""
        return fuzz_engine(self.engine)


def _worker_main(path: str, cfg: RunConfig, spec: CampaignSpec, n: int, deadline: float,
                 stop: multiprocessing.synchronize.Event, parent: int, budget: WorkloadBudget | None,
                 findings: FindingBudget | None, joined: tuple[str, str, str] | None) -> None:
    os.setsid()  # Ctrl-C goes to the campaign process only; it stops workers with one SIGTERM
    if spec.generator.uses_kernel_coverage(spec.options):
        # Its feedback: the guest's kernel coverage, off by default for what it costs (a user's
        # explicit POWERCUT_VM_COVERAGE still wins).
        os.environ.setdefault(vm_coverage.ENV, "on")

    def on_term(signum: int, frame: object) -> None:
        raise Stopped()

    signal.signal(signal.SIGTERM, on_term)
    # A campaign killed with -9 must not leave workers running on: they get SIGTERM too.
    signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != parent:
        return
    # A joined campaign: the worker's own connection, as the machine the campaign process heartbeats for.
    coord = Coordinator(*joined) if joined else None
    w = Worker(CampaignDir(path), cfg, f"w{n}", n, spec.jobs, spec.seed, deadline, stop, spec.options,
               budget=budget, findings_budget=findings, coord=coord)
    try:
        if cfg.backend.engine.keeps_guest:
            _run_in_live_guest(w, spec.generator)
        else:
            spec.generator.run(w)
    except (Stopped, Terminated):
        pass  # stopped: whatever was running has torn down
    except PowercutError as e:
        print(f"powercut: worker w{n}: {e}", file=sys.stderr)
        w.campaign.note_worker_error(w.name, str(e))
        sys.exit(2)
    except Exception as e:  # a bug: the campaign exits 3 (the traceback goes to the campaign's error.txt)
        line = internal_error.one_line(e, internal_error.save_traceback(e))
        print(f"worker w{n}: " + line, file=sys.stderr)
        w.campaign.note_worker_error(w.name, line)
        sys.exit(internal_error.EXIT_CODE)


def _run_in_live_guest(w: Worker, generator: FuzzEngine) -> None:
    """--backend vm: the worker's workloads all run in one guest it boots once (and again
    only after the guest kernel died); where the guest's time went is kept in CAMPAIGN/guests/."""
    with live_guest(w.cfg.backend, [w.cfg.fs], w.cfg.tools) as live:
        assert live is not None
        w.opener = live.open
        try:
            generator.run(w)
        finally:
            w.campaign.add_guest_stats(w.name, live.stats())


class Campaign:
    def __init__(self, cdir: CampaignDir, cfg: RunConfig, spec: CampaignSpec, coord: Coordinator | None = None) -> None:
        self.cdir, self.cfg, self.spec, self.coord = cdir, cfg, spec, coord
        self.lost: str | None = None  # why the coordinator was lost mid-campaign
        self.heartbeat: Heartbeat | None = None
        self.store = FindingStore(cdir.sub("findings"))
        self.start = time.time()
        self.before = cdir.totals()       # what earlier sessions of a resumed campaign did
        self.stop_reason = "duration"

    def run(self) -> int:
        # Once, before any worker: a failure ends the campaign here (exit 2).
        self.cfg.backend.engine.prepare(self.cfg.backend.options)
        self.store.clear_claims()
        self.cdir.clear_work()
        self.cdir.clear_worker_errors()
        if self.coord is not None:
            self._rejoin()
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        budget = WorkloadBudget(ctx, self.spec.max_workloads) if self.spec.max_workloads else None
        findings = FindingBudget(ctx, self.spec.max_findings) if self.spec.max_findings else None
        deadline = self.start + self.spec.duration_s
        joined = (self.coord.url, self.coord.name, self.coord.machine) if self.coord else None
        procs = [ctx.Process(target=_worker_main, name=f"powercut-fuzz-w{n}",
                             args=(self.cdir.path, self.cfg, self.spec, n, deadline, stop, os.getpid(), budget,
                                   findings, joined))
                 for n in range(self.spec.jobs)]
        interrupted = False
        with StatusLine() as status, self._heartbeat() as heartbeat:
            self.heartbeat = heartbeat
            try:
                with terminate_as_exception():
                    for p in procs:
                        p.start()
                    self._watch(procs, stop, status, deadline, budget, findings)
            except (KeyboardInterrupt, Terminated):
                interrupted, self.stop_reason = True, "interrupted"
                status.show("powercut fuzz: stopping, tearing down the workers' devices ...", force=True)
            finally:
                stop.set()
                self._stop_workers(procs, terminate=interrupted)
            status.show(self.status_text(self.cdir.totals()), force=True)
        failed = [p.name for p in procs if p.exitcode not in (0, None, -signal.SIGTERM)]
        self._leave()
        report = self.report(failed)
        path, _ = campaign_report.write(self.cdir.path, report, list(self.cdir.entries()))
        print(summary(report, path))
        if interrupted:
            return 130
        if self.lost:
            print(f"powercut fuzz: {self.lost}; this machine's journal and findings are kept in {self.cdir.path}: "
                  f"`powercut fuzz --resume {self.cdir.path}` rejoins the campaign", file=sys.stderr)
            return 2
        # A worker that died of a bug (or of anything but a one-line error) makes the campaign
        # untrustworthy: exit 3 even with findings (they are saved and in the report).
        if any(p.exitcode not in (0, None, -signal.SIGTERM, 2) for p in procs):
            return internal_error.EXIT_CODE
        if failed and not report["saved_findings"]:
            return 2
        return 1 if report["saved_findings"] else 0

    def _watch(self, procs: list[multiprocessing.process.BaseProcess], stop: Any, status: StatusLine,
               deadline: float, budget: WorkloadBudget | None, findings: FindingBudget | None) -> None:
        while any(p.is_alive() for p in procs):
            t = self.cdir.totals()
            status.show(self.status_text(t))
            if self.heartbeat is not None and self.heartbeat.lost:
                self.lost, self.stop_reason = self.heartbeat.lost, "coordinator-lost"
                stop.set()
            if self.spec.max_workloads and t.workloads - self.before.workloads >= self.spec.max_workloads:
                self.stop_reason = "max-workloads"
                stop.set()
            if time.time() >= deadline:
                stop.set()
            time.sleep(POLL_S)
        if self.stop_reason == "duration" and budget is not None and budget.spent():
            # a worker found the budget spent and stopped them all before the totals showed it
            self.stop_reason = "max-workloads"
        elif self.stop_reason == "duration" and findings is not None and findings.spent():
            self.stop_reason = "max-findings"  # the worker that saved the last one stopped them all
        elif not stop.is_set():
            # Workers ended by themselves: the space is done only if every one ended well (a
            # worker that died left its shard of the space undone). Workers that all ended well with
            # the deadline passed saw it before this loop did: a duration stop.
            died = any(p.exitcode != 0 for p in procs)
            if died or time.time() < deadline:
                self.stop_reason = "exhausted" if self.spec.generator.ends_space and not died else "workers-exited"

    def _stop_workers(self, procs: list[multiprocessing.process.BaseProcess], terminate: bool) -> None:
        for p in procs:
            if terminate and p.is_alive() and p.pid:
                os.kill(p.pid, signal.SIGTERM)
        # A worker shrinking a finding goes on until its shrink ends (--shrink-seconds).
        join_s = _join_s() + float(self.spec.options.get("shrink_seconds", 600))
        for p in procs:
            while True:
                try:
                    p.join(join_s)
                    break
                except KeyboardInterrupt:  # a second Ctrl-C must not cut a teardown short
                    continue
        self._kill_stuck(procs, join_s)

    def _kill_stuck(self, procs: list[multiprocessing.process.BaseProcess], waited_s: float) -> None:
        """A worker still alive after the wait is stuck (deaf to its SIGTERM, a hang in its own
        teardown): kill it and release what it recorded, or the campaign would wait for it at exit
        for ever and its loop devices and mounts stay."""
        stuck = [p for p in procs if p.is_alive() and p.pid]
        if not stuck:
            return
        for p in stuck:
            os.kill(p.pid, signal.SIGKILL)
        for p in stuck:
            p.join(JOIN_S)
        _, failed = cleanup_dead_runs(verbose=False, owners={p.pid for p in stuck if p.pid})
        names = ", ".join(p.name or "?" for p in stuck)
        left = f"; left behind: {len(failed)} resource(s), run `powercut cleanup`" if failed else ", devices released"
        print(f"powercut fuzz: {names} did not stop within {waited_s:.0f} s: killed{left}", file=sys.stderr)

    # -- a joined campaign -----------------------------------------------------------
    def _heartbeat(self) -> Heartbeat | contextlib.nullcontext[None]:
        if self.coord is None:
            return contextlib.nullcontext()
        return Heartbeat(self.coord, lambda: self.machine_totals(self.cdir.totals()))

    def _joined_done(self) -> str:
        try:
            return str(self.coord.snapshot()["done"]) if self.coord else "?"
        except CoordinatorLost:
            return "?"

    def machine_totals(self, t: Totals) -> dict[str, Any]:
        """What this machine tells the others (`powercut campaign status`)."""
        return {"workloads": t.workloads - self.before.workloads, "crash_states": t.states - self.before.states,
                "saved_findings": len(self.store.dirs()), **self.rates(t)}

    def _rejoin(self) -> None:
        """A resumed machine first records what it did while Redis was out of its reach:
        positions it ran but could not complete, findings it saved but could not upload."""
        assert self.coord is not None
        done = self.coord.done_positions()
        for e in self.cdir.entries():
            if e.get("position") is not None and "error" not in e and e["position"] not in done:
                self.coord.complete(e["position"], e)
                done.add(e["position"])
        SharedFindingStore(self.cdir.sub("findings"), self.coord).upload_missing()

    def _leave(self) -> None:
        """Give this machine's leases back (a clean stop), and say the last totals."""
        if self.coord is None:
            return
        try:
            self.coord.publish(self.machine_totals(self.cdir.totals()))
            self.coord.leave()
        except CoordinatorLost as e:
            self.lost = self.lost or str(e)
            self.stop_reason = "coordinator-lost"

    # -- numbers -----------------------------------------------------------------
    def rates(self, t: Totals) -> dict[str, float]:
        elapsed = max(time.time() - self.start, 1e-6)
        return {"elapsed_s": round(elapsed, 1),
                "workloads_per_minute": round((t.workloads - self.before.workloads) * 60 / elapsed, 2),
                "crash_states_per_second": round((t.states - self.before.states) / elapsed, 2)}

    def status_text(self, t: Totals) -> str:
        r = self.rates(t)
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(t.kinds.items())) or "none"
        remaining = max(0.0, self.start + self.spec.duration_s - time.time())
        space = self.spec.generator.space_progress(self.spec.options, len(t.indices))
        inner = f" (+{t.recovery_states} inside recoveries)" if self.cfg.recovery_crash else ""
        done = f"{t.workloads}{space} workloads"
        if self.coord is not None and space:  # this machine's numbers, and how far the whole space is
            done = (f"{t.workloads} workloads here (campaign {self.coord.name}: {self._joined_done()}"
                    f"{self.spec.generator.space_size(self.spec.options)} done)")
        elif self.coord is not None:
            done = f"{t.workloads} workloads here (campaign {self.coord.name})"
        return (f"{self.spec.engine} {self.cfg.fs}: {done} ({r['workloads_per_minute']}/min)"
                f", {t.states} crash states{inner} ({r['crash_states_per_second']}/s), findings: {kinds}, "
                f"saved {len(self.store.dirs())}, elapsed {clock(r['elapsed_s'])}, remaining {clock(remaining)}")

    def report(self, failed_workers: list[str]) -> dict[str, Any]:
        t = self.cdir.totals()
        saved = self.store.saved()
        report: dict[str, Any] = {
            "powercut_campaign": 1, "engine": self.spec.engine, "fs": self.cfg.fs, "run": self.cfg.to_json(),
            "spec": asdict(self.spec), "started": self.start, "stopped": time.time(), "stop_reason": self.stop_reason,
            # the kernel under test on fuse/dm, and how busy the machine was (rates depend on it)
            "host_kernel": platform.release(), "loadavg_at_stop": [round(x, 1) for x in os.getloadavg()],
            **self.rates(t), "workloads_this_session": t.workloads - self.before.workloads,
            "recovery": recovery_name(self.cfg.recovery), **totals_fields(t),
            "saved_findings": [saved_entry(s) for s in saved],
            "failed_workers": failed_workers,
            "worker_errors": self.cdir.worker_errors(),   # wN -> the line a failed worker ended with
        }
        report.update(self.spec.generator.space_report(self.spec.options, len(t.indices)))
        backend = self.cfg.backend
        if backend.engine.keeps_guest:
            report[backend.name] = {**backend.engine.describe(backend.options), **self.cdir.guest_stats()}
        if self.coord is not None:
            report["joined"] = {"coordinator": self.coord.url, "campaign": self.coord.name,
                                "machine": self.coord.machine, **({"lost": self.lost} if self.lost else {})}
        cov = campaign_coverage(self.cdir.entries(), self.start)
        if cov is not None:  # kernel coverage (vm): the union over all runs, and its growth
            report["coverage"] = cov
        report.update(self.spec.generator.report_extra(self.spec.options, self.cdir.sub))
        return report


def totals_fields(t: Totals) -> dict[str, Any]:
    """The report's fields that come from the journal's totals."""
    return {"workloads": t.workloads, "shrink_runs": t.shrink_runs, "harness_errors": t.errors,
            "first_harness_error": t.first_error, "crash_states_checked": t.states,
            "mount_retries": t.mount_retries, "device_waits": t.device_waits,
            "recovery_crash_states_checked": t.recovery_states, "ops_per_workload": ops_distribution(t.ops),
            "findings_by_kind": dict(sorted(t.kinds.items())), "expected_damage": t.expected_damage,
            "signatures_found": sorted(t.signatures)}


def saved_entry(s: dict[str, Any]) -> dict[str, Any]:
    """A saved finding (its finding.json, with its directory name) as the report lists it."""
    return {"dir": s["dir"], "kind": s["kind"], "signature": s["signatures"][0], "ops": s["ops"],
            "state_id": s["state_id"], "shrink_complete": s["shrink"].get("complete", False),
            **({"shrink_cut_short": s["shrink"]["cut_short"]} if s["shrink"].get("cut_short") else {})}


def ops_distribution(ops: Counter[int]) -> dict[str, Any]:
    """How long the generated workloads were (ops as the executor ran them)."""
    if not ops:
        return {}
    sizes = sorted(ops.elements())
    return {"min": sizes[0], "median": sizes[len(sizes) // 2], "max": sizes[-1],
            "histogram": {str(n): c for n, c in sorted(ops.items())}}


def summary(report: dict[str, Any], path: str) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in report["findings_by_kind"].items()) or "none"
    on_kernel = f" in a vm guest ({report['vm']['kernel_spec']})" if "vm" in report else ""
    lines = [f"powercut fuzz ({report['engine']}) on {report['fs']}{on_kernel} (mkfs: {report['run']['mkfs_opts'] or 'defaults'}, "
             f"mount: {report['run']['mount_opts'] or 'defaults'}): stopped ({report['stop_reason']}) after "
             f"{clock(report['elapsed_s'])}",
             f"  workloads: {report['workloads']} ({report['workloads_per_minute']}/min this session), crash states "
             f"checked: {report['crash_states_checked']} ({report['crash_states_per_second']}/s), shrink runs: "
             f"{report['shrink_runs']}",
             f"  findings (crash states): {kinds}"]
    cov = report.get("coverage")
    if cov:
        lines.append(f"  kernel coverage: workload {cov['workload_functions']} functions, recovery "
                     f"{cov['recovery_functions']} ({cov['runs_with_new_functions']} of {cov['runs']} runs added some)")
    if report.get("expected_damage"):
        lines.append(f"  expected damage (the configuration documents it, e.g. ext4 without a journal before a "
                     f"completed sync; not findings): {report['expected_damage']}")
    if report["run"].get("recovery_crash"):
        lines.insert(3, f"  crash states inside recoveries checked: {report['recovery_crash_states_checked']} "
                        f"(--recovery-crash-rate {report['run']['recovery_crash_rate']}, at most "
                        f"{report['run']['recovery_crash_states']} per crash state)")
    if report["run"].get("recovery", "rw") != "rw":
        lines.insert(3, f"  recovery: {report['run']['recovery']} (each crash state recovered "
                        f"{'read-write and read-only' if report['run']['recovery'] == 'both' else 'read-only'})")
    if report.get("harness_errors"):
        lines.append(f"  warning: the harness failed on {report['harness_errors']} runs (first: "
                     f"{report.get('first_harness_error', '?')}); their journal entries say why")
    if report.get("mount_retries"):
        lines.append(f"  warning: {report['mount_retries']} crash states mounted only at the second try "
                     "(no finding: the same state, rebuilt from the log, mounted)")
    if report.get("device_waits"):
        lines.append(f"  warning: {report['device_waits']} recovery mounts found their device busy and waited "
                     "for it (no finding; each run's report.json lists what held it)")
    if report.get("ops_per_workload"):
        o = report["ops_per_workload"]
        lines.insert(2, f"  ops per workload: min {o['min']}, median {o['median']}, max {o['max']}")
    lines += fuzz_engine(report["engine"]).summary_lines(report)
    for s in report["saved_findings"]:
        shrunk = "" if s.get("shrink_complete") else f" (NOT fully shrunk: {s.get('shrink_cut_short', 'not shrunk')})"
        lines.append(f"  saved {s['dir']}: {s['signature']}, {s['ops']} ops, crash state {s['state_id']}{shrunk}")
        if s.get("triage"):
            lines.append(f"    triage: {s['triage']}")
    if report["failed_workers"]:
        lines.append(f"  workers that failed: {', '.join(report['failed_workers'])}")
    for name, line in report.get("worker_errors", {}).items():
        lines.append(f"  worker {name}: {line}")
    for bug, n in report.get("known_bug_hits", {}).items():
        lines.append(f"  documented bug {bug}: shown by {n} workloads (saved once, not shrunk)")
    lines.append(f"  report: {path} (and report.md beside it)")
    return "\n".join(lines)

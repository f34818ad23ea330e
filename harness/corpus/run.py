"""Running the corpus across a matrix, and judging the results.

Each (entry, row) case runs through the normal pipeline; its verdict (the
finding kinds, latency aside) is compared with the entry's expectation for
that row, and, given a baseline results file, with the baseline: verdict
changes are listed, and an op kind whose p99 or max latency got worse than
FACTOR x the baseline (and above a floor, to ignore noise on tiny ops) is a
latency regression.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import platform
import queue
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.jsondoc import write_json
from checkers.fsrules import DEFAULT_TIER
from foundation import ownership
from harness.corpus.entries import load_doc, VERDICT_KINDS, Entry, Row
from foundation.errors import EnvError, KernelFailure, PowercutError, Terminated, UsageError
from foundation.filesystems import get_fs, host_kernel_lacks
from foundation.parentdeath import signal_on_parent_death
from harness.backends import BackendConfig, KeptGuest
from harness.backends.engine import option_keys
from harness.pipeline.config import KEYS, RunConfig, host_backend
from harness.pipeline.live import live_guest, opener
from harness.pipeline.run import check_tools, run_checked
from workloads.runner import load_runner
from harness.backends import tools

if TYPE_CHECKING:
    import multiprocessing.queues

RESULTS_FORMAT = "powercut-corpus-results/1"
LATENCY_STATS = ("p99_us", "max_us")


@dataclass
class Case:
    entry: str
    row: str
    fs: str
    mkfs_opts: str
    mount_opts: str
    expected: list[str]
    verdict: list[str] | None = None          # None: the case could not run
    error: str = ""
    report: str = ""
    crash_states: int = 0
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    regressions: list[str] = field(default_factory=list)
    baseline_verdict: list[str] | None = None
    kernel: str = ""                          # the kernel the case ran on (the guest's with --backend vm)
    may: list[str] = field(default_factory=list)  # kinds allowed besides `expected` (timing-dependent)

    @property
    def key(self) -> str:
        return f"{self.entry}@{self.row}"

    @property
    def unexpected(self) -> bool:
        if self.verdict is None:
            return True
        must = set(self.expected)
        return not must <= set(self.verdict) <= must | set(self.may)

    @property
    def failed(self) -> bool:
        return self.unexpected or bool(self.regressions)


@dataclass(frozen=True)
class CorpusOptions:
    """The options every case of a corpus run shares: where it records and recovers (`--backend`,
    `--kernel`), how it recovers, the oracle's tier."""
    backend: BackendConfig = field(default_factory=host_backend)
    recovery: dict[str, Any] = field(default_factory=dict)  # --recovery* (run config keys); a row's recovery wins
    semantics: str = DEFAULT_TIER    # the oracle's tier for every case (`--semantics`)
    tools: str | None = None         # --tools: mkfs/fsck of a Debian suite (None: the host's)


def host_cannot_run(row: Row) -> str:
    """Why this host cannot run ROW's file system with the fuse backend ("" if it can)."""
    try:
        check_tools(get_fs(row.fs))
    except PowercutError as e:
        return str(e)
    return host_kernel_lacks(row.fs)


# What an entry's `run` may set: not what the row, the corpus run or its backend decide.
ENTRY_RUN_KEYS = KEYS - option_keys() - {"backend", "fs", "mkfs_opts", "mount_opts", "quiet", "semantics"}


def run_config(entry: Entry, row: Row, options: CorpusOptions = CorpusOptions()) -> RunConfig:
    bad = set(entry.run) - ENTRY_RUN_KEYS
    if bad:
        raise UsageError(f"{entry.path}: unknown run option(s) {', '.join(sorted(bad))}")
    # The expectations were recorded with in-order crash states only: an entry
    # opts in to reordering (`"run": {"reorder": ...}`) with verdicts to match.
    run = {"reorder": "none", **options.recovery, **entry.run}
    if row.recovery:
        run["recovery"] = row.recovery
    return RunConfig.parse({**options.backend.to_json(), "fs": row.fs, "mkfs_opts": row.mkfs_opts,
                            "mount_opts": row.mount_opts, "quiet": True, "semantics": options.semantics,
                            "tools": options.tools, **run})


def run_case(entry: Entry, row: Row, out_dir: str, options: CorpusOptions = CorpusOptions(),
             live: KeptGuest | None = None) -> Case:
    """One case; with LIVE (--backend vm) in that live guest."""
    case = Case(entry.name, row.name, row.fs, row.mkfs_opts, row.mount_opts, entry.expected(row),
                may=entry.allowed(row))
    case_dir = ownership.make_dir(os.path.join(out_dir, row.name, entry.name))
    wl = os.path.join(case_dir, "workload.json")
    write_json(wl, entry.workload, indent=1)
    try:
        cfg = run_config(entry, row, options)
        report = run_checked(load_runner(wl), cfg, os.path.join(case_dir, "run"), opener=opener(live)).report
    except PowercutError as e:
        case.error = str(e)
        return case
    case.verdict = sorted({f["kind"] for f in report["findings"]} & set(VERDICT_KINDS))
    case.report = os.path.relpath(report["report_path"], out_dir)
    case.crash_states = report["crash_states_checked"]
    case.kernel = report.get("kernel", "")
    case.latency = {k: {s: v[s] for s in LATENCY_STATS}
                    for k, v in report.get("latency", {}).get("kinds", {}).items() if v.get("count")}
    return case


def run_cases(todo: list[tuple[Entry, Row]], out_dir: str, options: CorpusOptions = CorpusOptions(),
              jobs: int = 1) -> Iterator[Case]:
    """Run every (entry, row) case, JOBS at a time, each in its own process; yield them as they finish."""
    for row_name in {row.name for _, row in todo}:  # made here: workers would race on the parents
        ownership.make_dir(os.path.join(out_dir, row_name))
    if options.backend.engine.keeps_guest:
        yield from _run_live(todo, out_dir, options, jobs)
        return
    # A suite's tools are had once, here (and shared by the cases through the cache): a suite
    # that cannot give them is one error for the corpus run (exit 2), not one per case.
    for fs in sorted({row.fs for _, row in todo}):
        tools.for_fs(options.tools, get_fs(fs))
    if jobs <= 1:
        for entry, row in todo:
            yield run_case(entry, row, out_dir, options)
        return
    # Processes, not threads: a run installs its SIGTERM handler, which only a main thread may.
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [pool.submit(run_case, entry, row, out_dir, options) for entry, row in todo]
        for future in as_completed(futures):
            yield future.result()  # a case's internal error ends the corpus run (exit 3)
    finally:
        pool.shutdown(cancel_futures=True)  # the cases under way finish (and tear down); no new one starts


# --backend vm: each job keeps one live guest for all its cases (harness/pipeline/live.py).
def _guest_size_mib(case: tuple[Entry, Row]) -> int:
    """The device size the case's guest gets (a live guest's disks are fixed at boot): cases
    are run grouped by it, so a job boots once per size, not once per change of size."""
    entry, row = case
    return int(entry.run.get("size_mib") or get_fs(row.fs).default_size_mib)


def _run_job(todo: list[tuple[Entry, Row]], out_dir: str, options: CorpusOptions, job: int = 0) -> Iterator[Case]:
    with live_guest(options.backend, {row.fs for _, row in todo}, options.tools) as live:
        assert live is not None
        try:
            for entry, row in todo:
                yield run_case(entry, row, out_dir, options, live)
        finally:
            s = live.stats()
            print(f"powercut corpus: job {job}: {s['boots']} guest boot(s), {s['boot_seconds']} s booting",
                  file=sys.stderr, flush=True)


def _job_main(todo: list[tuple[Entry, Row]], out_dir: str, options: CorpusOptions, job: int,
              results: "multiprocessing.queues.Queue[tuple[str, Any]]") -> None:
    """A job process: its cases in its live guest, each sent back as it finishes. Ctrl-C
    reaches the parent only; the parent's SIGTERM (or its death) tears the case under way down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_term(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one teardown, not one per signal
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    signal_on_parent_death(signal.SIGTERM)  # a corpus run killed with -9 must not leave its jobs running
    try:
        for case in _run_job(todo, out_dir, options, job):
            results.put(("case", case))
    except KernelFailure as e:  # (the pipeline turns these into findings; its args do not pickle)
        results.put(("error", EnvError(str(e))))
    except PowercutError as e:  # the guest cannot be had (kernel, tools): exit 2 in the parent
        results.put(("error", e))
    except BaseException as e:  # a bug: exit 3 in the parent, with this traceback in error.txt
        results.put(("error", RuntimeError(f"corpus job {job}: {type(e).__name__}: {e}\n"
                                           + "".join(traceback.format_exception(e)))))


def _run_live(todo: list[tuple[Entry, Row]], out_dir: str, options: CorpusOptions, jobs: int) -> Iterator[Case]:
    todo = sorted(todo, key=_guest_size_mib)  # stable: row order within a size
    if jobs <= 1 or len(todo) == 1:
        yield from _run_job(todo, out_dir, options)
        return
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    # Every job takes every JOBS-th case: each goes through the sizes in the same order.
    procs = [ctx.Process(target=_job_main, name=f"powercut-corpus-job{k}",
                         args=(todo[k::jobs], out_dir, options, k, results)) for k in range(min(jobs, len(todo)))]
    finished = False
    try:
        for p in procs:
            p.start()
        for _ in todo:
            while True:
                try:
                    kind, item = results.get(timeout=1.0)
                    break
                except queue.Empty:
                    if not any(p.is_alive() for p in procs) and results.empty():
                        codes = ", ".join(f"{p.name} {p.exitcode}" for p in procs)
                        raise RuntimeError(f"corpus jobs ended before their cases were done ({codes})") from None
            if kind == "error":
                raise item
            yield item
        finished = True
    finally:
        for p in procs:
            if not finished and p.is_alive() and p.pid:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.join()


def compare_baseline(cases: list[Case], baseline: dict[str, Any], factor: float, floor_us: float) -> None:
    base = baseline.get("cases", {})
    for c in cases:
        b = base.get(c.key)
        if not b or c.verdict is None:
            continue
        c.baseline_verdict = b.get("verdict")
        for kind, stats in c.latency.items():
            for s in LATENCY_STATS:
                old = b.get("latency", {}).get(kind, {}).get(s)
                new = stats[s]
                if old is not None and new > old * factor and new > floor_us:
                    c.regressions.append(f"{kind} {s} {new:.0f} us > {factor:g} x baseline {old:.0f} us")


def load_results(path: str) -> dict[str, Any]:
    return load_doc(path, RESULTS_FORMAT, "a corpus results file")


def results_doc(cases: list[Case], started: float, options: CorpusOptions = CorpusOptions()) -> dict[str, Any]:
    kernels = sorted({c.kernel for c in cases if c.kernel})
    spec = options.backend.engine.describe(options.backend.options).get("kernel_spec")
    return {
        "format": RESULTS_FORMAT,
        # The kernel under test: the guest's with --backend vm, else the host's.
        "kernel": ", ".join(kernels) or spec or platform.release(),
        "host_kernel": platform.release(),
        "backend": options.backend.name,
        "semantics": options.semantics,
        "kernel_spec": spec,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "summary": {"cases": len(cases), "unexpected": sum(c.unexpected for c in cases),
                    "regressions": sum(bool(c.regressions) for c in cases),
                    "errors": sum(bool(c.error) for c in cases)},
        "cases": {c.key: {k: v for k, v in dataclasses.asdict(c).items() if k not in ("entry", "row")} | {
            "entry": c.entry, "row": c.row, "unexpected": c.unexpected} for c in cases},
    }

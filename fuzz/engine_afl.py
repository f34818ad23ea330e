"""The afl engine: AFL++ drives the inputs, fuzz/afl_target.py runs them.

Worker n runs one afl-fuzz instance, PREFIXn, in the sync directory
CAMPAIGN/afl (or --afl-sync-dir): the first is the main instance (-M) unless
--afl-secondary, the others are secondaries (-S). Instances on other
machines sync through the same directory (shared, or rsync'd: AFL++ imports
every other instance's queue/ it finds there), or, in a joined campaign,
through the coordinator's Redis (fuzz/afl_sync.py; instance names carry the
machine's tag, and the campaign's first instance is the only -M). The target is not
instrumented and writes its own feedback (AFL_SKIP_BIN_CHECK, AFL_MAP_SIZE),
runs without a fork server (AFL_NO_FORKSRV: a Python process per input) and
is mutated only by the op-record mutator (AFL_PYTHON_MODULE,
AFL_CUSTOM_MUTATOR_ONLY). Trimming is off (each run costs seconds).

The worker itself watches the inputs the target hands it (a new signature:
CAMPAIGN/pending/W-target/): each is run again, and a new signature is
shrunk (delta debugging) and saved. (AFL++'s own crashes/ keeps only
crashes with new coverage, and none from the seeds' calibration.)
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from foundation import ownership, paths
from foundation.errors import EnvError
from foundation.options import Option
from foundation.runstate import RunState, spawn_recorded
from foundation.sysres import wait_pid_gone
from fuzz.afl_sync import QueueSync, claim_main, machine_tag
from fuzz.afl_target import PIDFILE, TIME_LIMIT_S, pending_dir
from fuzz.engine import FuzzEngine, OptionGroup, register_engine
from fuzz.worker import Worker
from workloads.format import workload_doc
from workloads.opcodec import decode, random_record

SYNC = OptionGroup("afl engine", (
    Option("afl_sync_dir", "--afl-sync-dir", metavar="DIR",
           help="AFL++ sync directory shared with other machines (default: CAMPAIGN/afl)"),
    Option("afl_prefix", "--afl-prefix", default="w", help="instance name prefix, unique per machine (default: w)"),
    Option("afl_secondary", "--afl-secondary", action="store_true", default=False,
           help="no main (-M) instance here: another machine has it"),
))
AFL_STATS = ("corpus_count", "execs_done", "saved_crashes", "stability", "bitmap_cvg")  # of fuzzer_stats, reported
MAP_SIZE = 1 << 16
EXEC_TIMEOUT_MS = (TIME_LIMIT_S + 60) * 1000  # the target stops itself first, cleanly
POLL_S = 2.0
STOP_WAIT_S = 120


def afl_fuzz() -> str:
    exe = shutil.which("afl-fuzz")
    if exe is None:
        raise EnvError("afl-fuzz not found: `make fuzz ENGINE=afl` installs afl++ (or apt-get install afl++)")
    return exe


def seeds(sync_dir: str, seed: int) -> str:
    """A few short op-record inputs, made once per sync directory."""
    d = os.path.join(sync_dir, "seeds")
    if not os.path.isdir(d):
        ownership.make_dir(d)
        rng = random.Random(seed)
        for i in range(4):
            with open(os.path.join(d, f"seed{i}"), "wb") as f:
                f.write(b"".join(random_record(rng) for _ in range(rng.randint(3, 8))))
    return d


def environment(w: Worker) -> dict[str, str]:
    return dict(os.environ, AFL_SKIP_BIN_CHECK="1", AFL_NO_FORKSRV="1", AFL_MAP_SIZE=str(MAP_SIZE),
                AFL_PYTHON_MODULE="workloads.afl_mutator", AFL_CUSTOM_MUTATOR_ONLY="1",
                PYTHONPATH=paths.ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                AFL_DISABLE_TRIM="1", AFL_FAST_CAL="1", AFL_NO_UI="1", AFL_SKIP_CPUFREQ="1",
                AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES="1", AFL_NO_AFFINITY="1", AFL_AUTORESUME="1",
                AFL_KILL_SIGNAL=str(int(signal.SIGTERM)))


def command(w: Worker, sync_dir: str, instance: str) -> list[str]:
    if w.coord is not None:  # joined: the first instance of the whole campaign is the main one
        role = "-M" if claim_main(w.coord, instance) else "-S"
    else:
        role = "-S" if w.number or w.options.get("afl_secondary") else "-M"
    resumed = os.path.isdir(os.path.join(sync_dir, instance, "queue"))
    return [afl_fuzz(), "-i", "-" if resumed else seeds(sync_dir, w.seed), "-o", sync_dir, role, instance,
            "-t", str(EXEC_TIMEOUT_MS), "-m", "none", "-s", str(w.seed + w.number), "--",
            sys.executable, "-m", "fuzz.afl_target", "--campaign", os.path.abspath(w.campaign.path),
            "--worker", f"{w.name}-target", "@@"]


def run(w: Worker) -> None:
    sync_dir = os.path.abspath(w.options.get("afl_sync_dir") or w.campaign.sub("afl"))
    if not os.path.isdir(sync_dir):
        ownership.make_dir(sync_dir)
    prefix = w.options.get("afl_prefix", "w")
    instance = f"{prefix}{machine_tag(w.coord)}-{w.number}" if w.coord is not None else f"{prefix}{w.number}"
    sync = QueueSync(w.coord, sync_dir, instance) if w.coord is not None else None
    target = f"{w.name}-target"
    state = RunState.create(f"afl-fuzz {instance}")
    log = open(os.path.join(sync_dir, f"{instance}.log"), "ab")
    try:
        proc, res = spawn_recorded(state, command(w, sync_dir, instance), "afl-fuzz", env=environment(w),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=w.work)
        pending = pending_dir(w.campaign, target)
        try:
            while not w.should_stop() and proc.poll() is None:
                triage_pending(w, pending)
                if sync is not None:
                    sync()
                time.sleep(POLL_S)
            if proc.poll() is not None and not w.should_stop():
                raise EnvError(f"afl-fuzz exited with {proc.returncode}: see {log.name}")
        finally:
            stop_afl(proc)
            state.released(res)
            wait_for_target(os.path.join(w.campaign.sub("work"), target, PIDFILE))
        triage_pending(w, pending)
    finally:
        log.close()
        state.teardown(log=lambda m: print(m, file=sys.stderr))


def stop_afl(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT: AFL++ stops, sending the running target AFL_KILL_SIGNAL (SIGTERM: it tears down).
    A child forked but not yet exec'd is still afl-fuzz, with its handler for SIGTERM: it
    would wait for ever; it holds nothing, so it gets SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    end = time.monotonic() + STOP_WAIT_S
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.5)
        for pid in children(proc.pid):
            try:
                if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "afl-fuzz":
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
    proc.wait(timeout=STOP_WAIT_S)


def children(pid: int) -> list[int]:
    out = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def wait_for_target(pidfile: str) -> None:
    """The last target run may still be tearing down after afl-fuzz exits."""
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    if pid:
        wait_pid_gone(pid, timeout=STOP_WAIT_S)


def triage_pending(w: Worker, pending: str) -> None:
    """Run each input the target left with a new finding again; shrink and save what shows."""
    if not os.path.isdir(pending):
        return
    for name in sorted(os.listdir(pending)):
        if name.endswith(".tmp") or w.stop.is_set():
            continue
        path = os.path.join(pending, name)
        with open(path, "rb") as f:
            ops = decode(f.read())
        os.remove(path)
        trial = w.run(workload_doc(ops, name=f"afl-{name[:12]}"), engine="afl", afl_input=name)
        if trial is not None:
            w.triage(trial)


def afl_stats(sync_dir: str) -> dict[str, dict[str, str]]:
    """Each AFL++ instance's fuzzer_stats (the ones this report needs)."""
    out = {}
    for name in sorted(os.listdir(sync_dir)) if os.path.isdir(sync_dir) else []:
        path = os.path.join(sync_dir, name, "fuzzer_stats")
        if os.path.isfile(path):
            with open(path) as f:
                stats = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in f if ":" in ln)}
            out[name] = {k: stats[k] for k in AFL_STATS if k in stats}
    return out


class AflEngine(FuzzEngine):
    name = "afl"
    summary = "AFL++ mutates op-record inputs, each run by a new target process"
    groups = (SYNC,)
    one_process_per_workload = True

    def run(self, w: Worker) -> None:
        run(w)

    def require(self) -> None:
        afl_fuzz()  # now, with the install hint, not in a worker

    def report_extra(self, options: Mapping[str, Any], campaign_dir: Callable[[str], str]) -> dict[str, Any]:
        return {"afl": afl_stats(options.get("afl_sync_dir") or campaign_dir("afl"))}

    def summary_lines(self, report: Mapping[str, Any]) -> list[str]:
        return [f"  afl {name}: corpus {st.get('corpus_count')}, execs {st.get('execs_done')}, "
                f"crashes {st.get('saved_crashes')}, stability {st.get('stability')}"
                for name, st in report.get("afl", {}).items()]


register_engine(AflEngine())

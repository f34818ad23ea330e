"""`make bench`'s recorder figures: what the recorded device adds to an fsync
(harness/backends/calibrate.py), for the fuse recorder on this machine and
for the kernel's dm-log-writes.

dm runs here where this kernel has dm-log-writes; where it has not (this
project's machines) it runs inside a guest of the bench kernel that sees the
host's files (harness/backends/vm/hostroot.py: `powercut bench --only
recorder --backend dm` in the guest). There both devices are loop devices on
the guest's tmpfs and the guest runs under TCG, so the p50s are slow in
absolute terms; their ratio compares one kernel with and without the
recorder, in turns in one process.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

from harness.backends import configure, engine
from harness.backends.calibrate import recorder_vs_loop
from harness.backends.dm import support
from harness.backends.vm.hostroot import run_in_guest
from harness.backends.vm.kernel import resolve
from foundation import ownership, paths
from foundation.errors import EnvError, UsageError
from foundation.runstate import RunState

GUEST_TIMEOUT_S = 1800


def recorder_overhead(state: RunState, reps: int, fsyncs: int, backend: str = "fuse") -> dict[str, Any]:
    """BACKEND's fsync calibration REPS times; the median run by ratio, and all of them."""
    chosen = configure(backend, {})
    cls = chosen.engine.calibration_device(chosen.options)
    if cls is None:
        raise UsageError(f"--backend {backend}: no recorded device on this host to calibrate")
    runs = sorted((recorder_vs_loop(state, fsyncs, cls) for _ in range(reps)), key=lambda r: r["ratio"])
    return {**runs[len(runs) // 2], "runs": runs}


def bench_recorder(quick: bool, backend: str = "fuse", kernel_spec: str | None = None) -> dict[str, Any]:
    """`powercut bench --only recorder [--backend dm [--kernel K]]`: with a kernel, dm is measured
    in a guest of it where this kernel has no dm-log-writes (as `make bench` does)."""
    dm_anywhere = backend == "dm" and bool(kernel_spec)  # here if this kernel has dm, else in a guest
    if not dm_anywhere:
        engine(backend).require()
    state = RunState.create("bench")
    try:
        fsync = (bench_dm_recorder(kernel_spec, state.scratch, quick) if dm_anywhere
                 else recorder_overhead(state, 1 if quick else 3, 200 if quick else 1000, backend))
    finally:
        state.teardown_or_warn()
    assert fsync is not None   # bench_dm_recorder has a kernel
    return {"recorder_fsync_p50_ratio": fsync["ratio"], "details": {"fsync": fsync}}


def _in_guest(kernel_spec: str, scratch: str, quick: bool) -> dict[str, Any]:
    """`bench --only recorder --backend dm` in a guest of KERNEL_SPEC: its fsync figures."""
    out = ownership.make_dir(os.path.join(scratch, "dm-recorder"))
    result = os.path.join(out, "bench.json")
    argv = [sys.executable, "-m", "cli.main", "bench", "--only", "recorder", "--backend", "dm",
            "--json", result, *(["--quick"] if quick else [])]
    # The project is read-only in the guest: no bytecode written there.
    command = f"cd {shlex.quote(paths.ROOT)} && PYTHONDONTWRITEBYTECODE=1 {shlex.join(argv)}"
    state = RunState.create("bench dm recorder")
    try:
        res = run_in_guest(resolve(kernel_spec), command, out, state, timeout=GUEST_TIMEOUT_S)
    finally:
        state.teardown_or_warn()
    if res.exit_code != 0 or not os.path.exists(result):
        tail = res.output.strip().splitlines()[-1:] or ["no output"]
        raise EnvError(f"the dm recorder bench in the {kernel_spec} guest failed (exit {res.exit_code}): {tail[0]}")
    with open(result) as f:
        fsync: dict[str, Any] = json.load(f)["details"]["fsync"]
    return {**fsync, "where": f"guest {res.kernel} under TCG", "guest_seconds": round(res.seconds, 1)}


def bench_dm_recorder(kernel_spec: str | None, scratch: str, quick: bool) -> dict[str, Any] | None:
    """The dm recorder's fsync figures: on this kernel if it has dm-log-writes, else in a
    guest of KERNEL_SPEC; None when neither is possible (no kernel given)."""
    if not support.missing():
        return {**bench_recorder(quick, "dm")["details"]["fsync"], "where": f"host {os.uname().release}"}
    if kernel_spec is None:
        return None
    return _in_guest(kernel_spec, scratch, quick)

"""Seed experiment 4 (Gupta et al.): ITERATIONS x (write 512 B + fsync) on one file.

The paper timed the whole loop: 84 s on ext4 with write barriers, 4 s on
ext3 without, 2 s on HFS+ (different machines). Here every fsync is timed
too. Compare mount options in one command:

    powercut run scenario:fsync-loop --fs ext4 --mount-opts-matrix "barrier=1;barrier=0;data=journal;commit=30"

Each option's crash checks run on its own recording, so the same report
shows what barrier=0 costs in crash consistency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from foundation.mdtable import table
from workloads.results import Results
from workloads.scenarios.common import count, duration_s, group, group_stats, op, repeat, thread, workload

NAME = "fsync-loop"
SUMMARY = "Gupta et al.: 4096 x (write 512 B + fsync) on one file; compare mount options with --mount-opts-matrix"
RUN_DEFAULTS: dict[str, str] = {}
PAPER_ITERATIONS = 4096
# Seconds for the paper's 4096 iterations (different machines and disks).
PUBLISHED_S = {"ext4, write barriers": 84, "ext3, no barriers": 4, "HFS+": 2}


@dataclass(frozen=True)
class Params:
    iterations: int = PAPER_ITERATIONS
    write_bytes: int = 512


def params(scale: float) -> Params:
    return Params(iterations=count(PAPER_ITERATIONS, scale))


def generate(p: Params) -> dict[str, Any]:
    ops = [
        op("open", "loop.open", path="loop.dat", flags=["O_CREAT", "O_WRONLY", "O_TRUNC"], fd="f"),
        repeat(p.iterations, [op("write", "loop.write", fd="f", length=p.write_bytes),
                              op("fsync", "loop.fsync", fd="f")], op_id="loop.iteration"),
        op("close", "loop.close", fd="f"),
    ]
    return workload(NAME, SUMMARY, [thread("loop", ops)])


def analyze(results: Results, p: Params, facts: dict[str, Any]) -> dict[str, Any]:
    loop_s = duration_s(group(results, "loop.iteration"))
    fsync = group_stats(results, "loop.fsync")
    return {
        "iterations": p.iterations,
        "loop_s": round(loop_s, 3),
        "per_4096_s": round(loop_s * PAPER_ITERATIONS / p.iterations, 3) if p.iterations else 0.0,
        "fsync": {k: fsync[k] for k in ("count", "errors", "avg_us", "p50_us", "p99_us", "max_us")},
        "write_avg_us": group_stats(results, "loop.write")["avg_us"],
        "published_s": PUBLISHED_S,
    }


def render(section: dict[str, Any]) -> list[str]:
    f = section["fsync"]
    out = table(["iterations", "loop s", "for 4096 iterations s", "fsync avg us", "fsync p50 us", "fsync p99 us",
                 "fsync max us", "write avg us"],
                [[section["iterations"], section["loop_s"], section["per_4096_s"], f["avg_us"], f["p50_us"],
                  f["p99_us"], f["max_us"], section["write_avg_us"]]])
    out += ["", "The paper's loop of 4096 iterations took (seconds; different machines):", ""]
    out += table(["system", "seconds"], [[k, v] for k, v in section["published_s"].items()])
    return out


def headline(section: dict[str, Any]) -> dict[str, float]:
    f = section["fsync"]
    return {"fsync avg us": f["avg_us"], "fsync p99 us": f["p99_us"], "fsync max us": f["max_us"],
            "4096 iterations s": section["per_4096_s"]}

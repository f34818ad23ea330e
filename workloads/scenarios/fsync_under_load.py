"""Seed experiment 2 (Park, Kim & Shin): fsync latency under background writes, by queue depth.

The `small` thread writes FSYNC_BYTES and fsync()s every FSYNC_PERIOD_US
(first after one period, so every fsync meets the load), while WRITERS
threads append APPEND_BYTES every APPEND_PERIOD_US to their own files. Every
FLUSH_EVERY appends a writer starts asynchronous writeback of its file with
sync_file_range(WRITE): the kernel's flusher would only start after
dirty_expire_centisecs (30 s), longer than a scaled-down run, and it is these
async writes that fill the device queue in front of the fsync. The paper's
load is 4 KB async writes queued in the device, so by default each append
goes to the device on its own (FLUSH_EVERY 1). In 1 MiB bursts (256) the
queue holds a few large requests and its depth hardly matters
(docs/device-profiles.md). A writer's
file is reopened with O_TRUNC after CYCLE_BYTES, so the data on the device
stays bounded however long the run.

QUEUE_DEPTH > 0 sets the recorded device's nr_requests (workload
`device.queue`): compare depths with

    powercut run scenario:fsync-under-load --fs ext4 --param-matrix "queue_depth=4;32;128"

The loop device under test takes nr_requests from 4 (the kernel's minimum,
BLKDEV_MIN_RQ: smaller values are raised to 4) to 128 (its tag depth).

Crash points default to flush,fua: thousands of appends carry no durability
promise, and the fsyncs' promises are checked at the flushes they issue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from foundation.mdtable import table
from workloads.results import Results
from workloads.scenarios.common import MIB, count, device_mib, duration_s, group, group_stats, op, repeat, thread, workload

NAME = "fsync-under-load"
SUMMARY = "Park, Kim & Shin: 10 KB write + fsync every 5 s next to 8 appending writers; by queue depth"
RUN_DEFAULTS = {"crash_points": "flush,fua"}
PAPER = "lowering the queue depth when fsync is expected cut fsync latency by 70-79 % with ~5 % bandwidth loss"


@dataclass(frozen=True)
class Params:
    fsyncs: int = 60                    # the small writer's fsyncs
    fsync_period_us: int = 5_000_000    # paper: every 5 s (or 2 s)
    fsync_bytes: int = 10240            # paper: 10 KB
    writers: int = 8                    # paper: 8 threads appending to their own files
    append_bytes: int = 4096            # paper: 4 KB sequential appends
    append_period_us: int = 1000        # each writer appends at most once per ms
    flush_every: int = 1                # appends per sync_file_range(WRITE): 1 = the paper's 4 KB async writes
    cycle_bytes: int = 16 * MIB         # a writer's file is truncated after this much
    queue_depth: int = 0                # nr_requests of the device; 0: the device's default


def params(scale: float) -> Params:
    """The fsync period shrinks with SCALE (5 s -> 50 ms at 0.01); the load's rate does not."""
    p = Params()
    return Params(fsyncs=count(p.fsyncs, scale, minimum=4), fsync_period_us=max(10_000, round(p.fsync_period_us * scale)))


def _writer(i: int, p: Params, appends: int) -> dict[str, Any]:
    bursts = math.ceil(appends / p.flush_every)
    per_cycle = max(1, p.cycle_bytes // (p.flush_every * p.append_bytes))  # bursts per file cycle
    burst = repeat(min(bursts, per_cycle), [
        repeat(p.flush_every, [op("write", f"bg.append:{i}", fd="w", length=p.append_bytes)], p.append_period_us),
        op("sync_file_range", f"bg.flush:{i}", fd="w", offset=0, length=0, flags=["WRITE"]),
    ])
    return thread(f"writer{i}", [
        op("barrier", name="go"),
        repeat(math.ceil(bursts / per_cycle), [
            op("open", path=f"bg-{i}.dat", flags=["O_CREAT", "O_WRONLY", "O_TRUNC", "O_APPEND"], fd="w"),
            burst,
            op("close", fd="w"),
        ]),
    ])


def generate(p: Params) -> dict[str, Any]:
    small = thread("small", [
        op("open", path="small.dat", flags=["O_CREAT", "O_WRONLY", "O_APPEND"], fd="s"),
        op("barrier", name="go"),
        op("sleep", us=p.fsync_period_us),
        repeat(p.fsyncs, [op("write", "small.write", fd="s", length=p.fsync_bytes),
                          op("fsync", "small.fsync", fd="s")], p.fsync_period_us, "small.period"),
        op("close", fd="s"),
    ])
    appends = math.ceil((p.fsyncs + 1) * p.fsync_period_us / p.append_period_us)  # as long as the small writer
    live = p.writers * min(p.cycle_bytes, appends * p.append_bytes) + p.fsyncs * p.fsync_bytes
    device: dict[str, Any] = {"size_mib": device_mib(live)}
    if p.queue_depth:
        device["queue"] = {"nr_requests": p.queue_depth}
    return workload(NAME, SUMMARY, [small, *(_writer(i, p, appends) for i in range(p.writers))], device=device)


def analyze(results: Results, p: Params, facts: dict[str, Any]) -> dict[str, Any]:
    fsync = group_stats(results, "small.fsync")
    appends = [r for r in group(results, "bg.append") if r.ret > 0]
    span = duration_s(appends)
    return {
        "queue_depth": facts.get("device_tuning", {}).get("queue/nr_requests", "device default"),
        "fsync": {k: fsync[k] for k in ("count", "avg_us", "p50_us", "p99_us", "max_us")},
        "small_write_avg_us": group_stats(results, "small.write")["avg_us"],
        "append": {k: v for k, v in group_stats(results, "bg.append").items() if k in ("count", "avg_us", "max_us")},
        "flush_avg_us": group_stats(results, "bg.flush")["avg_us"],
        "background_mib_s": round(sum(r.ret for r in appends) / span / MIB, 2) if span else 0.0,
        "paper": PAPER,
    }


def render(section: dict[str, Any]) -> list[str]:
    f, a = section["fsync"], section["append"]
    return [*table(["queue depth (nr_requests)", "fsyncs", "fsync avg us", "fsync p50 us", "fsync p99 us",
                    "fsync max us", "background MiB/s", "append avg us", "append max us",
                    "sync_file_range(WRITE) avg us"],
                   [[section["queue_depth"], f["count"], f["avg_us"], f["p50_us"], f["p99_us"], f["max_us"],
                     section["background_mib_s"], a["avg_us"], a["max_us"], section["flush_avg_us"]]]),
            "", f"The paper: {section['paper']}."]


def headline(section: dict[str, Any]) -> dict[str, float]:
    f = section["fsync"]
    return {"fsync avg us": f["avg_us"], "fsync p99 us": f["p99_us"], "fsync max us": f["max_us"],
            "background MiB/s": section["background_mib_s"]}

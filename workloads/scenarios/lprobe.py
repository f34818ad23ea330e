"""Seed experiment 5 (Zecchini & Valente): write() latency of a read-mostly app.

The `probe` thread reads PROBE_BYTES of a file READ_BYTES at a time and
issues one asynchronous (buffered, never synced) WRITE_BYTES write() per
READS_PER_WRITE reads, while a `reader` thread reads another file and a
`writer` thread writes a third one sequentially, BG_BLOCK at a time, as the
paper's two dd processes did. The files read are written and fsync()ed
first, then read with O_DIRECT (direct_reads=1): the paper's phone read them
from flash, not from the page cache.

The paper's write() stalls came from dirty-page throttling, the journal and
writeback. DIRTY_LIMIT_BYTES > 0 gives the recorded device a strict dirty
limit of its own (bdi strict_limit + max_bytes, workload `device.bdi`), so
throttling happens on a small device without touching the machine's
vm.dirty_* settings, which the report prints as they were.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from foundation.mdtable import table
from workloads.results import Results
from workloads.scenarios.common import MIB, device_mib, group, group_stats, op, repeat, size, thread, workload

NAME = "lprobe"
SUMMARY = "Zecchini & Valente: 4 KB reads with one async 4 KB write per 10, next to dd reader + writer"
RUN_DEFAULTS: dict[str, str] = {}
# Latency buckets of the write distribution, in microseconds (upper bounds).
BUCKETS_US = (100, 1000, 10_000, 100_000, 300_000)


@dataclass(frozen=True)
class Params:
    probe_bytes: int = 200 * MIB     # paper: ~200 MB read
    read_bytes: int = 4096
    reads_per_write: int = 10
    write_bytes: int = 4096
    bg_bytes: int = 200 * MIB        # what the background reader and writer each move
    bg_block: int = MIB
    direct_reads: int = 1
    slow_us: int = 300_000           # paper: the probe printed every write over 300 ms
    dirty_limit_bytes: int = 0       # > 0: strict per-device dirty limit


def params(scale: float) -> Params:
    p = Params()
    return Params(probe_bytes=size(p.probe_bytes, scale, p.read_bytes * p.reads_per_write),
                  bg_bytes=size(p.bg_bytes, scale, p.bg_block))


def _fill(path: str, fd: str, nbytes: int, block: int) -> list[dict[str, Any]]:
    """Create PATH with at least NBYTES, written BLOCK at a time, durable."""
    return [op("open", path=path, flags=["O_CREAT", "O_WRONLY", "O_TRUNC"], fd=fd),
            repeat(math.ceil(nbytes / block), [op("write", fd=fd, length=block)]),
            op("fsync", fd=fd), op("close", fd=fd)]


def generate(p: Params) -> dict[str, Any]:
    rflags = ["O_RDONLY"] + (["O_DIRECT"] if p.direct_reads else [])
    reads = p.probe_bytes // p.read_bytes
    probe = thread("probe", [
        *_fill("probe.dat", "f", p.probe_bytes, p.bg_block), *_fill("bg-in.dat", "f", p.bg_bytes, p.bg_block),
        op("open", path="probe.dat", flags=rflags, fd="r"),
        op("open", path="probe-out.dat", flags=["O_CREAT", "O_WRONLY", "O_APPEND"], fd="w"),
        op("barrier", name="go"),
        repeat(max(1, reads // p.reads_per_write), [
            repeat(p.reads_per_write, [op("read", "probe.read", fd="r", length=p.read_bytes)]),
            op("write", "probe.write", fd="w", length=p.write_bytes),
        ]),
        op("close", fd="r"), op("close", fd="w"),
    ])
    blocks = max(1, p.bg_bytes // p.bg_block)
    reader = thread("reader", [
        op("barrier", name="go"), op("open", path="bg-in.dat", flags=rflags, fd="r"),
        repeat(blocks, [op("read", "bg.read", fd="r", length=p.bg_block)]), op("close", fd="r"),
    ])
    writer = thread("writer", [
        op("barrier", name="go"),
        op("open", path="bg-out.dat", flags=["O_CREAT", "O_WRONLY", "O_TRUNC"], fd="w"),
        repeat(blocks, [op("write", "bg.write", fd="w", length=p.bg_block)]), op("close", fd="w"),
    ])
    device: dict[str, Any] = {"size_mib": device_mib(p.probe_bytes * 2 + p.bg_bytes * 2)}
    if p.dirty_limit_bytes:
        device["bdi"] = {"strict_limit": 1, "max_bytes": p.dirty_limit_bytes}
    return workload(NAME, SUMMARY, [probe, reader, writer], device=device)


def analyze(results: Results, p: Params, facts: dict[str, Any]) -> dict[str, Any]:
    writes = group(results, "probe.write")
    us = [r.duration_ns / 1000 for r in writes]
    bounds = (0, *BUCKETS_US)
    buckets = {f"{lo / 1000:g}-{hi / 1000:g} ms": sum(lo <= u < hi for u in us) for lo, hi in zip(bounds, BUCKETS_US)}
    buckets[f">= {BUCKETS_US[-1] / 1000:g} ms"] = sum(u >= BUCKETS_US[-1] for u in us)
    slow = [r for r in writes if r.duration_ns >= p.slow_us * 1000]
    w = group_stats(results, "probe.write")
    return {
        "writes": {k: w[k] for k in ("count", "avg_us", "p50_us", "p99_us", "p999_us", "max_us")},
        "reads_avg_us": group_stats(results, "probe.read")["avg_us"],
        "slow_us": p.slow_us,
        "slow_writes": len(slow),
        "slow_write_times": [{"t_s": round((r.start_ns - results.start_ns) / 1e9, 3), "ms": round(r.duration_ns / 1e6, 1)}
                             for r in slow[:100]],
        "distribution": buckets,
        "sysctls": facts.get("sysctls", {}),
        "device_tuning": facts.get("device_tuning", {}),
    }


def render(section: dict[str, Any]) -> list[str]:
    w = section["writes"]
    out = table(["probe writes", "avg us", "p50 us", "p99 us", "p99.9 us", "max us", f"over {section['slow_us'] / 1000:g} ms",
                 "probe read avg us"],
                [[w["count"], w["avg_us"], w["p50_us"], w["p99_us"], w["p999_us"], w["max_us"], section["slow_writes"],
                  section["reads_avg_us"]]])
    out += ["", "Write latency distribution:", "", *table(list(section["distribution"]), [list(section["distribution"].values())])]
    if section["slow_write_times"]:
        out += ["", "Slow writes (as the probe printed them): " +
                ", ".join(f"{s['ms']} ms at {s['t_s']} s" for s in section["slow_write_times"])]
    settings = {**section["sysctls"], **section["device_tuning"]}
    out += ["", "Writeback settings in force: " + (", ".join(f"{k} = {v}" for k, v in settings.items()) or "unknown")]
    return out


def headline(section: dict[str, Any]) -> dict[str, float]:
    w = section["writes"]
    return {"write avg us": w["avg_us"], "write p99 us": w["p99_us"], "write max us": w["max_us"],
            f"writes over {section['slow_us'] / 1000:g} ms": section["slow_writes"]}

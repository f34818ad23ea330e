"""Seed experiment 3 (Okabayashi): interleaved constant-rate recording streams.

STREAMS threads each write one RECORD_BYTES record (564 KiB, O_DIRECT as in
the paper) every PERIOD_US to their own file, all at once, so the file
system allocates their blocks interleaved. Two phases: `plain` (no
pre-allocation) and `fallocate` (each stream first fallocate()s its whole
recording with FALLOC_FL_KEEP_SIZE). At the end of a phase each stream
fsync()s its file and counts its extents (the fiemap op: FIEMAP, counted
as filefrag counts them); then the first thread syncs and removes the files
one by one: the unlink ops are the removal times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from foundation.mdtable import table
from workloads.results import Results
from workloads.scenarios.common import device_mib, count, group, group_stats, op, repeat, thread, workload

NAME = "recording-streams"
SUMMARY = "Okabayashi: 6 interleaved constant-rate O_DIRECT writers, without and with fallocate; extents, removal time"
RUN_DEFAULTS: dict[str, str] = {}
PHASES = ("plain", "fallocate")
PAPER = ("fallocate reduces fragmentation; on xfs and btrfs removal time drops with fragmentation; "
         "ext4 mount does journal recovery that took ~1 s with 1000 files")


@dataclass(frozen=True)
class Params:
    streams: int = 6
    records: int = 200              # records per stream and phase
    record_bytes: int = 564 * 1024  # paper: 564 KB records
    period_us: int = 20000          # one record per stream every 20 ms (28 MB/s each)
    direct: int = 1                 # paper: O_DIRECT


def params(scale: float) -> Params:
    return Params(records=count(Params().records, scale, minimum=8))


def _path(ph: str, i: int) -> str:
    return f"{ph}-{i}.dat"


def generate(p: Params) -> dict[str, Any]:
    flags = ["O_CREAT", "O_WRONLY"] + (["O_DIRECT"] if p.direct else [])
    threads = []
    for i in range(p.streams):
        ops: list[dict[str, Any]] = []
        for ph in PHASES:
            ops += [op("barrier", name="phase"), op("open", path=_path(ph, i), flags=flags, fd="s")]
            if ph == "fallocate":
                ops.append(op("fallocate", f"{ph}.fallocate:{i}", fd="s", mode=["KEEP_SIZE"], offset=0,
                              length=p.records * p.record_bytes))
            ops += [
                op("barrier", name="go"),
                repeat(p.records, [op("write", f"{ph}.write:{i}", fd="s", length=p.record_bytes)], p.period_us),
                op("fsync", f"{ph}.fsync:{i}", fd="s"),
                op("fiemap", f"{ph}.extents:{i}", fd="s", sync=True),
                op("close", fd="s"),
                op("barrier", name="written"),
            ]
            if i == 0:  # one remover, file after file, as `rm` does
                ops += [op("sync", f"{ph}.sync"), *(op("unlink", f"{ph}.unlink:{k}", path=_path(ph, k))
                                                    for k in range(p.streams))]
        threads.append(thread(f"stream{i}", ops))
    return workload(NAME, SUMMARY, threads, device={"size_mib": device_mib(p.streams * p.records * p.record_bytes)})


def analyze(results: Results, p: Params, facts: dict[str, Any]) -> dict[str, Any]:
    phases = {}
    for ph in PHASES:
        extents = [r.ret for r in sorted(group(results, f"{ph}.extents"), key=lambda r: r.op_id or "") if r.ret >= 0]
        unlinks = group(results, f"{ph}.unlink")
        write = group_stats(results, f"{ph}.write")
        phases[ph] = {
            "extents_per_file": extents,
            "extents_avg": round(sum(extents) / len(extents), 1) if extents else 0.0,
            "extents_max": max(extents, default=0),
            "removal_total_ms": round(sum(r.duration_ns for r in unlinks) / 1e6, 3),
            "removal_max_ms": round(max((r.duration_ns for r in unlinks), default=0) / 1e6, 3),
            "write_avg_us": write["avg_us"], "write_p99_us": write["p99_us"], "write_max_us": write["max_us"],
            "write_errors": write["errors"],
        }
    return {"streams": p.streams, "records": p.records, "record_bytes": p.record_bytes, "phases": phases, "paper": PAPER}


def render(section: dict[str, Any]) -> list[str]:
    rows = [[ph, ", ".join(map(str, r["extents_per_file"])), r["extents_avg"], r["removal_total_ms"],
             r["removal_max_ms"], r["write_avg_us"], r["write_p99_us"], r["write_max_us"]]
            for ph, r in section["phases"].items()]
    return [f"{section['streams']} streams x {section['records']} records of {section['record_bytes']} bytes.", "",
            *table(["phase", "extents per file", "extents avg", "removal total ms", "removal max ms",
                    "write avg us", "write p99 us", "write max us"], rows),
            "", f"The paper: {section['paper']}."]


def headline(section: dict[str, Any]) -> dict[str, float]:
    return {f"{ph} {k.replace('_', ' ')}": r[k] for ph, r in section["phases"].items()
            for k in ("extents_avg", "removal_total_ms", "write_avg_us")}

"""What the scenario generators share: scaling, document builders, record selection."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from workloads.stats import stats
from workloads.format import FORMAT
from workloads.results import OpRecord, Results

MIB = 1 << 20
BLOCK = 4096
# Room for the file system's own metadata and journal on top of the data a
# workload keeps, in MiB: ext4's journal alone is up to 64 MiB on big devices.
FS_OVERHEAD_MIB = 32
# Op ids are "<group>:<index>" (e.g. "quiet.write:3"): analyses select by group.
ID_SEP = ":"


def count(n: int, scale: float, minimum: int = 1) -> int:
    """A count of the paper's N at SCALE."""
    return max(minimum, round(n * scale))


def size(n: int, scale: float, unit: int = BLOCK) -> int:
    """A size of the paper's N bytes at SCALE, in whole UNITs (at least one)."""
    return max(unit, round(n * scale / unit) * unit)


def device_mib(data_bytes: int) -> int:
    """Device size for a workload that has DATA_BYTES on the file system at its peak."""
    return math.ceil(data_bytes * 1.25 / MIB) + FS_OVERHEAD_MIB


def op(kind: str, op_id: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"op": kind, **({"id": op_id} if op_id else {}), **fields}


def repeat(count: int, ops: Sequence[dict[str, Any]], period_us: int | None = None,
           op_id: str | None = None) -> dict[str, Any]:
    return op("repeat", op_id, count=count, ops=list(ops), **({"period_us": period_us} if period_us else {}))


def thread(name: str, ops: Sequence[dict[str, Any]], policy: str = "other", priority: int = 0,
           nice: int = 0) -> dict[str, Any]:
    return {"name": name, "sched": {"policy": policy, "priority": priority, "nice": nice}, "ops": list(ops)}


def workload(name: str, description: str, threads: Sequence[dict[str, Any]], **sections: Any) -> dict[str, Any]:
    """A powercut-workload/1 document; SECTIONS are its optional top-level fields (device, invariants...)."""
    return {"format": FORMAT, "name": name, "description": description, "threads": list(threads), **sections}


def group(results: Results, name: str) -> list[OpRecord]:
    """The records of every op whose id is in group NAME ("NAME:<index>" or "NAME")."""
    return [r for r in results.records if r.op_id and r.op_id.partition(ID_SEP)[0] == name]


def group_stats(results: Results, name: str) -> dict[str, Any]:
    """count, avg/p50/p99/p999/max (us) of group NAME's ops."""
    return stats(group(results, name))


def duration_s(records: Sequence[OpRecord]) -> float:
    """From the first start to the last end of RECORDS, in seconds."""
    if not records:
        return 0.0
    return (max(r.end_ns for r in records) - min(r.start_ns for r in records)) / 1e9

"""Latency of a run: per op kind (overall and per thread) statistics from the
executor's records, and the latency budgets of the workload they violate."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workloads.format import Budget, Workload
from workloads.plan import build_plan
from workloads.results import OpRecord, Results
from workloads.stats import ns_to_us, rank_us, stats

def _by_kind(records: Iterable[OpRecord], workload: Workload) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[OpRecord]] = {}
    for r in records:
        groups.setdefault(r.kind, []).append(r)
    return {k: stats(rs, workload.budgets.get(k)) for k, rs in sorted(groups.items())}


def _repeats(results: Results, workload: Workload) -> dict[str, dict[str, Any]]:
    """Each periodic repeat (by op id, else "seq N"): how its iterations kept time."""
    out = {}
    by_seq: dict[int, list[OpRecord]] = {}  # one pass: a scale-1.0 run has millions of records
    for r in results.records:
        by_seq.setdefault(r.seq, []).append(r)
    for t, op in build_plan(workload).ops():
        period = op.fields.get("period_us") if op.kind == "repeat" else 0
        if not period:
            continue
        its = by_seq.get(op.seq, [])
        late = sorted(r.aux for r in its)  # a repeat record's aux: its lateness
        out[op.id or f"seq {op.seq}"] = {
            "thread": t.name,
            "period_us": period,
            "iterations": len(its),
            "deadline_misses": sum(r.deadline_miss for r in its),
            "p99_late_us": rank_us(late, 99),
            "max_late_us": rank_us(late, 100),
        }
    return out


def _between_ops(results: Results) -> dict[str, Any]:
    """How long pc-exec itself takes between two ops of a thread (pattern fill,
    the mark write): never inside a measured latency, but it delays the next op."""
    gaps: list[int] = []
    last_end: dict[int, int] = {}  # per thread, in one pass: each thread's records are in start order
    for r in results.records:
        if r.kind == "repeat":  # an iteration starts after its period sleep: not the executor's time
            last_end[r.thread] = r.start_ns
            continue
        if r.thread in last_end:
            gaps.append(r.start_ns - last_end[r.thread])
        last_end[r.thread] = r.end_ns
    gaps.sort()
    return {"count": len(gaps), "p50_us": rank_us(gaps, 50), "p99_us": rank_us(gaps, 99),
            "max_us": rank_us(gaps, 100)}


def summarize(results: Results, workload: Workload) -> dict[str, Any]:
    """Statistics per op kind, overall ("kinds") and per thread name ("threads").

    Each: count (ops that ran), errors (of those, failed), skipped (fd never
    opened), avg/p50/p99/p999/max in microseconds, deadline_misses (repeat
    iterations), budget_violations (ops over max_us, plus one if p99 > p99_us).
    "repeats" tells how each periodic repeat kept time. The executor's own
    cost: "overhead_ns" is its two clock reads, inside every measured
    latency; "between_ops" its work between two ops of a thread.
    """
    per_thread: dict[int, list[OpRecord]] = {}
    for r in results.records:
        per_thread.setdefault(r.thread, []).append(r)
    return {
        "overhead_ns": {"min": results.overhead_min_ns, "median": results.overhead_median_ns},
        "between_ops": _between_ops(results),
        "duration_us": ns_to_us(results.end_ns - results.start_ns),
        "deadline_misses": sum(r.deadline_miss for r in results.records),
        "repeats": _repeats(results, workload),
        "kinds": _by_kind(results.records, workload),
        "threads": {
            name: _by_kind(per_thread.get(i, []), workload)
            for i, name in enumerate(results.thread_names)
        },
    }


def findings(summary: dict[str, Any], workload: Workload) -> list[dict[str, Any]]:
    """One finding of kind "latency" per violated budget (op kind x max_us/p99_us):
    op, budget, limit_us, measured_us, ops (how many were measured), detail."""
    out = []
    for kind, budget in sorted(workload.budgets.items()):
        stats = summary["kinds"].get(kind)
        if not stats or not stats["count"]:
            continue
        for name in ("max_us", "p99_us"):
            limit, measured = getattr(budget, name), stats[name]
            if limit is None or measured <= limit:
                continue
            out.append({
                "kind": "latency",
                "op": kind,
                "budget": name,
                "limit_us": limit,
                "measured_us": measured,
                "ops": stats["count"],
                "detail": f"{kind}: {name.removesuffix('_us')} latency {measured} us exceeds the budget of {limit} us",
            })
    return out

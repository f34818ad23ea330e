"""Latency statistics of a selection of executor records (scenarios and the
latency checker both summarise with it)."""

from __future__ import annotations

from typing import Any

from hdrh.histogram import HdrHistogram

from workloads.format import Budget
from workloads.results import OpRecord

HIGHEST_NS = 3600 * 10**9  # an hour: longer ops are clamped
SIGNIFICANT_FIGURES = 3    # percentiles to within 0.1 %


def ns_to_us(ns: float) -> float:
    return round(ns / 1000, 3)


def rank_us(ordered: list[int], pct: int) -> float:
    """The PCT-th percentile (nearest rank, exact) of sorted nanoseconds, in microseconds."""
    return ns_to_us(ordered[min(len(ordered) - 1, len(ordered) * pct // 100)]) if ordered else 0.0


def stats(records: list[OpRecord], budget: Budget | None = None) -> dict[str, Any]:
    """Latency statistics of RECORDS (any selection of ops), judged against BUDGET."""
    ran = [r for r in records if not r.skipped]
    hist = HdrHistogram(1, HIGHEST_NS, SIGNIFICANT_FIGURES)
    clamped = sorted(min(max(r.duration_ns, 1), HIGHEST_NS) for r in ran)
    durations = [r.duration_ns for r in ran]
    top = max(durations, default=0)

    def pct(p: float) -> float:  # a bucket's upper bound can pass the true max
        return ns_to_us(min(hdr_percentile(hist, clamped, p), top))

    p99 = pct(99)
    over_max = 0
    if budget and budget.max_us is not None:
        over_max = sum(d > budget.max_us * 1000 for d in durations)
    over_p99 = int(bool(ran and budget and budget.p99_us is not None and p99 > budget.p99_us))
    return {
        "count": len(ran),
        "errors": sum(r.errno != 0 for r in ran),
        "skipped": len(records) - len(ran),
        "avg_us": ns_to_us(sum(durations) / len(ran)) if ran else 0.0,
        "p50_us": pct(50),
        "p99_us": p99,
        "p999_us": pct(99.9),
        "max_us": ns_to_us(top),
        "deadline_misses": sum(r.deadline_miss for r in records),
        "budget_violations": over_max + over_p99,
    }


def hdr_percentile(hist: HdrHistogram, ordered: list[int], p: float) -> int:
    """HdrHistogram.get_value_at_percentile(P) of a histogram of the sorted values ORDERED, without
    walking its buckets (pure Python, O(buckets) per call: seconds for ms-long ops): the value at the
    same target rank, reported as its bucket's highest equivalent value, exactly as hdrh does."""
    if not ordered:
        return 0
    target = max(int(min(p, 100.0) * len(ordered) / 100 + 0.5), 1)
    value = ordered[min(target, len(ordered)) - 1]
    return int(hist.get_highest_equivalent_value(value) if p else hist.get_lowest_equivalent_value(value))

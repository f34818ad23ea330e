"""Latency percentiles: the fast path gives exactly what HdrHistogram's bucket walk gives."""

from __future__ import annotations

import random

from hdrh.histogram import HdrHistogram

from workloads.stats import HIGHEST_NS, SIGNIFICANT_FIGURES, hdr_percentile


def test_fast_percentiles_equal_hdrhistogram_walk() -> None:
    rng = random.Random(7)
    for _ in range(200):
        values = [min(max(int(rng.lognormvariate(rng.uniform(5, 20), 2)), 1), HIGHEST_NS)
                  for _ in range(rng.randint(1, 50))]
        hist = HdrHistogram(1, HIGHEST_NS, SIGNIFICANT_FIGURES)
        for v in values:
            hist.record_value(v)
        for p in (0, 1, 50, 99, 99.9, 100):
            assert hdr_percentile(hist, sorted(values), p) == hist.get_value_at_percentile(p)
    assert hdr_percentile(HdrHistogram(1, HIGHEST_NS, SIGNIFICANT_FIGURES), [], 99) == 0

"""Latency figures show their data: one sample is a visible point, not an empty frame."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.reports import plots


def _drawn_in_axes(png: Path) -> int:
    """Pixels of the curve's colour (matplotlib's first, tab:blue) inside the axes, legend aside
    (a one-curve legend's box: lower right in a CDF, upper right over time)."""
    from matplotlib.image import imread
    img = (imread(str(png))[..., :3] * 255).round().astype(int)
    h, w = img.shape[:2]
    m = plots.MARGINS
    # the axes' area (its frame is black) without the legend's corner
    x0, x1 = int(w * m["left"]), int(w * m["right"])
    y0, y1 = int(h * (1 - m["top"])), int(h * (1 - m["bottom"]))
    area = img[y0:y1, x0:x1]
    legend = np.zeros(area.shape[:2], dtype=bool)
    rows, cols = int(area.shape[0] * 0.15), int(area.shape[1] * 0.25)
    if png.name.startswith("time"):
        legend[:rows, -cols:] = True
    else:
        legend[-rows:, -cols:] = True
    blue = (abs(area - np.array([31, 119, 180])).sum(axis=2) < 60) & ~legend
    return int(blue.sum())


def test_a_single_sample_is_drawn(tmp_path: Path) -> None:
    one, many = tmp_path / "one.png", tmp_path / "many.png"
    plots.cdf(str(one), "mkdir: latency CDF", {"main": [120.0]})
    plots.cdf(str(many), "x", {"main": list(np.linspace(50, 500, 200))})
    assert _drawn_in_axes(one) > 0, "a CDF of one sample is an empty frame"
    assert _drawn_in_axes(many) > 0
    t = tmp_path / "time-one.png"
    plots.over_time(str(t), "mkdir: latency over time", {"main": ([0.01], [120.0])})
    assert _drawn_in_axes(t) > 0


def test_titles_say_an_emulated_clock() -> None:
    assert "emulated" in plots.titled("fsync: latency CDF", "emulated")
    assert plots.titled("fsync: latency CDF", "host") == "fsync: latency CDF"

"""Latency figures as PNG files: a CDF and latency over time per op kind.

matplotlib's Agg canvas is used directly (no pyplot): no display, no global
figure state, nothing left open between figures.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from workloads.plan import Plan
from workloads.results import Results, read_records

PLOT_DIR = "plots"
# Waits by design, not file-system latency: no figures of their own.
NOT_PLOTTED = frozenset(("barrier", "sleep"))
SIZE_IN = (7.5, 4.2)
DPI = 100
# Fixed margins: tight_layout would measure every label first and cost half the time.
MARGINS = {"left": 0.1, "right": 0.97, "bottom": 0.12, "top": 0.92}

Series = Mapping[str, Sequence[float]]  # curve label -> latencies in microseconds
# A curve of fewer points than this draws each point too: a step curve of one sample is
# an empty frame (its only step has no width), and a handful of steps hide where the samples are.
FEW_POINTS = 50
# What a plot title says of a clock that is not the hardware's (report.json `latency_clock`).
CLOCK_NOTES = {"emulated": "emulated guest clock, not the hardware's", "virtualised": "virtualised guest clock"}


# matplotlib is imported where a figure is drawn: importing it costs a second
# (far more under TCG, see tests/test_dm_guest.py) in runs that draw nothing.
def _figure() -> tuple[Figure, Any]:
    from matplotlib.figure import Figure
    fig = Figure(figsize=SIZE_IN, dpi=DPI)
    fig.subplots_adjust(**MARGINS)
    return fig, fig.add_subplot()


def _plain_log_labels(axis: Any) -> None:
    """Label a log axis with plain numbers (300, not 3x10^2); a narrow range gets minor labels too."""
    from matplotlib.ticker import LogFormatter
    axis.set_major_formatter(LogFormatter())
    axis.set_minor_formatter(LogFormatter(minor_thresholds=(1, 0.5)))


def _save(fig: Figure, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig).print_png(path)


def cdf(path: str, title: str, series: Series, limit_us: float | None = None) -> None:
    """One step curve per label: the fraction of ops at or under each latency (log x axis)."""
    fig, ax = _figure()
    for label, values in series.items():
        xs = np.sort(np.maximum(np.asarray(values, dtype=float), 0.01))  # log axis: no zeros
        marker = "o" if len(xs) < FEW_POINTS else None
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", marker=marker, label=f"{label} (n={len(xs)})")
    if limit_us is not None:
        ax.axvline(limit_us, color="red", linestyle="--", linewidth=1, label=f"budget {limit_us:g} us")
    ax.set(xscale="log", ylim=(0, 1.02), xlabel="latency (us)", ylabel="fraction of ops <= latency", title=title)
    _plain_log_labels(ax.xaxis)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    _save(fig, path)


def over_time(path: str, title: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
              limit_us: float | None = None) -> None:
    """One scatter per label of (seconds since the run started, latency in us), log y axis."""
    fig, ax = _figure()
    for label, (ts, us) in series.items():
        few = len(us) < FEW_POINTS  # a few points must be seen: larger, opaque
        ax.scatter(ts, np.maximum(np.asarray(us, dtype=float), 0.01), s=30 if few else 6, alpha=1.0 if few else 0.6,
                   label=label)
    if limit_us is not None:
        ax.axhline(limit_us, color="red", linestyle="--", linewidth=1, label=f"budget {limit_us:g} us")
    ax.set(yscale="log", xlabel="time since the workload started (s)", ylabel="latency (us)", title=title)
    _plain_log_labels(ax.yaxis)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="upper right", markerscale=2)
    _save(fig, path)


def campaign_progress(path: str, minutes: Sequence[float], shrink: Sequence[bool], states: Sequence[int]) -> None:
    """A campaign over time: workloads (new and shrink runs) and crash states so far (top), and
    per-minute rates (bottom). Each journaled run is a point, so a short campaign shows its few."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(SIZE_IN[0], SIZE_IN[1] * 1.6), dpi=DPI)
    fig.subplots_adjust(left=0.1, right=0.88, bottom=0.08, top=0.94, hspace=0.35)
    top, low = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    t = np.asarray(minutes, dtype=float)
    new = np.cumsum([0 if s else 1 for s in shrink])
    marker = "o" if len(t) < FEW_POINTS else None
    top.step(t, new, where="post", marker=marker, label="workloads")
    top.step(t, np.cumsum([1 if s else 0 for s in shrink]), where="post", marker=marker, label="shrink runs")
    top.set(xlabel="minutes since the start", ylabel="runs so far", title="campaign progress")
    right = top.twinx()
    right.step(t, np.cumsum(states), where="post", color="tab:green", marker=marker, label="crash states")
    right.set(ylabel="crash states so far")
    handles = top.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    top.legend(handles, [str(h.get_label()) for h in handles], fontsize="small", loc="upper left")
    top.grid(True, alpha=0.3)
    # Rates in bins of about a minute that end at the last run (no partial bin drawn as a drop).
    span = max(float(t.max()) if len(t) else 1.0, 1e-3)
    edges = np.linspace(0.0, span, max(1, round(span)) + 1)
    width = np.diff(edges)
    runs, _ = np.histogram(t, bins=edges)
    st, _ = np.histogram(t, bins=edges, weights=np.asarray(states, dtype=float))
    mids = edges[:-1] + width / 2
    low.plot(mids, runs / width, marker="o", label="runs per minute")
    low.plot(mids, st / width / 60, marker="s", label="crash states per second")
    low.set(xlabel="minutes since the start", ylabel="rate", ylim=(0, None))
    low.grid(True, alpha=0.3)
    low.legend(fontsize="small", loc="best")
    _save(fig, path)


def slug(text: str) -> str:
    """TEXT as a file-name part."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def titled(text: str, clock: str) -> str:
    """TEXT as a plot title, with a word on the clock when it is not the host's."""
    return f"{text} ({CLOCK_NOTES[clock]})" if clock in CLOCK_NOTES else text


def latency_plots(results: Results, out_dir: str, limits_us: Mapping[str, float],
                  clock: str = "host") -> dict[str, dict[str, str]]:
    """For each op kind: its CDF and latency-over-time PNGs (one curve per thread) under OUT_DIR/plots.
    LIMITS_US: a budget's max_us per kind, drawn as a line; CLOCK: whose clock measured them
    (harness/reports/report.py latency_clock). Returns kind -> {"cdf", "time"}: paths relative to OUT_DIR."""
    by_kind: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for r in results.records:
        if r.kind in NOT_PLOTTED or r.skipped:
            continue
        ts, us = by_kind.setdefault(r.kind, {}).setdefault(results.thread_names[r.thread], ([], []))
        ts.append((r.start_ns - results.start_ns) / 1e9)
        us.append(r.duration_ns / 1000)
    os.makedirs(os.path.join(out_dir, PLOT_DIR), exist_ok=True)
    files = {}
    for kind, threads in sorted(by_kind.items()):
        rel = {"cdf": os.path.join(PLOT_DIR, f"cdf-{slug(kind)}.png"), "time": os.path.join(PLOT_DIR, f"time-{slug(kind)}.png")}
        cdf(os.path.join(out_dir, rel["cdf"]), titled(f"{kind}: latency CDF", clock),
            {t: v[1] for t, v in threads.items()}, limits_us.get(kind))
        over_time(os.path.join(out_dir, rel["time"]), titled(f"{kind}: latency over time", clock), threads,
                  limits_us.get(kind))
        files[kind] = rel
    return files


class BackgroundPlots:
    """latency_plots of a records file, drawn by a child process while the crash walk runs:
    a figure costs matplotlib about half a second of CPU, and the walk's threads wait on
    mounts and fsck much of the time. The child is a fresh interpreter in its own session
    (a Ctrl-C at the terminal is the parent's to handle, not a traceback of the child's);
    it exits by itself when done, and the parent ends it if the run stops first."""

    def __init__(self, records: str, plan: Plan, out_dir: str, limits_us: Mapping[str, float],
                 clock: str = "host") -> None:
        self._err = tempfile.TemporaryFile()  # a file, not a pipe: nothing to drain while the walk runs
        # OUT_DIR in its command line only names it in ps.
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, out_dir], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._err, start_new_session=True)
        assert self._proc.stdin is not None
        with self._proc.stdin:
            pickle.dump((records, plan, out_dir, dict(limits_us), clock), self._proc.stdin)

    def result(self) -> dict[str, dict[str, str]]:
        """The figures (latency_plots' return value), once drawn."""
        assert self._proc.stdout is not None
        out = self._proc.stdout.read()
        if self._proc.wait() != 0:
            self._err.seek(0)
            err = self._err.read().decode(errors="replace").strip()
            raise RuntimeError(f"latency figures: the plotting process exited {self._proc.returncode}: {err[-2000:]}")
        files: dict[str, dict[str, str]] = json.loads(out)
        return files

    def stop(self) -> None:
        """End the child if it is still drawing (the run was interrupted or failed)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._err.close()


def _child() -> None:
    records, plan, out_dir, limits_us, clock = pickle.load(sys.stdin.buffer)
    json.dump(latency_plots(read_records(records, plan), out_dir, limits_us, clock), sys.stdout)


if __name__ == "__main__":
    _child()

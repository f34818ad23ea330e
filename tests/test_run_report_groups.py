"""A run's report.md through the real stack: findings grouped by violated promise (kind, rule,
the op whose promise broke), each row with its crash states; its latency figures drawn even
for an op kind of one sample; the host's clock named in report.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import WORKLOADS, PcEnv, needs_root_stack
from test_plots import _drawn_in_axes

pytestmark = [pytest.mark.e2e, needs_root_stack]


def test_drop_flush_findings_one_row_per_promise(pc: PcEnv) -> None:
    out = pc.tmp / "run"
    p = pc.run("run", str(WORKLOADS / "rename_fsync.json"), "--fs", "ext4", "--fault", "drop-flush",
               "--out", str(out))
    assert p.returncode == 1, p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["latency_clock"] == "host"
    promises: dict[tuple, list[str]] = {}
    for f in report["findings"]:
        ev = f.get("evidence", {})
        promises.setdefault((f["kind"], ev.get("rule") or "", ev.get("op") or ""), []).append(f["state_id"])
    md = (out / "report.md").read_text()
    section = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == len(promises) < len(report["findings"]), section
    for row, states in zip(rows, promises.values()):
        assert states[0] in row and (len(states) == 1 or states[-1] in row), (row, states)
    # the first state's evidence in full under each row
    assert section.count("\n- detail: ") == len(promises)
    figures = sorted((out / "plots").glob("*.png"))
    assert figures and all(_drawn_in_axes(Path(f)) > 0 for f in figures), [str(f) for f in figures]

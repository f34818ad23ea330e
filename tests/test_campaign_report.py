"""A campaign's report.md through the real stack (fuse backend, the host's ext4): written at a
duration stop and after Ctrl-C, one row per saved finding with its triage, every image it links
drawn; a documented bug saved unshrunk and counted (issue 34 item 4)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import POWERCUT, PcEnv, needs_root_stack

pytestmark = [pytest.mark.e2e, needs_root_stack]

# `--fault drop-flush` drops every cache flush: ext4's journal is then torn at once and a
# campaign saves fsck findings within its first workloads.
FAULT = ("--fs", "ext4", "--fault", "drop-flush", "--jobs", "1", "--shrink-seconds", "30")


def finding_rows(md: str) -> list[str]:
    """The rows of report.md's saved-findings table."""
    section = md.split("## Saved findings", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if re.match(r"\| \[\d{3}-", ln)]


def check_images(out: Path, md: str) -> None:
    """Every image report.md links exists and shows something (more than the frame's colours)."""
    from matplotlib.image import imread
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)
    assert links, md
    for rel in links:
        png = out / rel
        assert png.is_file() and png.stat().st_size > 0, rel
        pixels = imread(str(png))[..., :3].reshape(-1, 3)
        colours = {tuple(p) for p in (pixels * 255).round().astype(int)[::7]}
        # a drawn line or marker (matplotlib's tab: colours) among the frame's greys and white
        assert any(max(c) - min(c) > 60 for c in colours), f"{rel}: nothing coloured drawn"


def check_page(out: Path, report: dict) -> str:
    md = (out / "report.md").read_text()
    rows = finding_rows(md)
    assert len(rows) == len(report["saved_findings"]) == len(list((out / "findings").glob("[0-9]*"))), md
    for s, row in zip(report["saved_findings"], rows):
        assert f"[{s['dir']}](findings/{s['dir']}/)" in row and s["triage"] in row
        assert (out / "findings" / s["dir"] / "reproduce.sh").is_file()
    for rel in re.findall(r"\]\((findings/[^)]+)\)", md):
        assert (out / rel).exists(), rel
    check_images(out, md)
    assert "## Configuration" in md and report["run"]["fs"] in md
    return md


def test_duration_stop_writes_the_page_and_a_documented_bug_costs_no_shrink(pc: PcEnv, tmp_path: Path) -> None:
    # A table of one documented bug whose shape the fault's fsck findings have (the real table's
    # bugs need kernels this host has not): the campaign saves it unshrunk and counts it.
    table = tmp_path / "bugs.json"
    table.write_text(json.dumps({"bugs": [{"id": "planted-fsck", "class": "kernel-bug", "name": "planted: fsck after a "
                                           "dropped flush", "fs": "ext4", "kinds": ["fsck"], "ops": ["open|creat"]}]}))
    env = pc.env(POWERCUT_DOCUMENTED_BUGS=str(table))
    out = pc.tmp / "campaign"
    # Counted, not timed: three workloads (the fault tears ext4's journal in every one) ...
    p = pc.run("fuzz", "--out", str(out), "--seed", "3", *FAULT, "--max-workloads", "3", "--duration", "20m",
               env=env, timeout=900)
    assert p.returncode == 1, p.stdout + p.stderr
    assert json.loads((out / "report.json").read_text())["stop_reason"] == "max-workloads"
    # ... then a session the duration stops: its page has the first session's findings, whatever
    # this one managed to run.
    p = pc.run("fuzz", "--resume", str(out), "--jobs", "1", "--duration", "1s", env=env, timeout=900)
    assert p.returncode == 1, p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["stop_reason"] == "duration" and report["latency_clock"] == "host"
    md = check_page(out, report)
    fsck = [s for s in report["saved_findings"] if s["kind"] == "fsck"]
    # saved once, however many fsck lines (signatures) of it the workloads showed
    assert len(fsck) == 1, report["saved_findings"]
    journal = [json.loads(ln) for j in (out / "journal").glob("*.jsonl") for ln in j.read_text().splitlines()]
    with_fsck = [e for e in journal if not e.get("shrink") and e.get("kinds", {}).get("fsck")]
    assert report["known_bug_hits"] == {"planted-fsck": len(with_fsck)}
    for s in fsck:
        info = json.loads((out / "findings" / s["dir"] / "finding.json").read_text())
        assert info["shrink"]["runs"] == 0 and info["shrink"]["known_bug"] == "planted-fsck", info["shrink"]
        assert info["triage"]["bug"] == "planted-fsck" and "planted-fsck" in s["triage"]
    # one triage line per saved finding at the end of the campaign
    assert p.stdout.count("    triage: ") == len(report["saved_findings"]), p.stdout
    assert "planted-fsck" in md.split("## Documented bugs hit", 1)[1]
    # the same matcher in the bug report
    e = pc.run("export", str(out / "findings" / fsck[0]["dir"]), "--format", "report", "--out", str(tmp_path / "x"),
               env=pc.env(POWERCUT_DOCUMENTED_BUGS=str(table)), check_rc=0)
    assert "Triage: documented kernel bug planted-fsck" in (tmp_path / "x" / f"{fsck[0]['dir']}.md").read_text(), e.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_leave_the_page_too(pc: PcEnv, sig: signal.Signals) -> None:
    out = pc.tmp / "campaign"
    proc = subprocess.Popen([*POWERCUT, "fuzz", "--out", str(out), "--seed", "5", *FAULT, "--duration", "20m"],
                            cwd=pc.tmp, env=pc.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not list(out.glob("findings/[0-9]*/finding.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "no finding saved"
        time.sleep(0.2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130, stdout + stderr
    report = json.loads((out / "report.json").read_text())
    assert report["stop_reason"] == "interrupted" and report["saved_findings"]
    check_page(out, report)
    assert not pc.leftovers()

"""Exit codes mean one thing: 0 nothing found, 1 findings, 2 usage or environment
error (one line), 3 internal error (one line, the traceback in OUT/error.txt or,
for a command without an output directory, in a file the line names)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WORKLOADS, PcEnv, needs_root_stack

CLEAN = {"format": "powercut-workload/1", "name": "one-fsync", "threads": [{"name": "main", "ops": [
    {"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"},
    {"op": "pwrite", "fd": "f", "offset": 0, "length": 4096},
    {"op": "fsync", "fd": "f"}, {"op": "close", "fd": "f"}]}]}
FAST = ["--crash-points", "flush", "--reorder", "none", "--jobs", "1"]


def _workload(pc: PcEnv) -> str:
    path = pc.tmp / "clean.json"
    path.write_text(json.dumps(CLEAN))
    return str(path)


def _with_planted_bug(pc: PcEnv, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`powercut ARGS` in a real process whose TARGET (module.attribute) raises: a stand-in for a bug."""
    module, attr = target.rsplit(".", 1)
    code = (f"import sys, importlib\n"
            f"def boom(*a, **k):\n    raise RuntimeError('planted bug')\n"
            f"setattr(importlib.import_module({module!r}), {attr!r}, boom)\n"
            f"from cli.main import main\n"
            f"sys.exit(main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=pc.tmp,
                          env=pc.env(), timeout=600)


@pytest.mark.e2e
@needs_root_stack
def test_0_nothing_found_and_1_findings(pc: PcEnv) -> None:
    pc.run("run", _workload(pc), "--fs", "ext4", "--out", str(pc.tmp / "clean"), *FAST, check_rc=0)
    # Freed blocks reused under data=writeback show the deleted file's data: a stale-data finding.
    p = pc.run("run", str(WORKLOADS / "stale_writeback.json"), "--fs", "ext4", "--size", "32",
               "--mount-opts", "data=writeback,nodelalloc", "--out", str(pc.tmp / "stale"), check_rc=1)
    assert "stale-data" in p.stdout
    assert pc.leftovers() == []


def test_2_usage_error_is_one_line(pc: PcEnv) -> None:
    p = pc.run("run", str(pc.tmp / "missing.json"), "--fs", "ext4", check_rc=2)
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("powercut: "), p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.e2e
@needs_root_stack
def test_3_internal_error_one_line_traceback_in_out_and_teardown(pc: PcEnv) -> None:
    """A bug in the middle of the crash walk's bookkeeping (the mounts and loop devices are live)."""
    out = pc.tmp / "out"
    p = _with_planted_bug(pc, "harness.pipeline.run.finish", "run", _workload(pc), "--fs", "ext4",
                          "--out", str(out), *FAST)
    assert p.returncode == 3, p
    # Progress lines aside, one line; no traceback on the terminal.
    said = [line for line in p.stderr.splitlines() if not line.startswith("checking ")]
    assert said == [f"powercut: internal error: RuntimeError: planted bug (traceback: {out}/error.txt)"], p.stderr
    text = (out / "error.txt").read_text()
    assert text.startswith("Traceback") and "planted bug" in text and "in _check" in text
    assert pc.leftovers() == []  # torn down as always


@pytest.mark.e2e
@needs_root_stack
def test_a_campaign_whose_only_worker_died_did_not_exhaust_its_space(pc: PcEnv) -> None:
    """An exhaustive campaign's one worker dies of a bug before its first workload: exit 3,
    and the report says the workers exited, not that the space was done."""
    out = pc.tmp / "c"
    p = _with_planted_bug(pc, "fuzz.worker.run_doc", "fuzz", "--fs", "ext4", "--engine", "exhaustive", "--seq", "1",
                          "--jobs", "1", "--duration", "10m", "--out", str(out))
    assert p.returncode == 3, p
    report = json.loads((out / "report.json").read_text())
    assert report["failed_workers"] and report["workloads"] == 0, report
    assert report["stop_reason"] == "workers-exited", report["stop_reason"]
    assert pc.leftovers() == []


def test_3_internal_error_without_an_output_dir_names_the_file(pc: PcEnv, tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"")
    p = _with_planted_bug(pc, "cli.replay_log.LogReader", "replay-log", "--log", str(log))
    assert p.returncode == 3, p
    [line] = p.stderr.splitlines()
    m = re.fullmatch(r"powercut: internal error: RuntimeError: planted bug \(traceback: (/.*\.txt)\)", line)
    assert m, line
    saved = Path(m[1])
    try:
        assert saved.name.startswith("powercut-error-") and "planted bug" in saved.read_text()
    finally:
        saved.unlink()


"""`powercut log dump` and `replay-log --fsck` on a log the FUSE recorder wrote for a real
ext4 run (the synthetic logs of test_logformat.py are hand-made; this one is the kernel's).

Expected values come from outside the log code: the workload file (which ops ran, so which
executor marks), the run's report, and e2fsck's verdict on the replayed image.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import WORKLOADS, require_root_stack
from conftest import PcEnv

pytestmark = [pytest.mark.e2e, require_root_stack]


def test_log_dump_and_replay_with_a_real_fsck(pc: PcEnv) -> None:
    out = pc.tmp / "run"
    pc.run("run", str(WORKLOADS / "fsync_then_more.json"), "--fs", "ext4", "--reorder", "none", "--out", str(out),
           check_rc=0)
    r = json.loads((out / "report.json").read_text())
    log = str(out / "recording.log")

    # log dump: one line per entry in index order, the executor's mark before each op of the workload
    header, *lines = pc.run("log", "dump", log, check_rc=0).stdout.splitlines()
    assert f"nr_entries={r['log_entries']}" in header
    assert [int(line.split()[0]) for line in lines] == list(range(r["log_entries"]))
    ops = [o for t in json.loads((out / "workload.json").read_text())["threads"] for o in t["ops"]]
    marks = [line.split('mark="')[1].rstrip('"') for line in lines if "flags=MARK" in line]
    assert [m for m in marks if m.startswith("op ")] == [f"op 0.{k}.0" for k in range(len(ops))], marks
    assert marks[0] == "pc:mkfs-done" and marks[-1] == "dm-log-writes-end"

    # replay-log --check N --fsck CMD, with e2fsck itself: the whole log is a clean, unmounted ext4
    img, size = pc.tmp / "replayed.img", str(r["device_bytes"])
    n = r["log_entries"]
    p = pc.run("replay-log", "--log", log, "--replay", str(img), "--size", size, "--check", str(n),
               "--fsck", f"e2fsck -fn {img}")
    assert p.returncode == 0, p.stdout + p.stderr
    # ... and two entries in, mkfs has not written a superblock yet: e2fsck fails, replay-log exits 1
    early = pc.tmp / "early.img"
    p = pc.run("replay-log", "--log", log, "--replay", str(early), "--size", size, "--check", "2",
               "--fsck", f"e2fsck -fn {early}")
    assert p.returncode == 1 and "fsck failed after entry 1" in p.stderr, p.stdout + p.stderr
    assert pc.leftovers() == []

"""`powercut fuzz` end to end through the real stack: campaigns on healthy and
known-unsafe set-ups, shrunk findings with reproduce.sh, Ctrl-C and resume,
the exhaustive seq-1 space, AFL++ with its own feedback.

Kept to a few minutes on 2 cores; long campaigns are `make soak`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from common import require_afl
from conftest import POWERCUT, ROOT, WORKLOADS, PcEnv, needs_root_stack
from workloads import exhaustive

pytestmark = [pytest.mark.e2e, needs_root_stack]
needs_afl = require_afl


def campaign(pc: PcEnv, *args: str, rc: int, timeout: float = 600) -> tuple[dict, Path, str]:
    out = pc.tmp / "campaign"
    p = pc.run("fuzz", "--out", str(out), "--seed", "1", *args, timeout=timeout)
    assert p.returncode == rc, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads((out / "report.json").read_text()), out, p.stdout + p.stderr


def saved_finding(out: Path, kind: str) -> tuple[Path, dict]:
    dirs = sorted((out / "findings").glob(f"*-{kind}"))
    assert dirs, f"no {kind} finding saved in {out}/findings"
    return dirs[0], json.loads((dirs[0] / "finding.json").read_text())


def check_reproduces(pc: PcEnv, d: Path, kind: str) -> None:
    """reproduce.sh rebuilds the crash state from the saved log and shows the finding again."""
    p = subprocess.run([str(d / "reproduce.sh")], capture_output=True, text=True, env=pc.env(), timeout=300)
    assert p.returncode == 1 and f"[{kind}]" in p.stdout, p.stdout + p.stderr
    listing = subprocess.run(["tar", "-tvzf", str(d / "crash.img.tar.gz")], capture_output=True, text=True)
    assert "crash.img" in listing.stdout
    assert "exit code:" in (d / "fsck.txt").read_text()
    doc = json.loads((d / "workload.json").read_text())
    assert doc["format"] == "powercut-workload/1"


def test_healthy_ext4_campaign_finds_nothing(pc: PcEnv) -> None:
    # 15 s: the campaign's machinery (duration stop, journal, histogram) is what is checked here;
    # random workloads on healthy file systems at length: test_oracle_e2e.py's clean runs.
    report, out, text = campaign(pc, "--fs", "ext4", "--duration", "15s", "--jobs", "4", "--ops", "4-12", rc=0)
    # How many fit in 15 s depends on the machine's load: only that there were some.
    assert report["workloads"] >= 1 and report["crash_states_checked"] >= report["workloads"]
    assert report["findings_by_kind"] == {} and report["saved_findings"] == []
    assert report["stop_reason"] == "duration" and report["harness_errors"] == 0
    assert "workloads" in text and "crash states" in text and "remaining" in text
    # the op-count histogram counts every generated workload, as the journal recorded it
    o = report["ops_per_workload"]
    journal = [json.loads(ln) for j in (out / "journal").glob("*.jsonl") for ln in j.read_text().splitlines()]
    assert sum(o["histogram"].values()) == report["workloads"] == len(journal)
    assert o["min"] == min(e["ops"] for e in journal) and o["max"] == max(e["ops"] for e in journal)
    assert f"median {o['median']}" in text
    assert 4 <= o["min"] and o["max"] <= 12  # --ops 4-12


# fsck damage is that configuration's known behaviour: asked for as findings here.
UNJOURNALED = ("--fs", "ext4", "--mkfs-opts", "-O ^has_journal", "--known-damage-findings")


def test_unjournaled_ext4_fsck_finding_is_shrunk_and_reproduces(pc: PcEnv) -> None:
    report, out, _ = campaign(pc, *UNJOURNALED, "--crash-points", "write",
                              "--duration", "4m", "--max-findings", "1", rc=1)
    assert report["stop_reason"] == "max-findings"
    d, f = saved_finding(out, "fsck")
    assert f["ops"] <= 6 and f["state_id"] == f"p{f['crash_point']}"
    assert f["expected"] == "fsck clean after recovery" and f["found"]
    check_reproduces(pc, d, "fsck")


def test_a_finding_is_shrunk_to_its_end_even_when_the_campaign_stops_meanwhile(pc: PcEnv) -> None:
    """Unjournaled ext4 fails in the first workload (8 records or more: a shrink that
    takes a while); --max-workloads 1 then stops the campaign while the finding is
    being shrunk. The shrink goes on to its end all the same (bounded by
    --shrink-seconds), the finding is saved shrunk, and the campaign exits 1."""
    report, out, text = campaign(pc, *UNJOURNALED, "--crash-points", "write",
                                 "--max-workloads", "1", "--min-ops", "8", "--duration", "5m", rc=1)
    # exactly one: the other worker may not start a second workload meanwhile
    assert report["stop_reason"] == "max-workloads" and report["workloads"] == 1
    assert report["findings_by_kind"] and report["saved_findings"]
    s = report["saved_findings"][0]
    d, f = saved_finding(out, s["kind"])
    assert f["shrink"]["method"] == "delta debugging" and f["shrink"]["complete"] and s["shrink_complete"]
    assert f["ops"] < f["shrink"]["ops_before"] and "NOT fully shrunk" not in text
    check_reproduces(pc, d, f["kind"])


def test_writeback_nodelalloc_stale_data_from_exhaustive_seq2(pc: PcEnv) -> None:
    """A deleted large file's blocks reused by a new file whose size commits (fsync of its
    directory) before its data: data=writeback shows the deleted file's bytes."""
    report, out, _ = campaign(pc, "--fs", "ext4", "--mount-opts", "data=writeback,nodelalloc", "--engine",
                              "exhaustive", "--seq", "2", "--core-ops", "unlink,large-new",
                              "--duration", "5m", "--max-findings", "1", rc=1)
    d, f = saved_finding(out, "stale-data")
    assert f["evidence"]["rule"] == "no-stale-data" and f["shrink"]["method"] == "delta debugging"
    ops = json.loads((d / "workload.json").read_text())["threads"][0]["ops"]
    assert len(ops) <= 10 and {"unlink", "pwrite"} <= {o["op"] for o in ops}, ops
    check_reproduces(pc, d, "stale-data")


def test_exhaustive_seq1_covers_the_space_across_ctrl_c_and_resume(pc: PcEnv) -> None:
    out = pc.tmp / "campaign"
    # Workers mostly wait on the kernel (mount, fsync, the FUSE recorder): 3 per core pay off.
    args = ["fuzz", "--fs", "ext4", "--engine", "exhaustive", "--seq", "1", "--jobs", "6"]
    proc = subprocess.Popen([*POWERCUT, *args, "--out", str(out)], cwd=pc.tmp, env=pc.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while sum(len(j.read_text().splitlines()) for j in (out / "journal").glob("*.jsonl")) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, "no workload finished"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stdout + stderr
    first = json.loads((out / "report.json").read_text())
    assert first["stop_reason"] == "interrupted" and 0 < first["workloads"] < exhaustive.space_size(1)
    assert not pc.leftovers()  # Ctrl-C tore every device down

    p = pc.run("fuzz", "--resume", str(out), "--jobs", "6", check_rc=0, timeout=900)
    report = json.loads((out / "report.json").read_text())
    assert report["stop_reason"] == "exhausted"
    n = exhaustive.space_size(1)
    assert report["exhaustive"] == {"seq": 1, "space": n, "done": n}, p.stdout
    assert report["workloads_this_session"] == n - first["workloads"]  # nothing was run twice
    indices = Counter(json.loads(line).get("index") for j in (out / "journal").glob("*.jsonl")
                      for line in j.read_text().splitlines())
    assert set(indices) - {None} == set(range(n)) and max(indices.values()) == 1
    assert "/min" in p.stdout
    assert report["findings_by_kind"] == {}


@needs_afl
def test_afl_corpus_grows_with_its_own_feedback(pc: PcEnv) -> None:
    report, out, _ = campaign(pc, "--fs", "ext4", "--engine", "afl", "--duration", "40s", rc=0)
    stats = report["afl"]["w0"]
    seeds = len(list((out / "afl" / "seeds").iterdir()))
    assert int(stats["corpus_count"]) > seeds, stats
    # Only deterministic features go into the map; a rare rerun whose crash
    # states differ (writeback timing under load) may still cost a little.
    assert float(stats["stability"].rstrip("%")) >= 90, stats
    assert report["saved_findings"] == []


@needs_afl
def test_afl_planted_violation_becomes_a_saved_shrunk_finding(pc: PcEnv) -> None:
    """A recorder that drops flushes (test-only fault) makes every write one flush epoch:
    crash states then lose writes the file system relied on. The target abort()s, the
    worker shrinks the input and saves it with its reproducer."""
    # As one machine of several: its instance (prefix m2, no main instance here: -S) in a sync
    # directory outside the campaign, where AFL++ keeps each instance's queue.
    sync = pc.tmp / "sync"
    report, out, _ = campaign(pc, "--fs", "ext4", "--engine", "afl", "--fault", "drop-flush",
                              "--duration", "3m", "--max-findings", "1", "--afl-sync-dir", str(sync),
                              "--afl-prefix", "m2", "--afl-secondary", rc=1)
    assert not (out / "afl").exists() and (sync / "m20" / "queue").is_dir() and list(report["afl"]) == ["m20"]
    assert " -S m20 " in (sync / "m20" / "fuzzer_stats").read_text()   # afl-fuzz's own record of its command
    saved = json.loads((out / "report.json").read_text())["saved_findings"]
    d = out / "findings" / saved[0]["dir"]
    f = json.loads((d / "finding.json").read_text())
    assert f["shrink"]["method"] == "delta debugging" and f["ops"] <= f["shrink"]["ops_before"]
    check_reproduces(pc, d, f["kind"])


def test_ext4_barrier0_with_reordering_is_found_and_shrunk(pc: PcEnv) -> None:
    """barrier=0: nothing orders the journal's writes, so a crash state that lost one
    write of the (single) flush epoch breaks the file system."""
    report, out, _ = campaign(pc, "--fs", "ext4", "--mount-opts", "barrier=0", "--reorder", "drop-one",
                              "--duration", "3m", "--max-findings", "1", rc=1)
    saved = report["saved_findings"][0]
    d = out / "findings" / saved["dir"]
    f = json.loads((d / "finding.json").read_text())
    assert "-d" in f["state_id"] and f["ops"] <= 8  # a state with one write dropped; a handful of ops
    check_reproduces(pc, d, f["kind"])


def test_minimize_shrinks_a_given_workload(pc: PcEnv) -> None:
    wl = pc.tmp / "w.json"
    ops = [{"op": "mkdir", "path": "A"}, {"op": "mkdir", "path": "B"},
           {"op": "open", "path": "A/foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
           {"op": "pwrite", "fd": "a", "offset": 0, "length": 8192}, {"op": "fsync", "fd": "a"},
           {"op": "close", "fd": "a"}, {"op": "rename", "from": "A/foo", "to": "B/foo"}, {"op": "sync"}]
    wl.write_text(json.dumps({"format": "powercut-workload/1", "name": "mini", "threads": [{"name": "m", "ops": ops}]}))
    out = pc.tmp / "min"
    p = pc.run("minimize", str(wl), *UNJOURNALED, "--known-damage-findings", "--crash-points", "write", "--kind", "fsck",
               "--out", str(out),
               check_rc=0, timeout=600)
    shrunk = json.loads((out / "workload.min.json").read_text())["threads"][0]["ops"]
    assert len(shrunk) < len(ops) and "still fsck|-|" in p.stdout
    # --max-runs: the shrink stops after that many candidate runs, its best so far kept
    p = pc.run("minimize", str(wl), *UNJOURNALED, "--crash-points", "write",
               "--kind", "fsck", "--max-runs", "1", "--out", str(pc.tmp / "min1"), check_rc=0, timeout=600)
    assert " ops in 1 runs, still fsck|-|" in p.stdout, p.stdout
    limited = json.loads((pc.tmp / "min1" / "workload.min.json").read_text())["threads"][0]["ops"]
    assert len(shrunk) <= len(limited) <= len(ops)
    p = pc.run("minimize", str(wl), "--fs", "ext4", "--out", str(pc.tmp / "min2"))
    assert p.returncode == 2 and "nothing to minimize" in p.stderr


def test_minimize_keeps_the_findings_signature_not_only_its_kind(pc: PcEnv) -> None:
    """Two bugs of one kind in one workload (drop-flush: fsync's and fdatasync's data both
    lost, durability findings with different signatures). Shrinking the fdatasync one keeps
    it; matching the kind alone (--shrink-match kind, the old behaviour) slides into the
    fsync one, whose crash point comes first."""
    wl, args = str(WORKLOADS / "two_durability_bugs.json"), ("--fs", "ext4", "--fault", "drop-flush",
                                                             "--reorder", "drop-one")
    target = "durability|fdatasync|fdatasync-data"
    p = pc.run("minimize", wl, *args, "--signature", target, "--out", str(pc.tmp / "sig"), check_rc=0, timeout=600)
    assert f"still {target}" in p.stdout, p.stdout
    ops = [o["op"] for o in json.loads((pc.tmp / "sig" / "workload.min.json").read_text())["threads"][0]["ops"]]
    assert "fdatasync" in ops and "fsync" not in ops and len(ops) < 8, ops
    report = json.loads((pc.tmp / "sig" / "best" / "report.json").read_text())
    assert any(f["evidence"].get("rule") == "fdatasync-data" for f in report["findings"])
    p = pc.run("minimize", wl, *args, "--signature", target, "--shrink-match", "kind", "--out", str(pc.tmp / "kind"),
               check_rc=0, timeout=600)
    ops = [o["op"] for o in json.loads((pc.tmp / "kind" / "workload.min.json").read_text())["threads"][0]["ops"]]
    assert "still a durability finding" in p.stdout and "fdatasync" not in ops, ops
    p = pc.run("minimize", wl, *args, "--signature", "durability|fsync|no-such-rule", "--out", str(pc.tmp / "none"))
    assert p.returncode == 2 and "does not show durability|fsync|no-such-rule" in p.stderr, p.stderr


def test_max_workloads_is_exact_with_several_workers(pc: PcEnv) -> None:
    """Each worker claims a slot before it starts a workload: 3 means 3, not 3 plus
    one more per worker that was busy when the campaign saw the count reached."""
    report, out, _ = campaign(pc, "--fs", "ext4", "--engine", "exhaustive", "--seq", "1", "--jobs", "2",
                              "--max-workloads", "3", "--duration", "5m", rc=0)
    assert report["stop_reason"] == "max-workloads" and report["workloads"] == 3
    journal = [line for f in (out / "journal").iterdir() for line in f.read_text().splitlines() if line.strip()]
    assert len(journal) == 3


def test_recovery_crash_campaign_counts_inner_states_and_saves_a_reproducible_finding(pc: PcEnv) -> None:
    """fuzz --recovery-crash samples crash states inside recoveries; with the recovering kernel's
    flushes dropped (planted fault) a finding inside a recovery is saved and reproduce.sh re-checks it."""
    report, out, text = campaign(pc, "--fs", "ext4", "--engine", "exhaustive", "--seq", "1", "--max-workloads", "1",
                                 "--recovery-crash", "--recovery-crash-rate", "0.5", "--recovery-crash-states", "16",
                                 "--fault", "recovery-drop-flush", "--max-findings", "1", "--shrink-seconds", "30",
                                 rc=1)
    assert report["recovery_crash_states_checked"] > 0
    assert f"crash states inside recoveries checked: {report['recovery_crash_states_checked']}" in text
    d, info = saved_finding(out, "fsck")
    assert "/r" in info["state_id"]
    check_reproduces(pc, d, "fsck")


def test_the_ext4_fast_commit_bug_is_shrunk_to_its_five_ops(pc: PcEnv) -> None:
    """The fast_commit fsck bug hidden among 9 other ops (renames, xattrs, writes to another
    file, a second mkdir): the shrinker every engine uses brings it back to 5 ops or fewer
    (measured: creat bar; sync; ftruncate(bar, 3000); mkdir A; fsync(bar), or its sibling
    open foo; sync; pwrite(foo); mkdir A; fdatasync(foo))."""
    out = pc.tmp / "min"
    p = pc.run("minimize", str(WORKLOADS / "ext4_fast_commit_noisy.json"), "--fs", "ext4",
               "--mkfs-opts", "-O fast_commit", "--kind", "fsck", "--out", str(out), timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    ops = json.loads((out / "workload.min.json").read_text())["threads"][0]["ops"]
    # (it may land on a sibling of the 5 ops: another size or data change of the file, or fdatasync)
    kinds = {o["op"] for o in ops}
    assert len(ops) <= 5 and "mkdir" in kinds and kinds & {"fsync", "fdatasync"}, ops


def test_make_soak_runs_each_configuration_and_writes_one_summary(pc: PcEnv) -> None:
    """`make soak` runs one campaign per configuration (fs:mkfs-feature parsed into --mkfs-opts)
    under the linux tier with the ops range asked for, and sums them up in summary.json/.md."""
    out = pc.tmp / "soak"
    p = subprocess.run(["make", "-s", "-C", str(ROOT), "soak", "SOAK_FS=ext4 ext4:^metadata_csum", "SOAK_WORKLOADS=2",
                        "SOAK_OPS=5-7", "JOBS=1", f"SOAK_OUT={out}", "FUZZ_ARGS=--seed 1"],
                       capture_output=True, text=True, env=pc.env(), timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads((out / "summary.json").read_text())["campaigns"]
    assert [(r["fs"], r["mkfs_opts"]) for r in rows] == [("ext4", ""), ("ext4", "-O ^metadata_csum")]
    for r in rows:
        report = json.loads((Path(r["campaign"]) / "report.json").read_text())
        assert report["run"]["semantics"] == r["semantics"] == "linux"
        assert r["workloads"] == report["workloads"] >= 2 and r["crash_states"] == report["crash_states_checked"] > 0
        assert 5 <= r["ops_min"] <= r["ops_max"] <= 7 and r["kernel"] == os.uname().release
    md = (out / "summary.md").read_text()
    assert "| ext4 -O ^metadata_csum | linux |" in md and md in p.stdout


def test_soak_summary_exits_1_on_findings_and_2_without_campaigns(tmp_path: Path) -> None:
    camp = tmp_path / "c" / "xfs"
    camp.mkdir(parents=True)
    report = {"fs": "xfs", "run": {"mkfs_opts": "", "mount_opts": "", "semantics": "linux"}, "engine": "hypothesis",
              "spec": {"jobs": 2}, "elapsed_s": 60.0, "stop_reason": "duration", "workloads": 3,
              "ops_per_workload": {"min": 5, "max": 9}, "crash_states_checked": 40,
              "findings_by_kind": {"mount": 4}, "saved_findings": [{"signature": "mount|-|EUCLEAN"}],
              "failed_workers": []}
    (camp / "report.json").write_text(json.dumps(report))
    cmd = [sys.executable, "-m", "harness.reports.soak_summary"]
    p = subprocess.run([*cmd, str(tmp_path / "c")], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and "| xfs | linux | ? | hypothesis | 1.0 min | 3 | 5-9 | 40 | mount 4 | 1 |" in p.stdout
    p = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "no campaign report.json" in p.stderr and "Traceback" not in p.stderr


def _children(pid: int) -> list[int]:
    kids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(p))
    return kids


# serial: in the first fresh-clone `make test` on two xdist workers (2026-12-02) the stopped
# worker's ext4 mount and /dev/loop0 stayed held ("still attached 30s after losetup -d") while
# another worker's tests ran; alone, and beside busy CPUs, it passes every time. The holder is
# not found yet (the lead's note): until it is, the test runs alone.
@pytest.mark.serial
def test_a_worker_deaf_to_its_sigterm_is_killed_and_its_devices_released(pc: PcEnv) -> None:
    """A worker that does not stop when told (seen: a hang in its own teardown) must not keep
    the campaign at exit for ever, nor leave its loop devices and mounts: after the wait it is
    killed and what it recorded is released. SIGSTOP makes one deaf to everything but SIGKILL."""
    out = pc.tmp / "c"
    proc = subprocess.Popen([*POWERCUT, "fuzz", "--fs", "ext4", "--duration", "10m", "--jobs", "2",
                             "--shrink-seconds", "1", "--out", str(out)],
                            env=pc.env(POWERCUT_WORKER_STOP_S="3"), cwd=pc.tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((workers := _children(proc.pid)) and len(workers) == 2
               and any(x.startswith("loop ") for x in pc.leftovers())):
        assert proc.poll() is None and time.monotonic() < deadline, "the campaign's workers never held a device"
        time.sleep(0.1)
    os.kill(workers[0], signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert "did not stop within" in err and "killed, devices released" in err, err
    assert pc.leftovers() == []
    assert not Path(f"/proc/{workers[0]}").exists()
    report = json.loads((out / "report.json").read_text())
    assert len(report["failed_workers"]) == 1, report["failed_workers"]

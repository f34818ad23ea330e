"""Crash-state exploration end to end: reordering finds a missing flush, ids rebuild images,
the fast path checks the same images as a full rebuild, workers agree, kill -9 leaves nothing."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from checkers.crashwalk.walk import CrashCheckResult, WalkOptions, check_crash_states
from checkers.findings import Finding
from checkers.crashwalk.recovery import guarded_inspect
from conftest import POWERCUT, WORKLOADS, PcEnv, needs_root_stack
from foundation import runstate
from foundation.filesystems import get_fs
from harness.backends.dm import support as dm_support
from replay.crashpoints import first_crash_point, select_crash_points
from replay.crashstates import CrashState, ReorderSpec
from replay.logformat import LogReader
from replay.replayer import find_mark
from replay.stateimage import build_crash_image

pytestmark = [pytest.mark.e2e, needs_root_stack]

EXT4_BYTES = 64 << 20
FSYNCED = b"powercut fsynced this\n" * 3000
# Writes a file, fsyncs it, says so with a mark, then writes more files.
FSYNC_THEN_MORE = f"""set -eu
printf '{FSYNCED[:22].decode()}%.0s' $(seq 1 3000) > f
sync f
printf fsynced > "$POWERCUT_MARK_FILE"
for i in $(seq 1 12); do head -c 20000 /dev/urandom > "g$i"; done
"""


def record(pc: PcEnv, script: str, *args: str) -> tuple[Path, dict]:
    """Record SCRIPT with `powercut run` (checking only its in-order marks); return the log and report."""
    wl = pc.tmp / "workload.sh"
    wl.write_text(script)
    out = pc.tmp / f"out-{time.monotonic_ns()}"
    p = pc.run("run", str(wl), "--fs", "ext4", "--out", str(out), "--reorder", "none", "--crash-points", "mark", *args)
    assert p.returncode in (0, 1), p.stderr
    r = json.loads((out / "report.json").read_text())
    assert r["workload"]["exit_code"] == 0, (out / "workload.out").read_text()
    return out / "recording.log", r


@contextmanager
def run_state(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[runstate.RunState]:
    """A run in this test's own state and scratch directories (so `pc` sees its leftovers)."""
    monkeypatch.setattr(runstate, "STATE_ROOT", str(pc.state))
    monkeypatch.setattr(runstate, "SCRATCH_ROOT", str(pc.scratch))
    state = runstate.RunState.create("test walk")
    try:
        yield state
    finally:
        assert state.teardown() == []


def walk(pc: PcEnv, monkeypatch: pytest.MonkeyPatch, log: Path, *, reorder: str, points: str = "flush,fua,mark",
         mount_opts: str = "", device_bytes: int = EXT4_BYTES, **kw) -> CrashCheckResult:  # type: ignore[no-untyped-def]
    reader = LogReader(str(log))
    pts = select_crash_points(reader.entries(), points, first=first_crash_point(reader))
    with run_state(pc, monkeypatch) as state:
        return check_crash_states(str(log), pts, fs=get_fs("ext4"), mount_opts=mount_opts, device_bytes=device_bytes,
                                  state=state, opts=WalkOptions(reorder=ReorderSpec.parse(reorder), **kw))


def fsynced_file_oracle(log: Path):  # type: ignore[no-untyped-def]
    """Test-only content oracle: after the fsync returned, f must hold what was written."""
    after = find_mark(LogReader(str(log)), "fsynced")
    seen: list[CrashState] = []

    def inspect(mnt: str, state: CrashState) -> list[Finding]:
        seen.append(state)
        if state.point < after:
            return []
        try:
            data = Path(mnt, "f").read_bytes()
        except OSError as e:  # ENOENT, or EBADMSG from a checksum failure
            return [Finding("durability", f"fsync'd file f: {e.strerror}")]
        if data == FSYNCED:
            return []
        return [Finding("durability", f"fsync'd file f has {len(data)} bytes, not the {len(FSYNCED)} written")]

    return inspect, seen, after


REORDER = "drop-one,torn,sample:4"


@pytest.mark.parametrize("barrier", ["0", "1"])
def test_reordering_loses_fsynced_data_only_without_barriers(pc: PcEnv, monkeypatch: pytest.MonkeyPatch,
                                                              barrier: str) -> None:
    opts = f"barrier={barrier}"
    log, _ = record(pc, FSYNC_THEN_MORE, "--mount-opts", opts)
    inspect, seen, after = fsynced_file_oracle(log)
    result = walk(pc, monkeypatch, log, reorder=REORDER, mount_opts=opts, inspect=inspect)
    lost = [f for f in result.findings if f.kind == "durability"]
    assert any(s.point >= after for s in seen), "the oracle must have run after the fsync"
    assert all(f.state_id and f.crash_point is not None and f.crash_point >= after for f in lost)
    if barrier == "1":
        assert lost == [], [f.state_id for f in lost]
        return
    # barrier=0: no flush after mkfs, so the epoch spans the fsync: some reordered states lose the data,
    # the in-order prefixes never do (jbd2 waits for its journal writes before the commit block).
    assert lost, f"no durability finding in {result.states_checked} states"
    assert all("-" in f.state_id for f in lost)
    dropped = {s.id: s for s in seen}
    assert all(dropped[f.state_id].dropped or dropped[f.state_id].torn for f in lost)


@pytest.mark.parametrize("barrier", ["1", "0"])
def test_the_content_oracle_finds_a_missing_flush(pc: PcEnv, barrier: str) -> None:
    """The same with the real content oracle (a JSON workload run by the executor, fsync in a loop):
    with barrier=0, fsync'd data is lost in reordered states, never in an in-order one; with barrier=1, never.
    One worker (--jobs 1) inspects the states in order, several of them without reading the data
    file: what it read of that file before those must not be reused after them (checkers/filememo.py;
    it was, and an in-order state showed zeros where the data was)."""
    out = pc.tmp / "out"
    p = pc.run("run", "scenario:fsync-loop", "--fs", "ext4", "--scale", "0.005", "--mount-opts", f"barrier={barrier}",
               "--jobs", "1", "--out", str(out))
    r = json.loads((out / "report.json").read_text())
    lost = [f for f in r["findings"] if f["kind"] == "durability"]
    if barrier == "1":
        assert p.returncode == 0 and r["findings"] == [], p.stdout
        return
    assert p.returncode == 1 and lost, p.stdout
    assert all("-" in f["state_id"] for f in lost), [f["state_id"] for f in lost if "-" not in f["state_id"]]


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def test_fast_path_checks_the_images_a_full_rebuild_makes(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per state, what the kernel reads through the reused loop device (after deltas and cache drops)
    equals the image built alone from the log; `powercut crash-image` builds the same bytes, every time."""
    log, report = record(pc, (WORKLOADS / "mixed.sh").read_text(), "--size", "16")  # small: hashed twice per state
    size = report["device_bytes"]
    modes = "drop-one,torn,sample:2,exhaustive:2"
    seen: dict[str, str] = {}
    result = walk(pc, monkeypatch, log, reorder=modes, jobs=2, device_bytes=size,
                  before_mount=lambda dev, cs: seen.__setitem__(cs.id, sha256(dev)))
    assert len(seen) == result.states_checked > 100
    reader = LogReader(str(log))
    img = pc.tmp / "alone.img"
    for state_id, digest in seen.items():
        build_crash_image(reader, state_id, size, str(img))
        assert sha256(img) == digest, state_id
    # The CLI, twice for the same id: byte-identical, and what the walk checked.
    some = [i for i in seen if "-d" in i][:1] + [i for i in seen if "-t" in i][:1] + [i for i in seen if "-r" in i][:1]
    for state_id in some:
        digests = set()
        for _ in range(2):
            img.unlink()
            pc.run("crash-image", "--log", str(log), "--state", state_id, "--size", str(size),
                   "--out", str(img), check_rc=0)
            digests.add(sha256(img))
        assert digests == {seen[state_id]}, state_id


def test_two_jobs_find_what_one_finds(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    log, _ = record(pc, (WORKLOADS / "metadata_heavy.sh").read_text(), "--mkfs-opts", "-O ^has_journal")
    results = [walk(pc, monkeypatch, log, reorder="drop-one", points="write", jobs=j) for j in (1, 2)]
    # The two walks get loop devices of different numbers: compare details without them.
    found = [[(f.state_id, f.kind, re.sub(r"loop[0-9]+", "loopN", f.detail)) for f in r.findings]
             for r in results]
    assert found[0] and found[0] == found[1]
    assert results[0].states_checked == results[1].states_checked
    assert results[0].states_duplicate == results[1].states_duplicate > 0


def test_first_failure_stops_early(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    log, _ = record(pc, (WORKLOADS / "metadata_heavy.sh").read_text(), "--mkfs-opts", "-O ^has_journal")
    result = walk(pc, monkeypatch, log, reorder="drop-one", points="write", first_failure=True)
    assert result.stopped_early and result.findings
    assert result.states_checked < result.states_total - result.states_duplicate


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_signal_during_parallel_walk_leaves_nothing(pc: PcEnv, sig: signal.Signals) -> None:
    """Ctrl-C and SIGTERM tear the workers down; after kill -9, `powercut cleanup` does."""
    out = pc.tmp / "out"
    proc = subprocess.Popen([*POWERCUT, "run", str(WORKLOADS / "metadata_heavy.sh"), "--fs", "ext4",
                             "--mkfs-opts", "-O ^has_journal", "--crash-points", "write", "--reorder",
                             "exhaustive:6,sample:20", "--jobs", "2", "--out", str(out)],
                            env=pc.env(), cwd=pc.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while sum("worker" in x for x in pc.leftovers()) < 2:   # both workers' loop devices (or mounts) exist
        assert proc.poll() is None and time.monotonic() < deadline, "the walk never started"
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if sig == signal.SIGKILL:
        pc.run("cleanup", check_rc=0)
    else:
        assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
        assert err.strip().splitlines()[-1] in ("powercut: interrupted", "powercut: terminated")
    assert pc.leftovers() == []
    assert os.listdir(pc.state) == []
    assert not any(pc.scratch.iterdir())


@pytest.mark.parametrize("args,message", [
    (["--reorder", "shuffle"], "--reorder 'shuffle'"),
    (["--jobs", "-1"], "--jobs -1"),
    (["--states-per-point", "0"], "--states-per-point 0"),
    (["--end-mark", "no-such-mark"], "--end-mark 'no-such-mark': no such mark"),
])
def test_bad_exploration_options_exit_2(pc: PcEnv, args: list[str], message: str) -> None:
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--out", str(pc.tmp / "out"), *args, check_rc=2)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("powercut: ") and message in lines[0], p.stderr


def test_mark_range_and_report(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--out", str(out), "--crash-points", "write",
           "--start-mark", "big-fsynced", "--end-mark", "done", check_rc=0)
    r = json.loads((out / "report.json").read_text())
    reader = LogReader(str(out / "recording.log"))
    start, end = find_mark(reader, "big-fsynced"), find_mark(reader, "done")
    assert 0 < r["crash_points"] <= end - start + 1
    assert r["reorder"] == "drop-one" and r["crash_states_total"] == r["crash_states_checked"] + r["crash_states_duplicate"]


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x   # (NaN != NaN)


def test_bench_quick_writes_every_key_and_counts_agree(pc: PcEnv) -> None:
    """`bench --quick`: every measurement once. Counts, never speeds: the numbers are the
    machine's, the counts are the harness's. (`--kernel` adds a guest boot and workloads under
    TCG, ~5 min here: left to `make bench`; its parts run alone in tests/test_vm_speed.py.)"""
    out = pc.tmp / "bench.json"
    pc.run("bench", "--quick", "--json", str(out), check_rc=0)
    result = json.loads(out.read_text())
    for key in ("crash_states_per_s", "crash_states_per_s_xfs", "floor_ms_per_state", "overhead_ratio",
                "recorder_fsync_p50_ratio", "seq1_workloads_per_min", "crash_states_per_s_over_floor",
                "oracle_bulk_speedup", "oracle_incremental_speedup"):
        assert is_number(result[key]), key
    d = result["details"]
    whole = d["oracle"]["recorder_whole_runs"]["0.01"]
    assert result["recorder_run_seconds_by_scale"]["0.01"] == whole["seconds"] and whole["states_checked"] > 0
    for name in ("bulk_vs_sector", "incremental_vs_full"):   # two implementations, one answer
        ref = d["oracle"][name]
        assert ref["same_loss_rows"] and ref["same_findings"] and ref["states"] > 0, name
    # every fsync the recorder claims, counted again in its log
    assert d["fsync"]["log_flushes"] >= d["fsync"]["fsyncs"] > 0, d["fsync"]
    assert pc.leftovers() == []


def test_bench_only_recorder_measures_just_that(pc: PcEnv) -> None:
    """--only recorder: the recorder's fsync overhead alone; --backend dm: the kernel's
    dm-log-writes, on this kernel if it has it, else one clear line (exit 2)."""
    out = pc.tmp / "rec.json"
    pc.run("bench", "--quick", "--only", "recorder", "--json", str(out), check_rc=0)
    result = json.loads(out.read_text())
    assert set(result) == {"recorder_fsync_p50_ratio", "details"}, set(result)
    fsync = result["details"]["fsync"]
    assert fsync["backend"] == "fuse" and fsync["log_flushes"] >= fsync["fsyncs"] > 0, fsync
    p = pc.run("bench", "--quick", "--only", "recorder", "--backend", "dm", "--json", str(pc.tmp / "dm.json"))
    if dm_support.missing() is None:
        assert p.returncode == 0, p.stderr
        assert json.loads((pc.tmp / "dm.json").read_text())["details"]["fsync"]["backend"] == "dm"
    else:
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "device-mapper" in p.stderr, p.stderr
    assert pc.leftovers() == []


@pytest.mark.parametrize("code", [errno.EBADMSG, errno.EUCLEAN, errno.EIO, errno.ENOENT, errno.ELOOP])
def test_a_read_error_any_inspector_hits_is_a_corruption_finding(code: int) -> None:
    """EBADMSG/EUCLEAN/EIO (the kernel's own checks failed), or a name that vanished or loops:
    a `corruption` finding with path and errno, never an exception out of the crash walk."""
    mnt = "/run/powercut/r/mnt-worker0"

    def inspector(m: str) -> list:
        raise OSError(code, os.strerror(code), f"{m}/d/foo")

    [f] = guarded_inspect(inspector, mnt)
    name = errno.errorcode[code]
    assert (f.kind, f.evidence["path"], f.evidence["errno"]) == ("corruption", "d/foo", name)
    assert f.detail == f"after recovery, reading d/foo fails: {name} ({os.strerror(code)})"

    def out_of_fds(m: str) -> list:
        raise OSError(errno.EMFILE, "Too many open files")

    with pytest.raises(OSError):  # the host's own shortage is no property of the image
        guarded_inspect(out_of_fds, mnt)


def test_a_mount_failure_that_does_not_repeat_is_no_finding(pc: PcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mountability is a property of the image's bytes: a recovery mount that fails once is
    retried on the same state rebuilt from the log; only a repeated failure is a finding.
    Here the first mount of every other state sees a wiped superblock (as a racing
    process might leave it); the rebuilt image mounts, so the walk has no finding and
    lists those states as retried. A mount that fails every time is still a finding."""
    log, _ = record(pc, (WORKLOADS / "mixed.sh").read_text())
    wiped: dict[str, int] = {}

    def wipe_superblock(dev: str, cs: CrashState) -> None:  # called before the first mount only
        if cs.point % 2 == 0:
            wiped[cs.id] = wiped.get(cs.id, 0) + 1
            fd = os.open(dev, os.O_WRONLY)
            try:
                os.pwrite(fd, bytes(1024), 1024)  # ext4's superblock
                os.fsync(fd)
            finally:
                os.close(fd)

    result = walk(pc, monkeypatch, log, reorder="none", jobs=2, before_mount=wipe_superblock)
    assert result.findings == [] and wiped
    assert sorted(r["state_id"] for r in result.mount_retries) == sorted(wiped)
    assert all(r["error"] for r in result.mount_retries)
    always = walk(pc, monkeypatch, log, reorder="none", jobs=2, mount_opts="no_such_option")
    assert always.findings and {f.kind for f in always.findings} == {"mount"} and always.mount_retries == []

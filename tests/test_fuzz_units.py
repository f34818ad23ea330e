"""The fuzzing generators and helpers without the real stack: every generator
yields valid workloads, decoding is total, enumeration is deterministic,
shrinking keeps workloads valid."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkers.findings import Finding
from common import running
from conftest import ROOT
from cli.fuzz import parse_duration
from fuzz.engine_exhaustive import parse_shard
from fuzz.engine_hypothesis import parse_ops_range
from fuzz.minimize import Shrinker, repair, subset
from fuzz.store import FindingStore
from fuzz.trial import Signature, Trial, signature
from foundation import ownership
from foundation.errors import UsageError
from foundation import runstate
from foundation.runstate import signals_deferred
from workloads import ace, afl_mutator, exhaustive, opcodec
from workloads.format import parse_workload, workload_doc
from workloads.plan import build_plan
from workloads.strategies import workloads


def assert_runnable(doc: dict) -> None:
    """DOC is a workload the executor can run as written: it parses (the schema and the fd
    rules: else UsageError), its plan keeps every op in order, and, read off the document
    itself, every fd an op uses was opened before it and not closed since."""
    ops = doc["threads"][0]["ops"]
    plan = build_plan(parse_workload(doc))
    assert [o.kind for o in plan.threads[0].ops] == [o["op"] for o in ops]
    open_fds: set[str] = set()
    for k, op in enumerate(ops):
        fds = [op[key] for key in ("fd", "from_fd") if key in op]
        if op["op"] == "open":
            open_fds.add(op["fd"])
            continue
        assert set(fds) <= open_fds, f"op {k} ({op['op']}) uses {fds}, open: {sorted(open_fds)}"
        if op["op"] == "close":
            open_fds.discard(op["fd"])


@settings(max_examples=200, suppress_health_check=list(HealthCheck), deadline=None)
@given(workloads(1, 24))
def test_strategy_workloads_are_valid(doc: dict) -> None:
    assert_runnable(doc)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=opcodec.RECORD, max_size=40 * opcodec.RECORD))
def test_any_bytes_decode_to_a_valid_workload(data: bytes) -> None:
    doc = workload_doc(opcodec.decode(data))
    assert doc["threads"][0]["ops"], "a whole record decodes to at least one op"
    assert_runnable(doc)


def test_short_input_decodes_to_nothing() -> None:
    assert opcodec.decode(b"\x00" * (opcodec.RECORD - 1)) == []


def test_mutator_keeps_whole_records_and_never_returns_empty() -> None:
    afl_mutator.init(7)
    rng = random.Random(1)
    buf = bytearray(rng.randbytes(5 * opcodec.RECORD))
    for _ in range(500):
        other = bytearray(rng.randbytes(rng.randrange(0, 6) * opcodec.RECORD))
        buf = afl_mutator.fuzz(buf, other, 1 << 20)
        assert buf and len(buf) % opcodec.RECORD == 0 and len(buf) <= opcodec.MAX_RECORDS * opcodec.RECORD
        assert isinstance(afl_mutator.describe(40), bytes)
    afl_mutator.deinit()


def test_mutator_imports_with_the_system_python_alone() -> None:
    """afl-fuzz loads it into the system python3, outside the venv."""
    code = "import workloads.afl_mutator as m; m.init(1); print(len(m.fuzz(bytearray(8), None, 64)))"
    p = subprocess.run(["/usr/bin/python3", "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); {code}"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip().isdigit(), p.stderr


def test_exhaustive_space_is_deterministic_valid_and_distinct() -> None:
    n = exhaustive.space_size(1)
    docs = [exhaustive.workload(1, i) for i in range(n)]
    assert len({d["name"] for d in docs}) == n == len(exhaustive.steps())
    for d in docs:
        parse_workload(d)
    assert exhaustive.workload(2, 1234) == exhaustive.workload(2, 1234)
    assert exhaustive.space_size(2, exhaustive.CORE_NAMES) == n * n
    assert exhaustive.space_size(2) == ace.space_size(2)   # without --core-ops: the pruned space
    names = ["unlink", "large-new"]
    assert any(exhaustive.workload(2, i, names)["name"] == "seq2-unlink.sync-large-new.fsync-dir"
               for i in range(exhaustive.space_size(2, names)))
    # the pruned space capped (seq 2's, counted above: seq 3's takes a minute to count; a --seq 3
    # campaign with --seq-cap runs in test_fuzz_spaces.py)
    assert len(list(exhaustive.capped(2, 100))) == 100 < exhaustive.space_size(2)
    assert list(exhaustive.capped(1, 0)) == list(range(n))


def test_repair_keeps_fds_valid() -> None:
    ops = [{"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
           {"op": "pwrite", "fd": "a", "offset": 0, "length": 4096},
           {"op": "close", "fd": "a"},
           {"op": "fsync", "fd": "a"},
           {"op": "sync"}]
    doc = workload_doc(ops)
    assert [o["op"] for o in subset(doc, [(0, 1), (0, 3), (0, 4)])["threads"][0]["ops"]] == ["sync"]
    assert [o["op"] for o in repair(ops)] == ["open", "pwrite", "close", "sync"]
    parse_workload(subset(doc, [(0, 0), (0, 1), (0, 4)]))


def test_signature_names_the_op_and_rule() -> None:
    doc = workload_doc([{"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
                        {"op": "fsync", "fd": "a"}])
    plan = build_plan(parse_workload(doc))
    f = Finding("durability", "x", evidence={"op": "fsync(fd=0) [op 1, thread 0]", "rule": "fsync-data"})
    assert signature(f, plan) == Signature("durability", "fsync", "fsync-data")
    g = Finding("fsck", "y", crash_point=9, crash_mark="op 0.0.0")
    assert signature(g, plan).key() == "fsck|open|-"
    assert Signature.parse("fsck|open|-") == signature(g, plan)


def test_mount_and_fsck_signatures_are_what_the_file_system_said_not_the_last_op() -> None:
    """One fast_commit refusal at two crash points after different ops, on two devices: one bug."""
    doc = workload_doc([{"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "a"},
                        {"op": "fsync", "fd": "a"}])
    plan = build_plan(parse_workload(doc))

    def refused(mark: str, dev: str) -> Finding:
        return Finding("mount", "x", crash_point=9, crash_mark=mark,
                       evidence={"errno": "EUCLEAN", "kernel_log": ["JBD2: journal recovery failed",
                                                                     f"EXT4-fs ({dev}): error loading journal"]})
    a, b = signature(refused("op 0.0.0", "loop3"), plan), signature(refused("op 0.1.0", "loop12"), plan)
    assert a == b and a.key() == "mount|-|EUCLEAN JBD2: journal recovery failed"
    assert Signature.parse(a.key()) == a

    def fsck(out: str, mark: str) -> Finding:
        return Finding("fsck", "y", crash_point=9, crash_mark=mark, evidence={"fsck_output": out})
    c = signature(fsck("Pass 1: Checking inodes\nInode 12, i_blocks is 0, should be 8.  Fix? no\n", "op 0.0.0"), plan)
    d = signature(fsck("Pass 1: Checking inodes\nInode 13, i_blocks is 0, should be 16.  Fix? no\n", "op 0.1.0"), plan)
    assert c == d and c.kind == "fsck" and c.op == "-" and "i_blocks is N" in c.rule and "|" not in c.rule
    other = signature(fsck("Inode 2 ref count is 3, should be 4.  Fix? no", "op 0.1.0"), plan)
    assert other != c


def _needs(ops_needed: set[str], tmp_path) -> tuple[Shrinker, Trial]:
    """A shrinker whose workloads "fail" while they still hold every op kind in OPS_NEEDED
    (the algorithm alone: each run's directory is real, the recording is not)."""
    n = iter(range(10**6))

    def run(doc: dict) -> Trial:
        out = ownership.make_dir(str(tmp_path / f"run{next(n)}"))
        kinds = {op["op"] for t in doc["threads"] for op in t["ops"]}
        found = [Finding("fsck", "x")] if ops_needed <= kinds else []
        return Trial(doc, out, type("R", (), {"findings": found})(), None, 0.0)  # type: ignore[arg-type]
    return Shrinker(run, Signature("fsck", "-", "-"), str(tmp_path / "best")), run


def test_shrinking_ends_at_a_one_minimal_workload_and_says_so(tmp_path) -> None:
    """Needed ops scattered among 20: every op that can go goes (one pass of single-op
    removals from the end would keep some), and the shrink says it got to its end."""
    ops = [{"op": "open", "path": "bar", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"}]
    for i in range(19):
        ops.append({"op": "mkdir", "path": f"d{i}"} if i % 6 else {"op": "fsync", "fd": "f"})
    ops[7] = {"op": "ftruncate", "fd": "f", "length": 3000}
    ops[15] = {"op": "sync"}
    shrinker, run = _needs({"open", "ftruncate", "sync", "fsync"}, tmp_path)
    best = shrinker.shrink(run(workload_doc(ops)))
    kinds = [op["op"] for op in best.doc["threads"][0]["ops"]]
    assert sorted(kinds) == ["fsync", "ftruncate", "open", "sync"], kinds
    assert shrinker.complete and not shrinker.cut_short


def test_a_shrink_cut_short_says_why(tmp_path) -> None:
    ops = [{"op": "mkdir", "path": f"d{i}"} for i in range(12)]
    shrinker, run = _needs({"mkdir"}, tmp_path)
    shrinker.max_runs = 2
    best = shrinker.shrink(run(workload_doc(ops)))
    assert not shrinker.complete and "run budget" in shrinker.cut_short
    assert len(best.doc["threads"][0]["ops"]) < 12


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "ten", "5x"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(bad)


def test_ops_ranges() -> None:
    assert parse_ops_range("5-20") == [5, 20]
    for bad in ("0-3", "7-6", "5", "-20", "a-b"):
        with pytest.raises(UsageError):
            parse_ops_range(bad)


def test_shards() -> None:
    assert parse_shard("1/3") == (1, 3)
    with pytest.raises(UsageError):
        parse_shard("3/3")


def test_bad_options_are_one_line_exit_2(tmp_path) -> None:
    env_cmd = [sys.executable, "-m", "cli.main", "fuzz", "--fs", "ext4", "--out", str(tmp_path / "c")]
    cmds = [env_cmd + extra for extra in (["--duration", "soon"], ["--engine", "exhaustive", "--core-ops", "nope"],
                                          ["--jobs", "0"], ["--ops", "20-5"], ["--ops", "five"])]
    cmds.append([sys.executable, "-m", "cli.main", "fuzz", "--resume", str(tmp_path / "none")])
    # Independent commands, each mostly an interpreter starting: all at once.
    with ThreadPoolExecutor(max_workers=len(cmds)) as pool:
        *bad, resume = pool.map(lambda c: subprocess.run(c, capture_output=True, text=True, cwd=ROOT), cmds)
    for p in bad:
        assert p.returncode == 2 and p.stderr.startswith("powercut: ") and len(p.stderr.splitlines()) == 1, p.stderr
    assert resume.returncode == 2 and "no campaign there" in resume.stderr


def test_teardown_holds_signals_back_until_done() -> None:
    """A campaign stops workers with SIGTERM, maybe while they tear down: that must finish first."""
    got: list[str] = []
    old = signal.signal(signal.SIGTERM, lambda s, f: got.append("term"))
    try:
        with signals_deferred():
            # kill() to oneself is delivered before it returns; Python runs the handler at once after.
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == []
        assert got == ["term"]
    finally:
        signal.signal(signal.SIGTERM, old)


class _Stop(BaseException):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


def test_a_signal_while_spawning_still_leaves_the_child_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI hang: SIGTERM right after Popen's fork lost the pc-recorder (nobody stopped it)."""
    monkeypatch.setattr(runstate, "STATE_ROOT", str(tmp_path / "state"))
    real_popen = subprocess.Popen

    def popen_then_signal(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        os.kill(os.getpid(), signal.SIGTERM)  # what the campaign sends its workers on Ctrl-C
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    old = signal.signal(signal.SIGTERM, _raise_stop)
    state = runstate.RunState.create("spawn test")
    try:
        with pytest.raises(_Stop):
            runstate.spawn_recorded(state, ["sleep", "600"], "sleeper", stdin=subprocess.DEVNULL)
    finally:
        signal.signal(signal.SIGTERM, old)
    recorded = [r for r in state.live_resources() if r.kind == "process"]
    assert [r.info["what"] for r in recorded] == ["sleeper"]
    pid = recorded[0].info["pid"]
    assert state.teardown() == []
    assert not running(pid)


def test_a_runs_unix_sockets_fit_however_deep_its_state_and_scratch_are(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A live guest's control socket was made in the run's scratch: under a deep scratch root
    (a long pytest temp path) binding it died with `AF_UNIX path too long`. The socket
    directory is short whatever the roots are, and goes with the run's teardown."""
    import socket
    deep = tmp_path / ("d" * 100)
    monkeypatch.setattr(runstate, "STATE_ROOT", str(deep / "state"))
    monkeypatch.setattr(runstate, "SCRATCH_ROOT", str(deep / "scratch"))
    state = runstate.RunState.create("socket test")
    sockets = state.socket_dir()
    assert not sockets.startswith(str(tmp_path)) and state.run_id in sockets
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(os.path.join(sockets, "control.sock"))
    finally:
        s.close()
    assert state.teardown() == []
    assert not os.path.exists(sockets)


def test_exhaustive_gives_an_index_the_harness_failed_on_one_more_try(monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness error must not leave a hole in a space the report calls covered."""
    from fuzz import engine_exhaustive

    class W:  # just what the engine asks of a worker
        options = {"seq": 1, "seq_cap": 0}
        coord = None  # not joined to other machines
        tried: list[int] = []

        def should_stop(self) -> bool:
            return False

        def run(self, doc: dict, **journal: object) -> object | None:
            i = int(journal["index"])  # type: ignore[call-overload]
            self.tried.append(i)
            return None if self.tried.count(i) == 1 and i in (3, 7) else object()

        def triage(self, trial: object) -> bool:
            return False

    monkeypatch.setattr(engine_exhaustive, "indices", lambda w: list(range(10)))
    w = W()
    engine_exhaustive.run(w)  # type: ignore[arg-type]
    assert w.tried == [*range(10), 3, 7]


def test_a_signature_naming_a_source_file_can_be_claimed_once(tmp_path: Path) -> None:
    """A kernel WARNING's rule names the source file (fs/ext4/ext4_jbd2.c): its claim is still one file,
    and a second worker finding the same bug sees it claimed."""
    store = FindingStore(str(tmp_path))
    sig = Signature("kernel", "write", "recovery mount:warning:fs/ext4/ext4_jbd2.c:73")
    assert store.claim(sig)
    assert not store.claim(sig)
    assert sig.key() in store.known()

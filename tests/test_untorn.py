"""pwritev2/statx and the untorn-write rule: the format and plan, the
executor on a scratch directory, the oracle on tampered fixtures (a real
pc-exec run, the "crash image" altered by the test), and the real stack:
xfs with reflink (software atomic writes) and ext4 (no atomic writes here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import require_exec, run_exec
from conftest import WORKLOADS, PcEnv, needs_root_stack
from foundation.errors import UsageError
from test_oracle import Run
from workloads.format import parse_workload
from workloads.pattern import generate
from workloads.plan import build_plan, parse_plan, render_plan
from workloads.results import StatxResult, read_records

needs_exec = require_exec


def doc(ops: list[dict], name: str = "untorn-test") -> dict:
    return {"format": "powercut-workload/1", "name": name, "threads": [{"name": "main", "ops": ops}]}


OPEN = {"op": "open", "path": "db", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"}


def test_pwritev2_and_statx_survive_the_plan_round_trip() -> None:
    w = parse_workload(doc([OPEN, {"op": "statx", "path": "db"},
                            {"op": "pwritev2", "fd": "f", "iov": [4096, 8192], "offset": -1,
                             "flags": ["RWF_ATOMIC", "RWF_DSYNC"]},
                            {"op": "close", "fd": "f"}]))
    plan = build_plan(w)
    text = render_plan(plan)
    assert "kind=pwritev2 fd=0 file=1 offset=-1 stride=0 length=12288 iov=4096,8192 flags=RWF_ATOMIC|RWF_DSYNC" in text
    assert "kind=statx path=db flags=STATX_WRITE_ATOMIC|STATX_DIOALIGN" in text
    assert parse_plan(text) == plan


@pytest.mark.parametrize("op, where", [
    ({"op": "pwritev2", "fd": "f", "offset": 0}, "threads[0].ops[1].iov: required field missing"),
    ({"op": "pwritev2", "fd": "f", "iov": [], "offset": 0}, "threads[0].ops[1].iov: must have at least 1"),
    ({"op": "pwritev2", "fd": "f", "iov": [4096], "offset": -2}, "threads[0].ops[1].offset: must be >= -1"),
    ({"op": "pwritev2", "fd": "f", "iov": [4096], "offset": 0, "flags": ["RWF_ATOM"]}, "threads[0].ops[1].flags[0]"),
    ({"op": "statx", "path": "/abs"}, "threads[0].ops[1].path"),
])
def test_bad_pwritev2_and_statx_fields_are_one_line_errors(op: dict, where: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_workload(doc([OPEN, op, {"op": "close", "fd": "f"}]))
    assert str(e.value).startswith(f"WORKLOAD: {where}") and "\n" not in str(e.value)


def test_statx_packing_decodes() -> None:
    # byte 0 unit min 4096 (log2 12 + 1), 1 max 1 MiB, 3 segments 1, 4/5 dio 512, 6: answered + attr
    aux = 13 | 21 << 8 | 1 << 24 | 10 << 32 | 10 << 40 | 0b0111 << 48
    s = StatxResult.unpack(aux)
    assert (s.atomic_unit_min, s.atomic_unit_max, s.atomic_segments_max, s.dio_mem_align) == (4096, 1 << 20, 1, 512)
    assert s.atomic_supported and not s.inexact


@needs_exec
def test_executor_pwritev2_lands_where_it_says_with_the_pattern(tmp_path: Path) -> None:
    """iovecs make one range; offset -1 writes at the fd's position; RWF_APPEND at
    the end of file whatever the offset; statx of a tmpfs file: no atomic writes."""
    w = parse_workload(doc([OPEN, {"op": "write", "fd": "f", "length": 1000},
                            {"op": "pwritev2", "fd": "f", "iov": [100, 3000, 1], "offset": -1},
                            {"op": "pwritev2", "fd": "f", "iov": [512], "offset": 0, "flags": ["RWF_APPEND"]},
                            {"op": "pwritev2", "fd": "f", "iov": [4096], "offset": 0, "flags": ["RWF_ATOMIC"]},
                            {"op": "statx", "path": "db"}, {"op": "statx", "path": "missing"},
                            {"op": "close", "fd": "f"}]))
    plan = build_plan(w)
    (tmp_path / "plan").write_text(render_plan(plan))
    (tmp_path / "fs").mkdir()
    run_exec(tmp_path / "plan", tmp_path / "fs", "--out", str(tmp_path / "rec"))
    recs = read_records(tmp_path / "rec", plan).records
    v1, app, atomic, st, st_missing = recs[2], recs[3], recs[4], recs[5], recs[6]
    assert (v1.ret, v1.offset) == (3101, 1000) and (app.ret, app.offset) == (512, 4101)
    data = (tmp_path / "fs" / "db").read_bytes()
    assert data[1000:4101] == generate(w.wid, 1, 2, 0, 1000, 3101)
    assert data[4101:] == generate(w.wid, 1, 3, 0, 4101, 512)
    assert atomic.ret == -1 and atomic.errno in (95, 22)  # tmpfs: no untorn writes (EOPNOTSUPP, or EINVAL buffered)
    assert st.ret == 0 and st.statx is not None and st.statx.write_atomic_answered and not st.statx.atomic_supported
    assert st_missing.ret == -1 and st_missing.errno == 2 and st_missing.statx is None


# -- the oracle on fixtures: the executor strips RWF_ATOMIC (PC_EXEC_FAULT) so the
# write succeeds on the scratch directory while the model believes it untorn.
TORN = [{"op": "open", "path": "db", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"},     # 0
        {"op": "pwrite", "fd": "f", "offset": 0, "length": 16384},                     # 1
        {"op": "fsync", "fd": "f"},                                                    # 2
        {"op": "pwritev2", "fd": "f", "iov": [16384], "offset": 0, "flags": ["RWF_ATOMIC"]},  # 3
        {"op": "close", "fd": "f"}]                                                    # 4


def fixture(tmp: Path, monkeypatch: pytest.MonkeyPatch, ops: list[dict]) -> Run:
    monkeypatch.setenv("PC_EXEC_FAULT", "strip-atomic")
    return Run(tmp, ops)


def tear(run: Run, keep_new: range) -> None:
    """The file with the pwritev2's data only in the 4 KiB blocks KEEP_NEW, old data elsewhere."""
    path = run.dir / "db"
    data = bytearray(path.read_bytes())
    old = generate(run.plan.wid, 1, 1, 0, 0, 16384)
    for b in range(4):
        if b not in keep_new:
            data[b * 4096:(b + 1) * 4096] = old[b * 4096:(b + 1) * 4096]
    path.write_bytes(bytes(data))


@needs_exec
@pytest.mark.parametrize("new_blocks", [range(0), range(4)])
def test_untorn_write_all_old_or_all_new_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                new_blocks: range) -> None:
    run = fixture(tmp_path, monkeypatch, TORN)
    tear(run, new_blocks)
    assert run.check(run.after(3)) == [] and run.check(run.after(4)) == []


@needs_exec
def test_untorn_write_mixed_is_an_atomicity_finding_with_ranges(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run = fixture(tmp_path, monkeypatch, TORN)
    tear(run, range(1, 3))
    for point in (run.before(3), run.after(3)):  # in flight, and returned
        found = run.check(point)
        assert [f.kind for f in found] == ["atomicity"], found
        ev = found[0].evidence
        assert ev["rule"] == "untorn-write" and ev["range"] == [0, 16384]
        assert ev["new_ranges"] == [(4096, 12288)] and ev["old_ranges"] == [(0, 4096), (12288, 16384)]
        assert "op 1 iter 0" in ev["writers"]["old"][0] and ev["writers"]["new"] == "op 3 iter 0"
    row = run.oracle.torn_rows[-1]
    assert (row["torn"], row["torn_untorn"]) == (1, 1)


@needs_exec
def test_a_newer_write_over_part_of_the_range_is_no_tear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = TORN[:4] + [{"op": "pwrite", "fd": "f", "offset": 0, "length": 4096}, TORN[4]]
    run = fixture(tmp_path, monkeypatch, ops)
    data = bytearray((run.dir / "db").read_bytes())  # blocks 1-3 new, block 0 the newer pwrite's: fine
    assert run.check(run.after(5)) == []
    data[4096:8192] = generate(run.plan.wid, 1, 1, 0, 4096, 4096)  # ... but block 1 old: torn
    (run.dir / "db").write_bytes(bytes(data))
    assert [f.kind for f in run.check(run.after(5))] == ["atomicity"]


@needs_exec
def test_a_torn_plain_pwritev2_is_counted_not_a_finding(tmp_path: Path) -> None:
    ops = [dict(op, flags=[]) if op["op"] == "pwritev2" else op for op in TORN]
    run = Run(tmp_path, ops)
    tear(run, range(2))
    assert run.check(run.after(4)) == []
    assert run.oracle.torn_rows[-1]["torn"] == 1 and run.oracle.torn_rows[-1]["torn_untorn"] == 0


# -- the real stack ----------------------------------------------------------------
def run_report(pc: PcEnv, workload: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    out = pc.tmp / f"out-{len(list(pc.tmp.glob('out-*')))}"
    p = pc.run("run", str(workload), "--out", str(out), "--reorder", "drop-one,torn", "--states-per-point", "6",
               "--jobs", "2", *args, env=env)
    assert p.returncode in (0, 1), p.stderr
    report = json.loads((out / "report.json").read_text())
    report["out"] = str(out)
    return p.returncode, report


def plain_copy(pc: PcEnv, src: Path) -> Path:
    d = json.loads(src.read_text())
    d["name"] += "-plain"
    for op in d["threads"][0]["ops"]:
        if op["op"] == "pwritev2":
            op["flags"] = [f for f in op["flags"] if f != "RWF_ATOMIC"]
    dst = pc.tmp / "plain.json"
    dst.write_text(json.dumps(d))
    return dst


@pytest.mark.e2e
@needs_root_stack
def test_xfs_reflink_atomic_writes_hold_plain_ones_tear_and_a_planted_tear_is_caught(pc: PcEnv) -> None:
    """One workload three ways on xfs -m reflink=1 (software atomic writes, kernel 6.16+)."""
    wl = WORKLOADS / "atomic_small.json"
    xfs = ("--fs", "xfs", "--mkfs-opts", "-m reflink=1")
    rc, r = run_report(pc, wl, *xfs)
    st = r["statx"][0]
    if not st.get("atomic_supported"):
        pytest.skip(f"this kernel's xfs does no untorn writes on a loop device: {st}")
    assert rc == 0 and r["findings"] == []
    t = r["torn_writes"]
    assert t["untorn_writes_max"] == 3 and t["states_torn"] == 0 and r["crash_states_checked"] > 10
    # Without RWF_ATOMIC the same O_DIRECT writes go in place: torn states show them torn.
    rc, plain = run_report(pc, plain_copy(pc, wl), *xfs)
    assert rc == 0 and plain["findings"] == [] and plain["torn_writes"]["states_torn"] > 0
    # Planted: the executor drops RWF_ATOMIC but records it: the torn states are findings.
    rc, planted = run_report(pc, wl, *xfs, env=pc.env(PC_EXEC_FAULT="strip-atomic"))
    assert rc == 1 and {f["kind"] for f in planted["findings"]} == {"atomicity"}
    assert all(f["evidence"]["rule"] == "untorn-write" and f["evidence"]["old_ranges"] for f in planted["findings"])
    assert planted["torn_writes"]["torn_untorn_total"] == len(planted["findings"])


@pytest.mark.e2e
@needs_root_stack
def test_ext4_refuses_atomic_writes_and_nothing_is_found(pc: PcEnv) -> None:
    rc, r = run_report(pc, WORKLOADS / "atomic_small.json", "--fs", "ext4")
    assert rc == 0 and r["findings"] == []
    assert r["statx"][0]["atomic_supported"] is False
    out = Path(r["out"])
    assert "atomic write unit 0..0 B" in (out / "report.md").read_text()  # the limits in force, in report.md
    recs = read_records(out / r["workload"]["records"], parse_workload(json.loads((out / "workload.json").read_text())))
    assert {x.errno for x in recs.records if x.kind == "pwritev2"} == {95}  # EOPNOTSUPP: ext4 without a device that does atomic writes


@pytest.mark.e2e
@needs_root_stack
def test_torn_pages_scenario_counts_torn_pages_without_atomic_writes_only(pc: PcEnv) -> None:
    out = pc.tmp / "torn"
    p = pc.run("run", "scenario:torn-pages", "--scale", "0.125", "--fs", "xfs", "--mkfs-opts", "-m reflink=1",
               "--param", "pages_per_commit=2", "--reorder", "drop-one,torn", "--states-per-point", "6", "--jobs", "2",
               "--param-matrix", "atomic=0;1", "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    plain, atomic = (json.loads((out / d / "report.json").read_text())["scenario"] for d in ("1-atomic_0", "2-atomic_1"))
    if not atomic["statx"]["supported"]:
        pytest.skip(f"this kernel's xfs does no untorn writes on a loop device: {atomic['statx']}")
    assert plain["pages_written"] == atomic["pages_written"] == 4 and atomic["refused"] == 0
    assert plain["states_with_torn_pages"] > 0 and plain["torn_pages_max"] >= 1
    assert atomic["states_with_torn_pages"] == 0 and atomic["crash_states"] > 0
    assert sum(plain["torn_per_state"].values()) == plain["crash_states"]
    compare = json.loads((out / "report.json").read_text())
    assert [v["findings"] for v in compare["variants"]] == [0, 0]
    assert compare["variants"][0]["headline"]["states with torn pages"] == plain["states_with_torn_pages"]


@pytest.mark.parametrize("length, offset, why", [
    (4096, 8192, None), (1 << 20, 0, None), (12288, 0, "power of two"), (2048, 0, "power of two"),
    (2 << 20, 0, "power of two"), (16384, 4096, "multiple of the length")])
def test_untorn_limits_say_which_writes_the_kernel_must_refuse(length: int, offset: int, why: str | None) -> None:
    from checkers.history import untorn_refusal
    xfs = StatxResult(4096, 1 << 20, 0, 1, 512, 512, True, True, True, False)
    got = untorn_refusal(xfs, length, offset, append=False)
    assert (got is None) if why is None else (why in got)
    ext4 = StatxResult(0, 0, 0, 0, 512, 512, True, True, False, False)
    assert "STATX_ATTR_WRITE_ATOMIC" in untorn_refusal(ext4, 4096, 0, append=False)


@needs_exec
def test_an_atomic_write_the_limits_forbid_that_succeeds_is_a_semantics_disagreement(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tmpfs reports no untorn writes; the stripped flag lets the write succeed anyway."""
    ops = [TORN[0], {"op": "statx", "path": "db"}, *TORN[3:]]
    run = fixture(tmp_path, monkeypatch, ops)
    assert [d.ex.kind for d in run.history.disagreements] == ["pwritev2"]
    assert "STATX_ATTR_WRITE_ATOMIC" in run.history.disagreements[0].expected

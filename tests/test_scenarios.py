"""Scenario generators (no root needed): valid workloads, the paper's counts at scale 1, CLI, bad input."""

from __future__ import annotations

from dataclasses import replace

import json
import subprocess

import pytest

from conftest import POWERCUT, ROOT
from harness.pipeline.compare import variants
from foundation.errors import UsageError
from workloads.runner import load_runner
from workloads import scenarios
from workloads.format import parse_workload, walk
from workloads.plan import compile_plan
from workloads.scenarios import recorder

MIB = 1 << 20


def powercut(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*POWERCUT, *args], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def ops_of(doc: dict, kind: str) -> list[dict]:
    w = parse_workload(doc)
    return [{"thread": t.name, "id": op.id, **op.args} for t in w.threads for op in walk(t.ops) if op.kind == kind]


def _op_lists(ops: list[dict]) -> list[list[dict]]:
    """OPS and every op list nested in its repeats, as written in the document."""
    return [ops, *(inner for o in ops if o["op"] == "repeat" for inner in _op_lists(o["ops"]))]


@pytest.mark.parametrize("name", list(scenarios.MODULES))
@pytest.mark.parametrize("scale", [0.001, 0.01, 1.0])
def test_every_scenario_is_a_valid_workload_that_records_its_generator(name: str, scale: float) -> None:
    doc = scenarios.document(name, scale)
    w = parse_workload(doc)
    compile_plan(w)
    mod = scenarios.get(name)
    assert w.name == name and w.generator is not None and w.generator.scale == scale
    assert scenarios.of_workload(w) == (mod, mod.params(scale))  # the saved document re-analyzes the same run


def test_scale_1_has_the_papers_counts() -> None:
    rec = scenarios.document("recorder", 1.0)
    writes = ops_of(rec, "write")
    assert {w["length"] for w in writes} == {16384}
    reps = {r["id"]: r for r in ops_of(rec, "repeat")}
    assert sum(r["count"] for k, r in reps.items() if k.startswith("quiet.record")) == 8000
    assert sum(r["count"] for k, r in reps.items() if k.startswith("loaded.record")) == 8000
    assert {r["period_us"] for k, r in reps.items() if ".record" in k} == {5000}
    assert {f["length"] for f in ops_of(rec, "fallocate") if f["thread"] == "recorder"} == {100 * MIB}
    sfr_periods = {r["period_us"] for k, r in reps.items() if ".sfr-period" in k}
    assert sfr_periods == {2 * MIB // 16384 * 5000}  # a call per 2 MB the recorder writes
    assert {t["name"]: t["sched"]["policy"] for t in rec["threads"]}["recorder"] == "fifo"

    loop = ops_of(scenarios.document("fsync-loop", 1.0), "repeat")
    assert [r["count"] for r in loop] == [4096]
    assert [w["length"] for w in ops_of(scenarios.document("fsync-loop", 1.0), "write")] == [512]

    park = scenarios.document("fsync-under-load", 1.0)
    assert len(park["threads"]) == 1 + 8
    assert {w["length"] for w in ops_of(park, "write") if w["thread"] == "small"} == {10240}
    assert {w["length"] for w in ops_of(park, "write") if w["thread"] != "small"} == {4096}
    assert next(r for r in ops_of(park, "repeat") if r["id"] == "small.period")["period_us"] == 5_000_000
    # the paper's load is 4 KB async writes: each append is sent to the device on its own
    bursts = [ops for t in park["threads"] if t["name"] != "small" for ops in _op_lists(t["ops"])
              if any(o.get("id", "").startswith("bg.flush") for o in ops)]
    assert len(bursts) == 8 and all(b[0]["count"] == 1 and b[0]["ops"][0]["length"] == 4096
                                    and b[1]["flags"] == ["WRITE"] for b in bursts)

    streams = scenarios.document("recording-streams", 1.0)
    assert len(streams["threads"]) == 6
    assert {w["length"] for w in ops_of(streams, "write")} == {564 * 1024}
    assert {f["mode"] == ["KEEP_SIZE"] for f in ops_of(streams, "fallocate")} == {True}

    probe = scenarios.document("lprobe", 1.0)
    reads = [r for r in ops_of(probe, "read") if r["id"] == "probe.read"]
    assert reads[0]["length"] == 4096
    outer = [r for r in ops_of(probe, "repeat") if r["thread"] == "probe"][-2]
    assert outer["count"] * 10 * 4096 == 200 * MIB


def test_recorder_structure_follows_the_design() -> None:
    """A new file per recording, fallocated by the recorder, sync_file_range on what was
    written, ftruncate to what was written + fsync by the post thread; the oracle's invariant."""
    p = recorder.params(0.01)
    doc = recorder.generate(p)
    created = [o["path"] for o in ops_of(doc, "open") if o["thread"] == "recorder"]
    assert created[0] == recorder.WARMUP  # the allocator's metadata is read in before the quiet phase
    created = created[1:]
    assert created == recorder.recording_paths(p) == doc["invariants"]["records"]["path"]
    assert len(set(created)) == len(created) == 2 * p.recordings
    assert doc["invariants"]["records"]["record_bytes"] == p.write_bytes
    assert doc["invariants"]["records"]["period_us"] == p.period_us
    truncs = ops_of(doc, "ftruncate")
    assert sum(t["length"] for t in truncs if t["thread"] == "post") == 2 * p.writes * p.write_bytes
    assert {t["thread"] for t in ops_of(doc, "fsync")} == {"recorder", "post", "background"}
    # Table 1's "none": a quiet recording starts only after the previous one's ftruncate + fsync
    posted = [o["thread"] for o in ops_of(doc, "barrier") if o["name"] == "posted"]
    assert sorted(posted) == sorted(["recorder", "post"] * p.recordings)
    overlapping = recorder.generate(replace(p, quiet_overlap=1, warmup=0))
    assert not [o for o in ops_of(overlapping, "barrier") if o["name"] == "posted"]
    assert recorder.WARMUP not in [o["path"] for o in ops_of(overlapping, "open")]
    sfr = ops_of(doc, "sync_file_range")
    # Each call syncs the whole file: records the recorder wrote after the call meant for
    # them (it fell behind the syncer's clock) are synced by the next one, as by the
    # paper's syncer, which runs when the data has been written.
    assert {s["thread"] for s in sfr} == {"syncer"}
    assert all(s["offset"] == 0 and s["length"] == 0 and not s.get("stride") for s in sfr)
    sched = {t["name"]: t["sched"] for t in doc["threads"]}
    assert sched["recorder"]["priority"] > sched["syncer"]["priority"] > 0
    assert doc["device"]["size_mib"] >= 32
    quiet = recorder.generate(recorder.Params(writes=10, recordings=2, background=0))
    assert [t["name"] for t in quiet["threads"]] == ["recorder", "syncer", "post"]


def test_params_override_and_bad_params() -> None:
    mod, p = scenarios.resolve("fsync-loop", 0.5, ["iterations=7", "write_bytes=4096"])
    assert (p.iterations, p.write_bytes) == (7, 4096)
    for bad, message in [(["iterations=many"], "iterations must be an integer"),
                         (["bogus=1"], "scenario fsync-loop takes iterations=, write_bytes="),
                         (["iterations"], "takes iterations=")]:
        with pytest.raises(UsageError, match=message):
            scenarios.resolve("fsync-loop", 1.0, bad)
    with pytest.raises(UsageError, match="unknown scenario 'nope': choose one of recorder, "):
        scenarios.get("nope")
    with pytest.raises(UsageError, match="--scale 0.0: must be > 0"):
        scenarios.resolve("lprobe", 0.0)
    with pytest.raises(UsageError, match="--scale and --param are for scenario:NAME workloads"):
        load_runner("tests/workloads/mixed.sh", 0.1)


def test_matrix_entries() -> None:
    dim, vs = variants("barrier=1;data=journal,commit=30", "", ["x=1"])
    assert dim == "mount options" and [(v.label, v.mount_opts, v.params) for v in vs] == [
        ("barrier=1", "barrier=1", ("x=1",)), ("data=journal,commit=30", "data=journal,commit=30", ("x=1",))]
    dim, vs = variants("", "queue_depth=4;128", [])
    assert dim == "scenario parameter queue_depth" and [v.params for v in vs] == [("queue_depth=4",), ("queue_depth=128",)]
    for m, pm in [("a;;b", ""), ("a;a", ""), ("", "queue_depth"), ("", "=1;2")]:
        with pytest.raises(UsageError):
            variants(m, pm, [])


def test_scenario_cli_list_and_show() -> None:
    p = powercut("scenario", "list")
    assert p.returncode == 0, p.stderr
    for name in scenarios.MODULES:
        assert f"\n{name}: " in "\n" + p.stdout
    assert "writes=8000" in p.stdout and "--mount-opts noatime,lazytime" in p.stdout
    p = powercut("scenario", "show", "recorder", "--scale", "0.01", "--param", "keep_size=1")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == scenarios.document("recorder", 0.01, ["keep_size=1"])
    for args, message in [(["scenario", "show", "nope"], "powercut: unknown scenario 'nope'"),
                          (["scenario", "show", "lprobe", "--param", "x=1"], "powercut: --param 'x=1': scenario lprobe"),
                          (["run", "scenario:recorder", "--fs", "ext4", "--scale", "-1"], "powercut: --scale -1.0: must be > 0"),
                          (["run", "tests/workloads/mixed.sh", "--fs", "ext4", "--param-matrix", "a=1;2"],
                           "powercut: --param-matrix is for scenario:NAME workloads")]:
        p = powercut(*args)
        assert p.returncode == 2 and p.stderr.splitlines() == [p.stderr.strip()] and p.stderr.startswith(message), p.stderr

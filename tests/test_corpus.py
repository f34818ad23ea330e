"""The regression corpus: entries, matrix, expected verdicts, baselines, JUnit."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import POWERCUT, ROOT, WORKLOADS, PcEnv, needs_root_stack
from harness.corpus.entries import CORPUS_DIR, load_corpus, load_entry, load_matrix
from harness.corpus.run import Case, compare_baseline
from foundation.errors import UsageError
from workloads.format import OP_KINDS


def test_seed_corpus_loads_and_covers_every_op() -> None:
    entries = load_corpus()
    assert len(entries) >= 50
    used = set()

    def walk(ops: list[dict]) -> None:
        for op in ops:
            used.add(op["op"])
            walk(op.get("ops", []))

    for e in entries:
        for t in e.workload["threads"]:
            walk(t["ops"])
    assert set(OP_KINDS) - used <= {"fiemap"}, set(OP_KINDS) - used
    assert {r.name for r in load_matrix(CORPUS_DIR / "matrix.json")} >= {"ext4-ordered", "xfs-default", "btrfs-default"}


def test_corpus_list_shows_every_entry_file_once_and_filters_by_glob() -> None:
    """`powercut corpus list` against the corpus directory itself: one line per entry file."""
    files = sorted(f.stem for f in CORPUS_DIR.rglob("*.json") if f.name != "matrix.json")
    p = subprocess.run([*POWERCUT, "corpus", "list"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert sorted(line.split()[0] for line in p.stdout.splitlines()) == files
    p = subprocess.run([*POWERCUT, "corpus", "list", "--entries", "create-*,append-fsync"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert names == sorted(n for n in files if n.startswith("create-") or n == "append-fsync"), names


@pytest.mark.parametrize("doc,message", [
    ({"format": "nope"}, "not a corpus entry"),
    ({"format": "powercut-corpus/1", "name": "x", "why": "y"}, "missing 'workload'"),
    ({"format": "powercut-corpus/1", "name": "x", "why": "y", "expect": {"default": ["bogus"]},
      "workload": {"format": "powercut-workload/1", "name": "x", "threads": [{"name": "m", "ops": [{"op": "sync"}]}]}},
     "a verdict is"),
    ({"format": "powercut-corpus/1", "name": "x", "why": "y",
      "workload": {"format": "powercut-workload/1", "name": "x", "threads": [{"name": "m", "ops": [{"op": "fsync"}]}]}},
     "threads[0].ops[0]"),
])
def test_malformed_entries_are_one_line_errors(tmp_path: Path, doc: dict, message: str) -> None:
    p = tmp_path / "e.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(UsageError) as e:
        load_entry(p)
    assert message in str(e.value) and "\n" not in str(e.value)


def _entry_with(tmp_path: Path, expect: dict) -> Path:
    p = tmp_path / "e.json"
    p.write_text(json.dumps({"format": "powercut-corpus/1", "name": "x", "why": "y", "expect": expect,
                             "workload": {"format": "powercut-workload/1", "name": "x",
                                          "threads": [{"name": "m", "ops": [{"op": "sync"}]}]}}))
    return p


def test_a_may_kind_is_allowed_not_required(tmp_path: Path) -> None:
    entry = load_entry(_entry_with(tmp_path, {"default": "clean", "ext4-nojournal": {"may": ["fsck"]},
                                              "xfs": {"must": ["durability"], "may": ["fsck", "durability"]}}))
    rows = {r.name: r for r in load_matrix(CORPUS_DIR / "matrix.json")}
    nojournal, ordered, xfs = rows["ext4-nojournal"], rows["ext4-ordered"], rows["xfs-default"]
    assert (entry.expected(nojournal), entry.allowed(nojournal)) == ([], ["fsck"])
    assert (entry.expected(ordered), entry.allowed(ordered)) == ([], [])
    assert (entry.expected(xfs), entry.allowed(xfs)) == (["durability"], ["fsck"])

    def unexpected(row, verdict):
        return Case("x", row.name, row.fs, "", "", entry.expected(row), verdict=verdict,
                    may=entry.allowed(row)).unexpected

    assert not unexpected(nojournal, []) and not unexpected(nojournal, ["fsck"])
    assert unexpected(nojournal, ["durability"]) and unexpected(nojournal, ["durability", "fsck"])
    assert unexpected(ordered, ["fsck"]) and unexpected(nojournal, None)
    assert not unexpected(xfs, ["durability", "fsck"]) and unexpected(xfs, ["fsck"])
    with pytest.raises(UsageError, match="only \"must\" and \"may\""):
        load_entry(_entry_with(tmp_path, {"default": {"maybe": ["fsck"]}}))


def test_latency_regression_against_baseline() -> None:
    case = Case("e", "r", "ext4", "", "", [], verdict=[], latency={"fsync": {"p99_us": 900.0, "max_us": 1000.0},
                                                                    "pwrite": {"p99_us": 30.0, "max_us": 50.0}})
    same = {"cases": {case.key: {"verdict": [], "latency": {"fsync": {"p99_us": 800.0, "max_us": 950.0}}}}}
    compare_baseline([case], same, factor=2.0, floor_us=200)
    assert case.regressions == [] and not case.failed
    faster = {"cases": {case.key: {"verdict": [], "latency": {"fsync": {"p99_us": 100.0, "max_us": 950.0},
                                                                "pwrite": {"p99_us": 1.0, "max_us": 1.0}}}}}
    compare_baseline([case], faster, factor=2.0, floor_us=200)
    # fsync p99 regressed; pwrite got 30x worse but stays under the noise floor.
    assert case.regressions == ["fsync p99_us 900 us > 2 x baseline 100 us"] and case.failed


@pytest.mark.e2e
@needs_root_stack
def test_corpus_run_expected_verdicts_and_an_injected_mount_option_change(pc: PcEnv) -> None:
    entries = "stale-freed-blocks"
    out = pc.tmp / "ok"
    # Two cases in two worker processes; --runnable keeps both rows on a host with ext4.
    p = pc.run("corpus", "run", "--entries", entries, "--rows", "ext4-ordered,ext4-writeback", "--out", str(out),
               "--junit", str(pc.tmp / "ok.xml"), "--jobs", "2", "--runnable", check_rc=0)
    results = json.loads((out / "results.json").read_text())
    cases = results["cases"]
    assert cases["stale-freed-blocks@ext4-ordered"]["verdict"] == []
    assert cases["stale-freed-blocks@ext4-writeback"]["verdict"] == ["stale-data"]
    assert results["summary"]["unexpected"] == 0 and "0 unexpected" in p.stdout
    suite = ET.parse(pc.tmp / "ok.xml").getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "0"

    # The product's row switches to data=writeback: the expectation for the row did not change.
    matrix = pc.tmp / "matrix.json"
    matrix.write_text(json.dumps({"format": "powercut-matrix/1", "rows": [
        {"name": "ext4-ordered", "fs": "ext4", "mount_opts": "data=writeback,nodelalloc"}]}))
    bad = pc.tmp / "bad"
    p = pc.run("corpus", "run", "--entries", entries, "--matrix", str(matrix), "--out", str(bad),
               "--junit", str(pc.tmp / "bad.xml"), check_rc=1)
    assert "1 unexpected" in p.stdout
    suite = ET.parse(pc.tmp / "bad.xml").getroot()
    failure = suite.find("testcase/failure")
    assert suite.get("failures") == "1" and "expected clean, got stale-data" in failure.get("message")
    assert "**stale-freed-blocks**" in (bad / "summary.md").read_text()


@pytest.mark.e2e
@needs_root_stack
def test_latency_regression_fails_the_run(pc: PcEnv) -> None:
    out = pc.tmp / "first"
    pc.run("corpus", "run", "--entries", "create-pwrite-fsync", "--rows", "ext4-ordered", "--out", str(out), check_rc=0)
    baseline = json.loads((out / "results.json").read_text())
    for case in baseline["cases"].values():  # a synthetic baseline 1000x faster than this machine
        for stats in case["latency"].values():
            for k in stats:
                stats[k] /= 1000
    (pc.tmp / "baseline.json").write_text(json.dumps(baseline))
    p = pc.run("corpus", "run", "--entries", "create-pwrite-fsync", "--rows", "ext4-ordered",
               "--baseline", str(pc.tmp / "baseline.json"), "--latency-floor-us", "0", "--out", str(pc.tmp / "second"),
               check_rc=1)
    assert "latency regressions" in p.stdout
    results = json.loads((pc.tmp / "second" / "results.json").read_text())
    regs = results["cases"]["create-pwrite-fsync@ext4-ordered"]["regressions"]
    assert any(r.startswith("fsync ") for r in regs)
    # --latency-factor: 1000x slower than the baseline is no regression when the factor allowed is 100000
    p = pc.run("corpus", "run", "--entries", "create-pwrite-fsync", "--rows", "ext4-ordered",
               "--baseline", str(pc.tmp / "baseline.json"), "--latency-floor-us", "0", "--latency-factor", "100000",
               "--out", str(pc.tmp / "third"), check_rc=0)
    third = json.loads((pc.tmp / "third" / "results.json").read_text())
    assert third["cases"]["create-pwrite-fsync@ext4-ordered"]["regressions"] == [], third


def test_tools_the_suite_cannot_give_end_the_corpus_run_in_one_line(pc: PcEnv) -> None:
    # Had once before the cases (harness/corpus/run.py run_cases), not failed in each case.
    p = pc.run("corpus", "run", "--tools", "debian:hamm", "--entries", "create-pwrite-fsync,append-fsync",
               "--rows", "ext4-ordered,xfs-default", "--out", str(pc.tmp / "out"), check_rc=2)
    assert p.stdout == "" and p.stderr.count("\n") == 1 and p.stderr.startswith("powercut: --tools debian:hamm: ")
    assert not (pc.tmp / "out" / "results.json").exists()


@pytest.mark.e2e
@needs_root_stack
def test_promote_a_run_into_the_corpus(pc: PcEnv) -> None:
    run = pc.tmp / "run"
    pc.run("run", str(WORKLOADS / "stale_writeback.json"), "--fs", "ext4", "--size", "32",
           "--mount-opts", "data=writeback,nodelalloc", "--out", str(run), check_rc=1)
    corpus = pc.tmp / "corpus"
    corpus.mkdir()
    p = pc.run("corpus", "promote", str(run), "--why", "stale data under writeback", "--corpus", str(corpus),
               "--name", "promoted-stale", check_rc=0)
    entry = load_entry(corpus / "promoted" / "promoted-stale.json")
    assert entry.expect == {"ext4-writeback": ["stale-data"], "default": []} and entry.fs == ["ext4"]
    assert "ext4-writeback" in p.stdout
    # corpus list shows it with its expectation
    listed = pc.run("corpus", "list", "--corpus", str(corpus), check_rc=0).stdout.splitlines()
    assert len(listed) == 1 and listed[0].startswith("promoted-stale ") and "ext4-writeback: stale-data" in listed[0]
    # the row it was promoted into is a row of the repository's matrix, with the run's mount options
    rows = {r.name: r for r in load_matrix(CORPUS_DIR / "matrix.json")}
    assert rows["ext4-writeback"].fs == "ext4" and "data=writeback" in rows["ext4-writeback"].mount_opts
    # --matrix: the row is looked up in that matrix; --row names it outright
    matrix = pc.tmp / "matrix.json"
    matrix.write_text(json.dumps({"format": "powercut-matrix/1", "rows": [
        {"name": "product-a", "fs": "ext4", "mount_opts": "data=writeback,nodelalloc"}]}))
    p = pc.run("corpus", "promote", str(run), "--why", "w", "--corpus", str(corpus), "--name", "in-product",
               "--matrix", str(matrix), check_rc=0)
    assert load_entry(corpus / "promoted" / "in-product.json").expect == {"product-a": ["stale-data"], "default": []}
    p = pc.run("corpus", "promote", str(run), "--why", "w", "--corpus", str(corpus), "--name", "named-row",
               "--row", "ext4-journal", check_rc=0)
    assert load_entry(corpus / "promoted" / "named-row.json").expect == {"ext4-journal": ["stale-data"], "default": []}


def test_runnable_skips_rows_this_host_cannot_run(pc: PcEnv) -> None:
    matrix = pc.tmp / "m.json"
    matrix.write_text(json.dumps({"format": "powercut-matrix/1", "rows": [{"name": "odd", "fs": "nilfs9"}]}))
    p = pc.run("corpus", "run", "--matrix", str(matrix), "--runnable", "--entries", "append-fsync",
               "--out", str(pc.tmp / "out"), check_rc=2)
    assert p.stderr.splitlines() == [
        "powercut corpus: skipping row odd: unknown --fs 'nilfs9': choose one of ext4, xfs, btrfs, f2fs",
        "powercut: no matrix row left after --fs/--rows and --runnable"], p.stderr

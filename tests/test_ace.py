"""The pruned, ordered ACE-style seq-2/seq-3 space (workloads/ace.py): its workloads
run on the real kernel with every core op succeeding and the model agreeing, it is
ordered likeliest first with different shapes first, and `powercut fuzz --engine
exhaustive --seq 2` walks it in that order through the whole stack."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from checkers.history import build_history
from conftest import BUILD, PcEnv, needs_root_stack
from workloads import ace, exhaustive
from workloads.format import parse_workload
from workloads.plan import build_plan, render_plan
from workloads.results import read_records

pytestmark = pytest.mark.skipif(not (BUILD / "pc-exec").exists(), reason="build/pc-exec not built (make test)")


def execute(tmp: Path, doc: dict):
    """pc-exec on a scratch directory of the host: the model's history of DOC."""
    plan = build_plan(parse_workload(doc))
    tmp.mkdir(parents=True)
    (tmp / "fs").mkdir()
    (tmp / "plan").write_text(render_plan(plan))
    subprocess.run([str(BUILD / "pc-exec"), "--plan", str(tmp / "plan"), "--dir", str(tmp / "fs"),
                    "--out", str(tmp / "records"), "--mark-file", str(tmp / "marks")], check=True, capture_output=True)
    results = read_records(tmp / "records", plan)
    return build_history(plan, results, list(enumerate((tmp / "marks").read_text().splitlines()))), tmp / "fs"


def test_the_start_state_is_the_set_up(tmp_path: Path) -> None:
    """ace.START (the namespace its model starts from) is what exhaustive.SETUP leaves."""
    _, root = execute(tmp_path / "setup", {"format": "powercut-workload/1", "name": "setup",
                                            "threads": [{"name": "main", "ops": exhaustive.SETUP}]})
    found = {".": "dir"}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        for n in dirs:
            found[os.path.normpath(os.path.join(rel, n))] = "dir"
        for n in files:
            found[os.path.normpath(os.path.join(rel, n))] = "file"
    assert found == ace.START


@pytest.mark.slow  # 60 workloads, each set-up syncing the host: minutes, not the seconds `quick` means
@pytest.mark.timeout(1800)  # each workload's set-up syncs the host: slow on a loaded machine
@pytest.mark.parametrize("seq", [2, 3])
def test_every_core_op_succeeds_on_the_kernel_and_the_model_agrees(tmp_path: Path, seq: int) -> None:
    """The first 30 workloads (a short campaign's start) and 30 spread over the rest:
    no failed call, no disagreement, and the namespace the kernel leaves is the model's."""
    n = exhaustive.space_size(seq)
    picked = sorted(set(range(30)) | set(range(30, n, n // 30)))
    docs = {i: exhaustive.workload(seq, i) for i in picked}
    # Each run waits mostly for its set-up's sync(2), not for a CPU: four at a time, in
    # their own directories (the checks below read each one's own records and tree).
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = dict(zip(picked, pool.map(lambda i: execute(tmp_path / str(i), docs[i]), picked)))
    for i in picked:
        doc, (h, root) = docs[i], runs[i]
        # Hundreds of xattrs fill an ext4 inode's xattr block: ENOSPC after the first few (modelled)
        failed = [ex.describe() for ex in h.execs if not ex.ok
                  and not (ex.kind == "setxattr" and ex.f("count") > 1 and ex.rec.errno == errno.ENOSPC)]
        assert failed == [] and h.disagreements == [], (doc["description"], failed, h.disagreements)
        on_disk = {os.path.relpath(os.path.join(d, x), root) for d, dirs, files in os.walk(root) for x in dirs + files}
        assert on_disk == set(h.ns[-1]) - {"."}, doc["description"]


def test_likely_shapes_first_and_each_shape_once_before_any_twice() -> None:
    sp = ace.space(2)
    assert sum(sp.tiers.values()) == exhaustive.space_size(2) == len(set(sp.order))
    first = sp.tiers[0]
    for i in range(first):  # tier 0: a namespace or xattr op, then an fsync of what it touched
        chain, states, persists = sp.steps(i)
        last, p = chain[-1], persists[-1]
        assert (last.namespace or last.meta) and p is not None and p[0] == "fsync" and p[1] in last.objects | last.dirs
    chain, _, persists = sp.steps(first)
    assert ace._tier(chain, persists) > 0
    # Round-robin over shape classes: the first workloads of tier 0 are all of different shapes.
    shapes = [shape_of(sp, i) for i in range(first)]
    distinct = len(set(shapes))
    assert len(set(shapes[:distinct])) == distinct > 100


def shape_of(sp: ace.Space, i: int) -> str:
    chain, states, persists = sp.steps(i)
    return "|".join(f"{ace._core_class(c, states[k])}.{ace._persist_class(p, chain[-1])}"
                    for k, (c, p) in enumerate(zip(chain, persists)))


@needs_root_stack
def test_fuzz_exhaustive_seq2_walks_the_ordered_space(pc: PcEnv) -> None:
    out = pc.tmp / "camp"
    p = pc.run("fuzz", "--fs", "ext4", "--backend", "fuse", "--engine", "exhaustive", "--seq", "2",
               "--max-workloads", "4", "--jobs", "2", "--out", str(out), "--duration", "10m")
    assert p.returncode in (0, 1), p.stdout + p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["exhaustive"]["space"] == exhaustive.space_size(2)
    runs = [json.loads(line) for f in (out / "journal").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert len([r for r in runs if not r.get("shrink")]) >= 4
    assert all(r["name"].startswith("ace2-") for r in runs if not r.get("shrink"))
    # Worker wN walks positions N, N+2, ... from the start of the order (how far each gets
    # depends on the machine: one may be shrinking a finding while the other walks on).
    for n in range(2):
        mine = [json.loads(line)["index"] for line in (out / "journal" / f"w{n}.jsonl").read_text().splitlines()
                if not json.loads(line).get("shrink")]
        assert mine == list(range(n, n + 2 * len(mine), 2)), (n, mine)


def _crc32c(seed: int, data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected) without the final inversion, as the kernel's crc32c()."""
    crc = seed
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc


def test_the_set_up_xattr_names_share_one_btrfs_name_hash() -> None:
    """btrfs keys an xattr item by crc32c(~1, name) (fs/btrfs/ctree.h btrfs_name_hash); names
    with the same hash are packed into one item, the state the set-up gives foo."""
    from workloads.vocab import XATTRS
    hashes = {_crc32c(0xFFFFFFFE, n.encode()) for n in XATTRS}
    assert len(XATTRS) == 2 and len(hashes) == 1
    names = [op["name"] for op in exhaustive.SETUP if op["op"] == "setxattr" and op["path"] == ace.XATTR_FILE]
    assert names == XATTRS


def test_a_file_with_many_xattrs_is_freed_while_the_workload_goes_on() -> None:
    """The many-xattrs op: its file has an fd only while a step uses it, so an unlink frees it
    during the workload; then an fsync tail runs while the file system frees it in the
    background. Tier 0 has the shape (xattrs, fsync, unlink, fsync of the directory)."""
    sp = ace.space(2)
    first = next(i for i in range(sp.tiers[0]) if ace.describe(2, i).startswith("xattrs(foo) fsync(foo); unlink(foo)"))
    ops = ace.workload(2, first)["threads"][0]["ops"]
    kinds = [(op["op"], op.get("path"), op.get("fd")) for op in ops]
    many = next(k for k, op in enumerate(ops) if op["op"] == "setxattr" and op.get("count", 1) > 1)
    unlink = kinds.index(("unlink", "foo", None))
    fd = ops[many + 1]["fd"]
    assert ops[many + 1]["op"] == "fsync" and ("close", None, fd) in kinds[many + 1:unlink]
    assert [op["op"] for op in ops[-3:]] == ["open", "repeat", "close"] and ops[-2]["count"] > 1
    # No tail where the file keeps its name (a link of it into another directory).
    kept = next(i for i in range(sp.tiers[0]) if ace.describe(2, i).startswith("xattrs(foo) fsync(foo); link(foo,"))
    assert ace.workload(2, kept)["threads"][0]["ops"][-2]["op"] != "repeat"

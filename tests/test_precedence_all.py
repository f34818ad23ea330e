"""Every multi-error case of the namespace ops, on each file system, against the model.

A small namespace (directories A, A/C and an empty B, files foo and A/foo, a
symlink to a directory, one to a file, a dangling one) and every path a
workload can name in it: present or missing, under a file, under a missing
directory, through each symlink, the directory itself with a last "." ("A/.",
"."), and "." components inside ("./foo", "A/./foo"). Each op kind that can
fail in several ways at once (mkdir, rmdir, unlink, symlink, truncate, open
with each kind of flags, link, rename with each renameat2 flag) runs on every
path, or pair of paths, in a namespace of its own, on a real loop device with
ext4, xfs and btrfs and the host kernel; the model must predict every answer
(none disagrees), and every case must be one it predicts (an errno the kernel
never gives there is a disagreement). What decides each answer is in
docs/semantics.md ("Error precedence").

Found this way: a last "." (rmdir("A/.") is EINVAL, unlink EISDIR, mkdir and
symlink EEXIST, rename EBUSY or, under RENAME_NOREPLACE, EEXIST) and "."
components ("./foo" is foo: the model took it for a missing name and lost
track of the file).
"""

from __future__ import annotations

import dataclasses
import errno as E
import itertools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkers.history import build_history
from common import exec_plan, require_exec, require_root
from foundation import kmount, ownership
from foundation.filesystems import get_fs
from foundation.loopdev import LoopDevice
from workloads.format import parse_workload
from workloads.plan import build_plan

pytestmark = [pytest.mark.e2e, require_root, require_exec]

SETUP = [{"op": "mkdir", "path": "A"}, {"op": "mkdir", "path": "A/C"}, {"op": "mkdir", "path": "B"},
         {"op": "creat", "path": "foo", "fd": "s"}, {"op": "close", "fd": "s"},
         {"op": "creat", "path": "A/foo", "fd": "t"}, {"op": "close", "fd": "t"},
         {"op": "symlink", "target": "A", "path": "ls"}, {"op": "symlink", "target": "foo", "path": "lf"},
         {"op": "symlink", "target": "missing", "path": "ld"}]
PATHS = ["foo", "A", "B", "A/C", "A/foo", "ls", "lf", "ld", "missing", "missing/x", "foo/x", "A/C/x", "A/new",
         "ls/foo", "ld/x", "lf/x", ".", "A/.", "foo/.", "missing/.", "./foo", "A/./foo", "./A"]
OPENS = [["O_RDONLY"], ["O_WRONLY"], ["O_CREAT", "O_RDWR"], ["O_CREAT", "O_EXCL", "O_RDWR"], ["O_RDONLY", "O_TRUNC"],
         ["O_TMPFILE", "O_RDWR"], ["O_TMPFILE", "O_RDONLY"], ["O_CREAT", "O_TMPFILE", "O_RDWR"]]
PAIRS = [a for a in PATHS if a not in (".",)]   # rename/link of the root itself is not judged
BATCH = 120   # cases per executor run (the model copies the namespace per change: keep it small)


def cases() -> Iterator[dict[str, Any]]:
    for p in PATHS:
        yield from ({"op": "mkdir", "path": p}, {"op": "rmdir", "path": p}, {"op": "unlink", "path": p},
                    {"op": "symlink", "target": "foo", "path": p}, {"op": "truncate", "path": p, "length": 0})
        for flags in OPENS:
            yield {"op": "open", "path": p, "flags": flags, "fd": "x"}
    for a, b in itertools.product(PAIRS, PAIRS):
        yield {"op": "link", "from": a, "to": b}
        for flags in ([], ["NOREPLACE"], ["EXCHANGE"]):  # both at once: EINVAL first (test_precedence.py)
            yield {"op": "rename", "from": a, "to": b, **({"flags": flags} if flags else {})}


def in_dir(op: dict[str, Any], d: str, n: int) -> dict[str, Any]:
    """OP with its paths under D and its fd names made unique by N (symlink targets stay relative)."""
    out = dict(op)
    for k in ("path", "from", "to"):
        if k in out:
            out[k] = f"{d}/{out[k]}"
    if "fd" in out:
        out["fd"] += str(n)
    return out


def batch_ops(batch: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for n, case in batch:
        d = f"c{n}"
        ops += [{"op": "mkdir", "path": d}] + [in_dir(op, d, n) for op in SETUP]
        ops.append({**in_dir(case, d, n), "id": f"case{n}"})
        if "fd" in case:
            ops.append({"op": "close", "fd": f"x{n}"})
    return ops


def run_batch(mnt: Path, k: int, batch: list[tuple[int, dict[str, Any]]]) -> tuple[list[str], set[str], set[str]]:
    """The disagreements of one batch, its case ids, and those a tampered errno makes disagree."""
    plan = build_plan(parse_workload({"format": "powercut-workload/1", "name": "precedence",
                                      "threads": [{"name": "m", "ops": batch_ops(batch)}]}))
    work = mnt / f"b{k}"
    results, marks = exec_plan(plan, work)
    h = build_history(plan, results, marks)
    ids = {op.seq: op.id for _, op in plan.ops() if op.id}
    tampered = dataclasses.replace(results, records=tuple(
        dataclasses.replace(r, ret=-1, errno=E.EROFS) if r.seq in ids else r for r in results.records))
    judged = {d.ex.op.id for d in build_history(plan, tampered, marks).disagreements if d.ex.op.id}
    subprocess.run(["rm", "-rf", str(work)], check=True)
    return [f"{d.ex.describe()}: {d.expected}" for d in h.disagreements], set(ids.values()), judged


@pytest.fixture(params=["ext4", "xfs", "btrfs"])
def mounted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    fs = get_fs(request.param)
    img, mnt = str(tmp_path / "fs.img"), tmp_path / "mnt"
    os.close(ownership.create_file(img, 320 << 20))
    subprocess.run(fs.mkfs_cmd(img, ""), check=True, capture_output=True)
    dev = LoopDevice(img)
    mnt.mkdir()
    try:
        kmount.mount(dev.path, str(mnt), request.param)
        try:
            yield mnt
        finally:
            kmount.umount(str(mnt))
    finally:
        dev.close()


def test_every_multi_error_case_is_predicted_as_linux_answers(mounted: Path) -> None:
    all_cases = list(enumerate(cases()))
    disagreements, ids, judged = [], set(), set()
    for k in range(0, len(all_cases), BATCH):
        d, i, j = run_batch(mounted, k, all_cases[k:k + BATCH])
        disagreements += d
        ids |= i
        judged |= j
    assert disagreements == []
    assert len(ids) == len(all_cases) > 2000 and judged == ids, sorted(ids - judged)[:10]

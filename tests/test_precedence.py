"""Error precedence: where several errors apply to one call, the model predicts the
one Linux returns. Each case runs on the real kernel (pc-exec on a scratch
directory, then `powercut run` on the fuse backend for ext4, xfs and btrfs) and
the model must agree with every errno; a tampered errno must disagree, so each
case is one the model does predict.

Found by a btrfs campaign: `link(B, A/bar)` with B a directory and A missing
was "expected EPERM, the kernel returned ENOENT" (fs/namei.c do_linkat looks
the new name's parent up before vfs_link refuses a directory)."""

from __future__ import annotations

import dataclasses
import errno as E
import json
from pathlib import Path

import pytest

from checkers.history import build_history
from common import exec_plan
from conftest import BUILD, WORKLOADS, PcEnv, needs_root_stack
from workloads.format import parse_workload
from workloads.plan import build_plan

pytestmark = pytest.mark.skipif(not (BUILD / "pc-exec").exists(), reason="build/pc-exec not built (make test)")

CASES = WORKLOADS / "error_precedence.json"
TMPFILE = WORKLOADS / "tmpfile_linkat.json"


def cases(path: Path) -> tuple[list[dict], list[tuple[dict, int | tuple[int, ...]]]]:
    """The workload's ops, and each case op with the errno(s) Linux gives it (0: success)."""
    doc = json.loads(path.read_text())
    ops = doc["threads"][0]["ops"]
    want = {op["id"]: op for op in ops if "id" in op}
    table = [(want[k], v) for k, v in WANT[path.name].items()]
    assert len(table) == len(want)
    return ops, table


# id -> what Linux returns, and why (fs/namei.c unless named otherwise).
EXPECTED: dict[str, int | tuple[int, ...]] = {
    "link-dir-to-missing-parent": E.ENOENT,   # do_linkat: filename_create (new parent) before vfs_link's EPERM
    "link-dir-under-a-file": E.ENOTDIR,       # the same, the new parent is a file
    "link-dir-over-a-name": E.EEXIST,         # filename_create: an existing name before vfs_link
    "link-dir": E.EPERM,                      # vfs_link: a directory cannot be linked
    "link-src-before-dst": E.ENOTDIR,         # filename_lookup(old) before filename_create(new)
    "rename-dst-parent-first": E.ENOTDIR,     # do_renameat2: both parents before the source's lookup
    "rename-src-parent-first": E.ENOTDIR,     # the old parent before the new one
    "rename-file-over-dir": E.EISDIR,         # vfs_rename -> may_delete(target, isdir=0)
    "rename-dir-over-file": E.ENOTDIR,        # may_delete(target, isdir=1)
    "rename-dir-over-nonempty": (E.ENOTEMPTY, E.EEXIST),  # the fs decides: rename(2) allows both (xfs: EEXIST)
    "rename-dir-into-itself": E.EINVAL,       # source is the lock_rename trap
    "rename-dir-over-ancestor": E.ENOTEMPTY,  # target is the trap
    "noreplace-before-eisdir": E.EEXIST,      # RENAME_NOREPLACE checked right after the target's lookup
    "exchange-missing-target": E.ENOENT,      # RENAME_EXCHANGE needs both
    "exchange-with-ancestor": E.EINVAL,       # target is the trap: EINVAL when exchanging
    "noreplace-and-exchange": E.EINVAL,       # renameat2(2): the two flags together, before any lookup
    "creat-on-dir": E.EISDIR,                 # do_open: O_CREAT on a directory, any access mode
    "excl-before-eisdir": E.EEXIST,           # do_open: O_EXCL checked before the directory
    "trunc-on-dir": E.EISDIR,                 # may_open: O_TRUNC asks for write access
    "exchange-file-and-dir": 0,               # RENAME_EXCHANGE swaps any two kinds
}
# O_TMPFILE (open(2)) and linkat(2) with AT_EMPTY_PATH.
EXPECTED_TMPFILE: dict[str, int | tuple[int, ...]] = {
    "tmpfile-readonly-before-lookup": E.EINVAL,  # fs/open.c build_open_flags: needs write access, before lookup
    "tmpfile-missing-dir": E.ENOENT,
    "tmpfile-in-a-file": E.ENOTDIR,              # O_TMPFILE carries O_DIRECTORY
    "tmpfile-excl": 0,
    "linkat-excl-tmpfile": E.ENOENT,             # O_EXCL: not I_LINKABLE, vfs_link's nlink == 0 check
    "tmpfile": 0,
    "linkat-missing-parent": E.ENOENT,           # filename_create first
    "linkat-over-a-name": E.EEXIST,
    "linkat-tmpfile": 0,
    "linkat-unlinked-file": E.ENOENT,            # a file whose names are gone and never was a tmpfile
    "linkat-dir": E.EPERM,                       # vfs_link: a directory
}
WANT = {CASES.name: EXPECTED, TMPFILE.name: EXPECTED_TMPFILE}


def run_exec(tmp: Path, ops: list[dict], tamper=None):
    """pc-exec on a scratch directory (the host's file system, the real kernel): the model's history."""
    plan = build_plan(parse_workload({"format": "powercut-workload/1", "name": "precedence",
                                      "threads": [{"name": "main", "ops": ops}]}))
    results, marks = exec_plan(plan, tmp)
    if tamper:
        results = dataclasses.replace(results, records=tuple(tamper(r) for r in results.records))
    return build_history(plan, results, marks)


@pytest.mark.parametrize("path", [CASES, TMPFILE], ids=["precedence", "tmpfile"])
def test_the_model_predicts_the_errno_linux_returns(tmp_path: Path, path: Path) -> None:
    ops, table = cases(path)
    h = run_exec(tmp_path / "real", ops)
    got = {ex.op.id: (0 if ex.ok else ex.rec.errno) for ex in h.execs if ex.op.id}
    for op, want in table:
        wants = want if isinstance(want, tuple) else (want,)
        assert got[op["id"]] in wants, f"{op['id']}: the kernel returned {E.errorcode.get(got[op['id']])}"
    assert [d.expected for d in h.disagreements] == []
    # Each error case is predicted: an errno the kernel never gives there is a disagreement.
    ids = {op["id"] for op, want in table if want}

    def tamper(r):
        return dataclasses.replace(r, ret=-1, errno=E.EROFS) if r.seq in seqs else r

    seqs = {ex.op.seq for ex in h.execs if ex.op.id in ids}
    tampered = run_exec(tmp_path / "tampered", ops, tamper)
    assert sorted(d.ex.op.id for d in tampered.disagreements) == sorted(ids)


@needs_root_stack
@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
@pytest.mark.parametrize("path", [CASES, TMPFILE], ids=["precedence", "tmpfile"])
def test_error_precedence_on_each_file_system(pc: PcEnv, fs: str, path: Path) -> None:
    """Through the whole stack (fuse recorder, the file system, the oracle, every crash point):
    no finding. The tmpfile workload writes and fsyncs a file with no name, then names it
    and fsyncs it again (xfstests generic/509: an fsynced tmpfile must mount cleanly)."""
    out = pc.tmp / "run"
    p = pc.run("run", str(path), "--fs", fs, "--backend", "fuse", "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    assert p.returncode == 0 and report["crash_states_checked"] > 0, p.stdout + p.stderr


def test_exchange_moves_the_names_under_each_side(tmp_path: Path) -> None:
    """renameat2(RENAME_EXCHANGE) of a directory with a child and a file: the child moves
    with its directory and no name stays behind (the model kept D/sub: found by running
    the ACE space on the kernel, tests/test_ace.py)."""
    ops = [{"op": "mkdir", "path": "D"}, {"op": "mkdir", "path": "D/sub"},
           {"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "f"}, {"op": "close", "fd": "f"},
           {"op": "rename", "from": "D", "to": "foo", "flags": ["EXCHANGE"]}]
    h = run_exec(tmp_path, ops)
    on_disk = sorted(str(p.relative_to(tmp_path / "fs")) for p in (tmp_path / "fs").rglob("*"))
    assert on_disk == sorted(set(h.ns[-1]) - {"."}) == ["D", "foo", "foo/sub"]

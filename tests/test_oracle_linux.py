"""The linux tier's rules (checkers/fsrules.py), one test per rule: a real
pc-exec run on a scratch directory gives the records and marks; the test then
turns the directory into the outcome the xfstests test behind the rule guards
against and hands it to the oracle: a finding under `linux` on the file
systems the rule holds on, none on the legal states, none under `posix`,
none where the rule names an exception (btrfs, ext4 without a journal)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from checkers.fsrules import RULES, Semantics
from checkers.oracle import ContentOracle
from foundation.sparse import punch_hole
from test_oracle import Run

FS = ["ext4", "xfs", "btrfs"]


def rules(run: Run, point: int, fs: str, tier: str = "linux", mkfs_opts: str = "") -> list[str]:
    oracle = ContentOracle(run.history, run.plan.wid, fs, semantics=Semantics(tier, fs, mkfs_opts))
    return [f.evidence["rule"] for f in oracle.inspect(str(run.dir), point)]


def op(kind: str, **fields) -> dict:
    return {"op": kind, **fields}


def create(path: str, fd: str = "f", length: int = 4096) -> list[dict]:
    ops = [op("open", path=path, flags=["O_CREAT", "O_RDWR"], fd=fd)]
    return ops + [op("pwrite", fd=fd, offset=0, length=length)] if length else ops


def fsync_dir(path: str) -> list[dict]:
    return [op("open", path=path, flags=["O_RDONLY"], fd="d"), op("fsync", fd="d"), op("close", fd="d")]


def last(run: Run) -> int:
    return run.marks[-1][0]


def test_every_linux_rule_cites_tests_and_names_its_file_systems() -> None:
    linux = [r for r in RULES.values() if r.tier == "linux"]
    assert {r.name for r in linux} >= {"fsync-names", "fsync-dir-entries", "fsync-unlinked", "fallocate-fsync",
                                       "ordered-metadata"}
    for r in linux:
        # an xfstests test (generic/NNN, or a file system's own: f2fs/NNN) or a list statement
        assert r.fs and re.search(r"\b(generic|btrfs|xfs|ext4|f2fs)/\d{3}", r.reference) or "LKML" in r.reference, r.name
    assert "btrfs" not in RULES["ordered-metadata"].fs


@pytest.mark.parametrize("fs", FS)
def test_fsync_after_rename_makes_the_new_name_durable(tmp_path: Path, fs: str) -> None:
    """generic/322, 376, 534: the renamed file, fsynced, is at its new name only."""
    ops = [op("mkdir", path="d")] + create("d/foo") + [op("sync"), op("rename", **{"from": "d/foo", "to": "d/bar"}),
                                                       op("fsync", fd="f"), op("close", fd="f")]
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.rename(run.dir / "d/bar", run.dir / "d/foo")  # the rename lost
    assert rules(run, run.before(4), fs) == []       # legal before the fsync returned
    assert rules(run, last(run), fs) == ["fsync-names", "fsync-names"]  # bar missing, foo back
    assert rules(run, last(run), fs, tier="posix") == []
    assert rules(run, last(run), "ext4", mkfs_opts="-O ^has_journal") == []


@pytest.mark.parametrize("fs", FS)
def test_fsync_of_a_new_hard_link_makes_it_durable(tmp_path: Path, fs: str) -> None:
    """generic/343: a new link, the file fsynced: both names present."""
    ops = create("foo") + [op("sync"), op("link", **{"from": "foo", "to": "bar"}), op("fsync", fd="f")]
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.unlink(run.dir / "bar")
    assert rules(run, run.before(4), fs) == []
    assert rules(run, last(run), fs) == ["fsync-names"]
    assert rules(run, last(run), fs, tier="posix") == []


@pytest.mark.parametrize("fs", FS)
def test_fsync_after_removing_a_link_keeps_it_removed(tmp_path: Path, fs: str) -> None:
    """generic/336: one link of a file unlinked, the file fsynced: the link stays gone."""
    ops = create("foo") + [op("link", **{"from": "foo", "to": "bar"}), op("sync"), op("unlink", path="bar"),
                           op("fsync", fd="f")]
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.link(run.dir / "foo", run.dir / "bar")  # the unlink lost
    assert rules(run, run.before(5), fs) == []
    assert rules(run, last(run), fs) == ["fsync-names"]


@pytest.mark.parametrize("fs", FS)
def test_fsync_of_an_unlinked_file_persists_the_deletion(tmp_path: Path, fs: str) -> None:
    """generic/764, 771: fsync through an fd whose file has no name left: it stays deleted."""
    ops = create("foo", length=0) + [op("sync"), op("unlink", path="foo"), op("fsync", fd="f"), op("close", fd="f")]
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    (run.dir / "foo").write_bytes(b"")  # the (empty) file back after the crash
    assert rules(run, run.before(3), fs) == []
    assert rules(run, last(run), fs) == ["fsync-unlinked"]
    assert rules(run, last(run), fs, tier="posix") == []


@pytest.mark.parametrize("fs", FS)
def test_fsync_of_a_directory_persists_its_entries_and_its_own_name(tmp_path: Path, fs: str) -> None:
    """generic/348, 690, 779 (symlinks), 782 (root), 498 (the new directory itself)."""
    ops = ([op("mkdir", path="A"), op("sync"), op("symlink", target="t1", path="A/s"),
            op("rename", **{"from": "A/s", "to": "A/s2"}), op("mkdir", path="B"), op("mkdir", path="B/C")]
           + fsync_dir("A") + fsync_dir(".") + fsync_dir("B/C"))
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.rename(run.dir / "A/s2", run.dir / "A/s")  # the symlink under its old name
    # Before any fsync: the rename lost but the later mkdir B kept is no prefix of the ops.
    assert rules(run, run.before(7), fs) == ([] if fs == "btrfs" else ["ordered-metadata"])
    assert sorted(rules(run, last(run), fs)) == ["fsync-dir-entries", "fsync-dir-entries"]  # s2 missing, s back
    os.rename(run.dir / "A/s", run.dir / "A/s2")
    os.rmdir(run.dir / "B/C")
    os.rmdir(run.dir / "B")  # the root's new entry B lost: fsync(".") and, later, fsync(B/C) promised it
    assert rules(run, last(run), fs) == ["fsync-names"]
    assert rules(run, run.after(10), fs) == ["fsync-dir-entries"]  # after fsync("."), before fsync(B/C)
    assert rules(run, last(run), fs, tier="posix") == ["fsync-new-name"]
    os.mkdir(run.dir / "B")  # B back, B/C (fsynced itself) still missing: only the linux tier requires it
    assert rules(run, last(run), fs) == ["fsync-names"]
    assert rules(run, last(run), fs, tier="posix") == []


@pytest.mark.parametrize("fs", FS)
def test_fallocate_past_eof_and_fsync_keep_size_and_blocks(tmp_path: Path, fs: str) -> None:
    """generic/483 (KEEP_SIZE: blocks kept past EOF), 512 (no KEEP_SIZE: the new size)."""
    ops = (create("k") + [op("fallocate", fd="f", mode=["KEEP_SIZE"], offset=4096, length=1 << 20),
                          op("fsync", fd="f")]
           + create("g", fd="g") + [op("fallocate", fd="g", mode=[], offset=4096, length=65536),
                                    op("fsync", fd="g")])
    run = Run(tmp_path, ops)
    if os.stat(run.dir / "k").st_blocks * 512 < 1 << 20:
        pytest.skip("the scratch file system does not keep fallocated blocks")
    assert rules(run, last(run), fs) == []
    data = (run.dir / "k").read_bytes()
    os.unlink(run.dir / "k")
    (run.dir / "k").write_bytes(data)  # same bytes and size, the reserved blocks gone
    assert rules(run, last(run), fs) == ["fallocate-fsync"]
    assert rules(run, last(run), fs, tier="posix") == []
    os.truncate(run.dir / "g", 4096)  # the grown size lost: fsync-data, both tiers
    assert sorted(rules(run, last(run), fs)) == ["fallocate-fsync", "fsync-data"]


@pytest.mark.parametrize("fs", FS)
def test_reserved_blocks_freed_are_found_behind_more_data_blocks(tmp_path: Path, fs: str) -> None:
    """generic/677: 1 MiB of data, 64 KiB reserved past EOF, fsync: with the reservation freed
    the file still holds more blocks than were reserved; the reserved range itself is unmapped."""
    ops = create("foo", length=1 << 20) + [op("fallocate", fd="f", mode=["KEEP_SIZE"], offset=1 << 20, length=65536),
                                           op("fsync", fd="f"), op("close", fd="f")]
    run = Run(tmp_path, ops)
    if os.stat(run.dir / "foo").st_blocks * 512 < (1 << 20) + 65536:
        pytest.skip("the scratch file system does not keep fallocated blocks")
    assert rules(run, last(run), fs) == []
    os.truncate(run.dir / "foo", (1 << 20) + 65536)  # grow, punch, shrink: only the reservation goes
    fd = os.open(run.dir / "foo", os.O_RDWR)
    try:
        punch_hole(fd, 1 << 20, 65536)
    finally:
        os.close(fd)
    os.truncate(run.dir / "foo", 1 << 20)
    assert rules(run, last(run), fs) == ["fallocate-fsync"]


@pytest.mark.parametrize("fs", FS)
def test_fsync_of_a_parent_persists_an_earlier_move_except_on_btrfs(tmp_path: Path, fs: str) -> None:
    """generic/335: foo moved from a/b to c, a/bar created, a fsynced: foo is only in c
    on ext4 and xfs (ordered metadata); btrfs is excused by the test itself."""
    ops = ([op("mkdir", path="a"), op("mkdir", path="a/b"), op("mkdir", path="c")] + create("a/b/foo")
           + [op("close", fd="f"), op("sync"), op("rename", **{"from": "a/b/foo", "to": "c/foo"})]
           + create("a/bar", fd="g") + [op("close", fd="g")] + fsync_dir("a"))
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.rename(run.dir / "c/foo", run.dir / "a/b/foo")  # the move lost, a/bar kept
    expected = ["ordered-metadata", "ordered-metadata"] if fs != "btrfs" else []
    assert sorted(rules(run, last(run), fs)) == expected
    assert rules(run, last(run), fs, tier="posix") == []
    # Before the fsync, a/bar kept with the earlier move lost is no prefix (ext4, xfs);
    # both lost is.
    assert rules(run, run.before(12), fs) == ([] if fs == "btrfs" else ["ordered-metadata"])
    os.unlink(run.dir / "a/bar")
    assert rules(run, run.before(12), fs) == []


@pytest.mark.parametrize("fs", FS)
def test_names_are_a_prefix_of_the_namespace_ops_on_ext4_and_xfs(tmp_path: Path, fs: str) -> None:
    """Ordered metadata without any fsync: x created before y, so y without x
    is no prefix (LKML 2018-09-14, Dave Chinner); btrfs: not claimed here."""
    ops = [op("mkdir", path="x"), op("mkdir", path="y"), op("mkdir", path="z")]
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.rmdir(run.dir / "z")  # a suffix lost: legal everywhere
    assert rules(run, last(run), fs) == []
    os.rmdir(run.dir / "x")  # y and not x: not a prefix
    assert rules(run, last(run), fs) == (["ordered-metadata"] if fs != "btrfs" else [])
    assert rules(run, last(run), fs, tier="posix") == []
    assert rules(run, last(run), "ext4", mkfs_opts="-O ^has_journal") == []


@pytest.mark.parametrize("fs", FS)
def test_an_xattr_removed_before_a_durable_namespace_op_stays_removed(tmp_path: Path, fs: str) -> None:
    """generic/066 (its second power cut): an xattr removed, a link added, another file
    fsynced: the removal is durable on ext4 and xfs, which journal xattr changes in the
    same order as namespace ops; btrfs is not claimed by this rule."""
    ops = (create("foo", length=0) + [op("close", fd="f"), op("setxattr", path="foo", name="user.a", length=4),
                                      op("sync"), op("removexattr", path="foo", name="user.a"),
                                      op("link", **{"from": "foo", "to": "foo_link"})]
           + create("qwerty", fd="g", length=0) + [op("fsync", fd="g"), op("close", fd="g")])
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.setxattr(run.dir / "foo", "user.a", b"back")  # the removal lost (seen at foo and foo_link)
    assert rules(run, last(run), fs) == (["ordered-metadata"] * 2 if fs != "btrfs" else [])
    assert rules(run, run.before(7), fs) == []      # legal before the fsync returned
    assert rules(run, last(run), fs, tier="posix") == []


@pytest.mark.parametrize("fs", FS)
def test_fsync_of_a_file_under_a_reused_name_carries_the_old_owner(tmp_path: Path, fs: str) -> None:
    """generic/342 (also 341, 502, 526, 527): a/foo renamed to a/bar after a sync, a new
    a/foo fsynced: a/bar must exist; btrfs logs the inode whose committed name was taken.
    Without the sync the name was never committed: btrfs is not held to it."""
    def ops(sync: bool) -> list[dict]:
        return ([op("mkdir", path="a")] + create("a/foo") + [op("close", fd="f")] + ([op("sync")] if sync else [])
                + [op("rename", **{"from": "a/foo", "to": "a/bar"})] + create("a/foo", fd="g")
                + [op("fsync", fd="g"), op("close", fd="g")])
    for d in ("s", "n"):
        (tmp_path / d).mkdir()
    run = Run(tmp_path / "s", ops(True))
    assert rules(run, last(run), fs) == []
    os.unlink(run.dir / "a/bar")  # the renamed file lost
    assert rules(run, last(run), fs) == ["fsync-names"]
    assert rules(run, last(run), fs, tier="posix") == []
    run = Run(tmp_path / "n", ops(False))
    os.unlink(run.dir / "a/bar")
    assert rules(run, last(run), fs) == ([] if fs == "btrfs" else ["ordered-metadata"])


def exchange(a: str, b: str) -> dict:
    return op("rename", **{"from": a, "to": b, "flags": ["EXCHANGE"]})


@pytest.mark.parametrize("fs", FS)
def test_a_directory_swapped_out_of_a_fsynced_name_keeps_its_entries_apart_on_btrfs(tmp_path: Path, fs: str) -> None:
    """A file F swaps names with directory D after D's own entries were swapped, F is fsynced:
    btrfs logs D only as existing (tree-log.c log_conflicting_inodes, LOG_INODE_EXISTS), so D at
    its new name with its entries as of the sync is a legal state there (generic/341: nothing
    in D lost; generic/335: btrfs does not persist what no fsync asked for); ext4 and xfs keep
    the order. An entry D had only before the sync stays a finding everywhere."""
    ops = ([op("mkdir", path="A"), op("mkdir", path="A/C"), op("symlink", target="t", path="A/foo"),
            op("unlink", path="A/foo")] + create("foo", length=0) + create("A/foo", fd="g", length=0)
           + [op("sync"), exchange("A/C", "A/foo"), exchange("A", "foo"), op("fsync", fd="f")])
    run = Run(tmp_path, ops)
    assert rules(run, last(run), fs) == []
    os.rename(run.dir / "foo/C", run.dir / "x")
    os.rename(run.dir / "foo/foo", run.dir / "foo/C")
    os.rename(run.dir / "x", run.dir / "foo/foo")  # D's entries as of the sync: C a dir, foo a file
    assert set(rules(run, last(run), fs)) == (set() if fs == "btrfs" else {"ordered-metadata"})
    assert rules(run, last(run), fs, tier="posix") == []
    os.unlink(run.dir / "foo/foo")
    os.symlink("t", run.dir / "foo/foo")  # what D held there only before the sync
    assert set(rules(run, last(run), fs)) == ({"no-resurrection"} if fs == "btrfs" else {"ordered-metadata"})


def test_f2fs_rename_after_fsync_is_required_only_with_strict_fsync_or_fastboot(tmp_path: Path) -> None:
    """f2fs: generic/342, 502, 526 and 527 mount it with fsync_mode=strict, 066 and 690 with
    fastboot; in the default posix mode the rename's name need not be durable, the data must."""
    ops = [op("mkdir", path="d")] + create("d/foo") + [op("sync"), op("rename", **{"from": "d/foo", "to": "d/bar"}),
                                                       op("fsync", fd="f"), op("close", fd="f")]
    run = Run(tmp_path, ops)
    os.rename(run.dir / "d/bar", run.dir / "d/foo")  # the rename lost

    def f2fs(mount_opts: str) -> list[str]:
        oracle = ContentOracle(run.history, run.plan.wid, "f2fs",
                               semantics=Semantics("linux", "f2fs", "", mount_opts))
        return [f.evidence["rule"] for f in oracle.inspect(str(run.dir), last(run))]
    assert f2fs("") == [] and f2fs("fsync_mode=posix") == []
    assert f2fs("fsync_mode=strict") == ["fsync-names", "fsync-names"]
    assert f2fs("fastboot,noatime") == ["fsync-names", "fsync-names"]
    (run.dir / "d/foo").write_bytes(b"")              # and the fsynced data lost too: posix fsync-data
    assert f2fs("") == ["fsync-data"]
    assert "f2fs" not in RULES["ordered-metadata"].fs

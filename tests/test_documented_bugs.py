"""The documented bugs (checkers/documented_bugs.json) and docs/bugs/README.md say the same,
and each bug's shape fits its own shrunk workload; the matcher's kernel rule (a kernel with
the fix has not the bug)."""

from __future__ import annotations

import json
import re

from checkers import documented_bugs as db
from conftest import ROOT, WORKLOADS

README = ROOT / "docs" / "bugs" / "README.md"


def test_the_table_and_the_readme_agree() -> None:
    text = README.read_text()
    table_reports = set(re.findall(r"\| \[([\w.-]+\.md)\]\(\1\) \|", text))
    bugs = db.bugs()
    assert table_reports == {b["report"] for b in bugs if b.get("report")}
    for b in bugs:
        # a table row links the bug's report; any other bug is named by its id
        assert b.get("report") or f"`{b['id']}`" in text, f"docs/bugs/README.md does not name {b['id']}"
        if b.get("report"):
            assert (README.parent / b["report"]).is_file()
            row = next(ln for ln in text.splitlines() if f"]({b['report']})" in ln)
            assert f"`{b['workload']}`" in row, row
        assert b["class"] in db.CLASSES and b["kinds"] and b["ops"]


def test_each_shape_fits_its_own_workload() -> None:
    for b in db.bugs():
        if not b.get("workload"):
            continue
        doc = json.loads((WORKLOADS / b["workload"]).read_text())
        assert db.holds_ops(b["ops"], doc), b["id"]
        mkfs = " ".join(f"-O {f}" for f in b.get("mkfs_features", []))
        sig = f"{b['kinds'][0]}|-|{(b.get('rules') or ['-'])[0]}" + ("@" + b["crash_state"] if b.get("crash_state") else "")
        mount = ",".join(f"{o}=zstd" for o in b.get("mount_options", []))
        t = db.triage(fs=b["fs"], mkfs_opts=mkfs, signature=sig, doc=doc, mount_opts=mount)
        assert t.verdict == "documented", (b["id"], t)


def test_a_kernel_with_the_fix_has_not_the_bug() -> None:
    doc = json.loads((WORKLOADS / "btrfs_truncate_fsync_link.json").read_text())
    sig = "stale-data|fsync|-"
    on = {k: db.triage(fs="btrfs", mkfs_opts="", signature=sig, doc=doc, kernel=k)
          for k in ("6.12.113+deb12-amd64", "6.12.115+deb12-amd64", "6.1.0-55-amd64", "7.2.13+deb14-amd64")}
    assert on["6.12.113+deb12-amd64"].bug == "btrfs-truncate-fsync-link"
    assert on["6.12.115+deb12-amd64"].verdict == "new" and "has its fix" in on["6.12.115+deb12-amd64"].note
    assert on["6.1.0-55-amd64"].bug == "btrfs-truncate-fsync-link"  # Debian 6.1's uname has no patch level
    assert on["7.2.13+deb14-amd64"].verdict == "new"  # its workload is clean on Debian's 7.2.13 (docs/bugs/)
    # the shape needs its feature: ext4 fast_commit's bug is not plain ext4's, nor `-O ^fast_commit`'s
    fc = json.loads((WORKLOADS / "ext4_fast_commit_unlink_open_fsync.json").read_text())
    for mkfs, verdict in (("-O fast_commit", "documented"), ("", "new"), ("-O ^fast_commit", "new")):
        assert db.triage(fs="ext4", mkfs_opts=mkfs, signature="mount|-|EUCLEAN", doc=fc).verdict == verdict, mkfs
    # a mount-option shape: btrfs's compressed-write sync bug needs compression on
    cs = json.loads((WORKLOADS / "btrfs_compress_sync_size.json").read_text())
    for mount, verdict in (("compress=zstd", "documented"), ("noatime,compress-force=lzo:3", "documented"),
                           ("", "new"), ("compress=no", "new"), ("nocompress", "new")):
        t = db.triage(fs="btrfs", mkfs_opts="", signature="durability|sync|sync-all", doc=cs, mount_opts=mount)
        assert t.verdict == verdict, (mount, t)

"""`powercut export`: the ext4 fast_commit fsck finding as an fstests test and a shell script.

The finding is made the way a campaign makes it (fuzz.trial.run_doc on the
real stack, fuzz.store.FindingStore.save), from the shrunk workload kept in
tests/workloads/ext4_fast_commit_ftruncate_mkdir.json. The shell export is
then run, unchanged, on a Debian kernel in the vm backend (real
dm-log-writes, real recovery by that kernel), where it must reproduce. The
fstests export is checked for its form (bash -n, the helpers it calls, the
golden output) and run in the guest under a stand-in for xfstests' helpers
(no xfstests installation here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from common import KERNEL_612, require_qemu
from conftest import WORKLOADS, PcEnv, needs_root_stack
from fuzz.store import FindingStore
from fuzz.trial import Signature, run_doc
from foundation import ownership
from harness.pipeline.config import RunConfig

pytestmark = [pytest.mark.e2e, needs_root_stack]
FAST_COMMIT = WORKLOADS / "ext4_fast_commit_ftruncate_mkdir.json"


@pytest.fixture(scope="module")
def finding(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fast_commit fsck finding, saved by the campaign's own store."""
    tmp = tmp_path_factory.mktemp("export")
    # The damage needs the ops replayed from the fast-commit area: jbd2's periodic full commit
    # (every 5 s by default) landing between them on a loaded machine would leave nothing to
    # replay. commit=600 puts the next one beyond the run, so one run shows it (what the
    # kernel cannot be told: a sync(2) by another process commits every file system).
    cfg = RunConfig.parse({"fs": "ext4", "mkfs_opts": "-O fast_commit", "mount_opts": "commit=600", "quiet": True})
    doc = json.loads(FAST_COMMIT.read_text())
    trial = run_doc(doc, cfg, ownership.make_dir(str(tmp / "work")))
    sigs = [(s, f) for s, f in trial.signatures() if s.kind == "fsck"]
    assert sigs, f"the fast_commit workload shows no fsck finding on this kernel: {trial.findings}"
    store = FindingStore(ownership.make_dir(str(tmp / "findings")))
    sig, f = sigs[0]
    d = store.save(trial, sig, f, cfg, original=doc, also=[], shrink={"method": "none (given)", "runs": 0})
    return Path(d)


def export(pc: PcEnv, d: Path, fmt: str, *extra: str, rc: int = 0) -> tuple[Path, str]:
    out = pc.tmp / f"export-{fmt}"
    p = pc.run("export", str(d), "--format", fmt, "--out", str(out), *extra)
    assert p.returncode == rc, p.stdout + p.stderr
    return out, p.stdout


def test_fstests_export_is_a_generic_test_with_golden_output(pc: PcEnv, finding: Path) -> None:
    out, _ = export(pc, finding, "fstests")
    test, golden = (out / "generic-999").read_text(), (out / "generic-999.out").read_text()
    assert subprocess.run(["bash", "-n", str(out / "generic-999")]).returncode == 0
    # an fsck finding: the test prints nothing, fsck judges
    assert golden == "QA output created by 999\nSilence is golden\n"
    for helper in ("_begin_fstest", "_require_scratch", "_require_dm_target flakey",
                   "_require_scratch_ext4_feature fast_commit", 'MKFS_OPTIONS="$MKFS_OPTIONS -O fast_commit"',
                   "_scratch_mkfs_sized",
                   "_init_flakey", "_scratch_mount", "_flakey_drop_and_remount", "_check_scratch_fs"):
        assert helper in test, helper
    # the ops, in order, before the power cut; nothing after it; the fd the
    # ops opened is held by the test's shell and closed only after the cut
    body = test[test.index("_scratch_mount\n"):test.index("_load_flakey_table $FLAKEY_DROP_WRITES")]
    assert [ln.split()[0] for ln in body.splitlines()[1:] if ln.strip() and not ln.startswith("#")] == \
        ["exec", "sync", "$XFS_IO_PROG", "mkdir", "$XFS_IO_PROG"], body
    assert "exec 3<>$SCRATCH_MNT/bar" in body and "truncate 3000" in body and "-c fsync /proc/self/fd/3" in body
    after = test[test.index("_load_flakey_table $FLAKEY_DROP_WRITES"):test.index("_flakey_drop_and_remount")]
    assert "exec 3<&-" in after
    assert "Seen on kernels:" in test and "e2fsck" in test  # the evidence travels with it


@pytest.mark.vm
@require_qemu
def test_shell_export_reproduces_on_a_debian_kernel_in_the_vm(pc: PcEnv, finding: Path) -> None:
    out, text = export(pc, finding, "shell", "--check-vm", KERNEL_612, rc=1)
    script = (out / f"{finding.name}.sh").read_text()
    assert "log-writes" in script and "PC_REPRO_SOURCE" in script and "e2fsck -fn" in script
    assert "REPRODUCED" in text and "6.12" in text
    [log] = out.glob("vm-check-6.12*.txt")
    output = log.read_text()
    assert "op 4: fsync f = 0" in output and "RESULT: REPRODUCED: fsck exit" in output, output


@pytest.mark.vm
@require_qemu
def test_fstests_export_fails_on_a_debian_kernel_with_the_bug(pc: PcEnv, finding: Path) -> None:
    """No xfstests here: the generated test runs under a stand-in for the helpers it calls
    (real dm-flakey, xfs_io, e2fsck in the guest); on a kernel with the bug its output
    differs from the golden .out exactly where fstests would report it."""
    out, text = export(pc, finding, "fstests", "--check-vm", KERNEL_612, rc=1)
    [log] = out.glob("vm-check-6.12*.txt")
    output = log.read_text()
    assert "FSTESTS: FAILED" in output and "+_check_generic_filesystem: filesystem on" in output, output
    assert "Inode 2 ref count is 3, should be 4" in output  # the root one link short


def test_export_of_something_that_is_no_finding_is_one_line_exit_2(pc: PcEnv) -> None:
    p = pc.run("export", str(pc.tmp), "--format", "shell")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not a saved finding" in p.stderr, p.stderr


def test_verify_with_no_fstests_checkout_is_one_line_exit_2(pc: PcEnv, finding: Path) -> None:
    p = pc.run("export", str(finding), "--format", "fstests", "--verify", "debian:x", "--fstests", str(pc.tmp))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not an fstests checkout" in p.stderr, p.stderr


def test_the_kernels_of_a_bisection_go_into_the_header(pc: PcEnv, finding: Path) -> None:
    from fuzz import bisect
    report = {"powercut_bisect": 1, "kernels": ["debian:A", "debian:B", "debian:C"], "first_changed": None,
              "tested": [{"kernel": "debian:A", "verdict": "fsck", "index": 0},
                         {"kernel": "debian:C", "verdict": "clean", "index": 2},
                         {"kernel": "debian:B", "verdict": "error: no such package", "index": 1}]}
    path = bisect.write(str(pc.tmp), report)
    out, _ = export(pc, finding, "shell", "--bisect", path, "--seen-on", "6.1.0-99-amd64", "--seen-on", "7.0-rc1")
    script = (out / f"{finding.name}.sh").read_text()
    seen = script.split("# Seen on kernels:")[1].splitlines()[0]
    # the finding's own kernel, each --seen-on, the bisection's kernels with the finding's verdict
    for k in (os.uname().release, "6.1.0-99-amd64", "7.0-rc1", "debian:A"):
        assert k in seen, (k, seen)
    assert "# Not seen on (powercut bisect): debian:C." in script and "debian:B" not in script


@pytest.mark.vm
@require_qemu
def test_several_threads_export_serialised_in_the_recorded_order(pc: PcEnv) -> None:
    """Two threads lined up by barriers (the fast_commit fsck bug split over them), each with an fd
    named f: the exports run the ops one after the other in the order their completion marks
    reached the log, keep the two fds apart, say so, and the script reproduces in the guest."""
    cfg = RunConfig(fs="ext4", mkfs_opts="-O fast_commit", quiet=True)
    doc = json.loads((WORKLOADS / "ext4_fast_commit_two_threads.json").read_text())
    trial = run_doc(doc, cfg, ownership.make_dir(str(pc.tmp / "work")))
    sigs = [(s, f) for s, f in trial.signatures() if s.kind == "fsck"]
    assert sigs, f"the two-thread fast_commit workload shows no fsck finding on this kernel: {trial.findings}"
    store = FindingStore(ownership.make_dir(str(pc.tmp / "findings")))
    d = Path(store.save(trial, *sigs[0], cfg, original=doc, also=[], shrink={"method": "none (given)", "runs": 0}))
    out, _ = export(pc, d, "fstests")
    test = (out / "generic-999").read_text()
    assert "2 threads ran concurrently; here their ops run one after the other" in test
    body = test.split("_scratch_mount\n", 1)[1].split("# Power cut")[0].splitlines()
    # creat(bar) and open(baz) race: the shell fd each got is read from the test (the same
    # number when baz was opened and closed before bar's creat)
    fd = {name: re.search(rf"^exec (\d+)<>\$SCRATCH_MNT/{name}$", "\n".join(body), re.M)[1] for name in ("bar", "baz")}

    def at(text: str, after: int = 0) -> int:
        return next(i for i, ln in enumerate(body) if i >= after and text in ln)
    opened = {name: at(f"exec {fd[name]}<>$SCRATCH_MNT/{name}") for name in fd}
    closed_baz = at(f"exec {fd['baz']}<&-", opened["baz"])
    # barriers order close(baz) < sync < ftruncate (main) < mkdir (mk) < fsync (main), on main's f
    assert closed_baz < at("sync >>") < at(f"'truncate 3000' /proc/self/fd/{fd['bar']}") \
        < at("mkdir -m 0755 $SCRATCH_MNT/A") < at(f"-c fsync /proc/self/fd/{fd['bar']}"), body
    # mk's close of its f is not main's: bar's fd stays open from its creat to the fsync
    assert not any(ln == f"exec {fd['bar']}<&-" for ln in body[opened["bar"]:]), body
    out, text = export(pc, d, "shell", "--check-vm", KERNEL_612, rc=1)
    [log] = out.glob("vm-check-6.12*.txt")
    output = log.read_text()
    assert "fsync main.f = 0" in output and "close mk.f = 0" in output, output
    assert "RESULT: REPRODUCED: fsck exit" in output, output

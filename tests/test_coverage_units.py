"""Kernel coverage as feedback (fuzz/coverage.py) and the guest's coverage lines
(harness/backends/vm/coverage.py), without a guest: the guest side runs in tests/test_vm_coverage.py."""

from __future__ import annotations

from foundation.filesystems import FILESYSTEMS
from fuzz.coverage import CoverageMap, campaign_coverage, journal_coverage
from harness.backends.vm.coverage import RunCoverage, modules


def test_a_run_is_novel_once_and_recovery_novelty_weighs_more() -> None:
    m = CoverageMap()
    first = m.add({"workload": {"ext4_rename2": 1}, "recovery": {}})
    assert first and first.functions["workload"] == ["ext4_rename2"]
    assert not m.add({"workload": {"ext4_rename2": 1}, "recovery": {}})
    # The same function called far more often: a new hit bucket, not a new function.
    more = m.add({"workload": {"ext4_rename2": 50}, "recovery": {}})
    assert more and more.functions["workload"] == [] and more.score() < first.score()
    w, r = CoverageMap(), CoverageMap()
    on_workload = w.add({"workload": {"jbd2_journal_recover": 1}, "recovery": {}})
    on_recovery = r.add({"workload": {}, "recovery": {"jbd2_journal_recover": 1}})
    assert on_recovery.score() > on_workload.score() > 0


def test_campaign_coverage_is_the_union_of_workers_and_grows_over_time() -> None:
    entries = []
    for t, worker_runs in ((10.0, {"a": 1, "b": 1}), (20.0, {"a": 3}), (30.0, {"c": 1})):
        m = CoverageMap()  # each entry from a fresh worker: its "new" lists repeat what others saw
        nov = m.add({"workload": worker_runs, "recovery": {"r": 1}})
        entries.append({"t": t, "coverage": journal_coverage({"workload": worker_runs, "recovery": {"r": 1}}, nov)})
    entries.append({"t": 40.0, "name": "no coverage (fuse)"})
    cov = campaign_coverage(reversed(entries), start=0.0)
    assert cov is not None
    assert cov["workload_functions"] == 3 and cov["recovery_functions"] == 1 and cov["runs"] == 3
    assert cov["runs_with_new_functions"] == 2
    assert [p[0] for p in cov["over_time"]] == [10.0, 30.0]
    assert [p[1] for p in cov["over_time"]] == [2, 3]
    assert campaign_coverage([{"t": 1.0}], 0.0) is None


def test_guest_lines_fill_the_paths_and_errors() -> None:
    cov = RunCoverage(modules(FILESYSTEMS["ext4"]))
    cov.add_lines(["ok 0", "cov w ext4_fsync_file:2 ext4_rename2:1", "cov r jbd2_journal_recover:1",
                   "cov r jbd2_journal_recover:2 do_one_pass:6", "workload-exit 0"])
    rep = cov.report()
    assert rep["available"] and rep["modules"][:2] == ["ext4", "jbd2"]
    assert rep["workload"]["hits"] == {"ext4_fsync_file": 2, "ext4_rename2": 1}
    assert rep["recovery"]["hits"] == {"jbd2_journal_recover": 3, "do_one_pass": 6}
    assert rep["total_functions"] == 4
    broken = RunCoverage(modules(FILESYSTEMS["btrfs"]))
    broken.add_lines(["cov-error pc-cover: attaching to the functions (kprobe-multi link): Invalid argument"])
    assert not broken.report()["available"] and "kprobe-multi" in broken.report()["errors"][0]


def test_reach_counts_functions_with_recovery_weighed_more_and_ignores_repeats() -> None:
    from fuzz.coverage import reach
    one = {"workload": {"ext4_rename2": 1}, "recovery": {}}
    assert reach(one) == reach(one) > 0  # Hypothesis compares it across examples: stationary
    assert reach({"workload": {}, "recovery": {"ext4_rename2": 1}}) > reach(one)
    assert reach({"workload": {"ext4_rename2": 9}, "recovery": {}}) == reach(one)

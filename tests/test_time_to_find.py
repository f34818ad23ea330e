"""The time-to-find benchmark end to end on a small scale (`powercut bench --only time-to-find`).

A real bug pair costs two kernel downloads and up to 15 minutes, so the test
table has one entry whose "bug" is planted: on the buggy side the campaign
runs with the drop-flush fault (the guest kernel's flushes left out of its
log), which the fixed-kernel re-check does not carry. Both sides boot the
same Debian 6.12 kernel. So the campaign must find something, the re-check
must run the finding's shrunk workload in a guest again on the buggy side
(the finding comes back) and on the fixed side (clean), and the clock must
stop there; the table's validation workloads play no part.
"""

from __future__ import annotations

import json
import os

import pytest

from bench.ttf import load_table
from common import KERNEL_612, vm
from conftest import PcEnv

pytestmark = vm  # boots QEMU guests: root for apt-get, the kernel cache and scratch dirs

PKG = KERNEL_612.removeprefix("debian:")   # the table names Debian packages


def test_planted_bug_is_found_rechecked_on_the_fixed_kernel_and_timed(pc: PcEnv) -> None:
    table = pc.tmp / "table.json"
    table.write_text(json.dumps({"bugs": [{
        "id": "planted-drop-flush", "fs": "ext4", "buggy": PKG, "fixed": PKG, "fault": "drop-flush",
        "fuzz_args": ["--engine", "exhaustive", "--seq", "1", "--reorder", "drop-one", "--shrink-seconds", "60"]}]}))
    out, js = pc.tmp / "ttf", pc.tmp / "ttf.json"
    p = pc.run("bench", "--only", "time-to-find", "--table", str(table), "--minutes", "20", "--jobs", "1",
               "--out", str(out), "--json", str(js), timeout=2400)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(js.read_text())
    assert doc["bugs"] == 1 and doc["found"] == 1 and doc["jobs"] == 1
    r = doc["results"][0]
    assert (r["buggy_kernel"], r["fixed_kernel"]) == (f"debian:{PKG}", f"debian:{PKG}")
    # found before the campaign ended (one clock, so an order, not a time limit)
    assert r["found"] and 0 < r["minutes_to_find"] <= r["campaign_minutes"]
    # The campaign ran on the buggy side with its fault; it stopped at the first finding.
    campaign = json.loads((out / "planted-drop-flush" / "campaign" / "report.json").read_text())
    assert campaign["run"]["fault"] == "drop-flush" and campaign["run"]["backend"] == "vm"
    assert campaign["stop_reason"] == "max-findings" and r["sessions"] == 1
    # The fixed-kernel re-check ran the finding's shrunk workload in a guest, without the fault.
    c = r["finding"]
    assert c["counts"] and c["fixed_verdict"] == "clean" and c["fixed_kernel"] == f"debian:{PKG}"
    # ... and again on the buggy side (with the fault that stands in for the bug there): it came back.
    assert c["buggy_verdict"] not in ("clean", "") and not c["buggy_verdict"].startswith("error")
    assert c["recheck_out"].startswith(str(out / "planted-drop-flush" / "recheck" / c["finding"]))
    recheck = json.loads(open(os.path.join(c["recheck_out"], "report.json")).read())
    assert recheck["backend"] == "vm" and recheck["findings"] == [] and recheck["crash_states_checked"] > 0
    assert "planted-drop-flush" in p.stdout and "found in" in p.stdout
    assert pc.leftovers() == []


def test_the_shipped_table_names_kernel_pairs_with_their_fix_and_evidence() -> None:
    bugs = load_table()
    assert len({b.id for b in bugs}) == len(bugs)
    for b in bugs:
        assert b.fs in ("ext4", "xfs", "btrfs") and b.buggy != b.fixed
        assert b.fix.get("subject") and b.evidence and b.validation
        assert not b.fault and not b.fuzz_args   # the real table runs the default campaign


@pytest.mark.parametrize("buggy,fixed,counts,runs", [
    (["clean", "fsck"], ["clean", "clean"], True, 2),        # a race: the second run shows it, two clean runs
    (["clean", "fsck"], ["clean", "fsck"], False, 2),        # ... and the fixed side fails in its second run
    (["clean", "clean", "clean"], ["clean"], False, 3),      # never back: not the bug, one fixed run
    (["durability"], ["clean"], True, 1),                   # the usual case: one run each
])
def test_a_recheck_gives_a_racy_finding_more_runs_on_both_kernels(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                 buggy: list[str], fixed: list[str],
                                                                 counts: bool, runs: int) -> None:
    """The re-check's policy (the verdicts stand in for guest runs, which the test above makes)."""
    from bench import ttf
    verdicts = {"buggy": iter(buggy), "fixed": iter(fixed)}
    calls: list[str] = []

    def verdict(workload: str, cfg: object, kernel: str, out: str) -> tuple[str, int, str]:
        side = "buggy" if kernel.endswith("buggy") else "fixed"
        calls.append(os.path.basename(out))
        v = next(verdicts[side])
        return v, int(v != "clean"), out

    finding = tmp_path / "001-fsck"
    finding.mkdir()
    (finding / "finding.json").write_text(json.dumps({"kind": "fsck", "ops": 3, "signatures": ["fsck|x"]}))
    monkeypatch.setattr(ttf, "_verdict", verdict)
    monkeypatch.setattr(ttf, "from_finding", lambda d: ("w.json", ttf.RunConfig.parse({"fs": "xfs"})))
    bug = ttf.Bug(id="b", fs="xfs", buggy="k-buggy", fixed="k-fixed")
    c = ttf.recheck(bug, str(finding), str(tmp_path / "out"))
    assert c["counts"] is counts and len(c["buggy_runs"]) == runs and c["buggy_runs"] == buggy
    assert c["fixed_runs"] == fixed and calls[:runs] == ["buggy", *(f"buggy-{k}" for k in range(2, runs + 1))]

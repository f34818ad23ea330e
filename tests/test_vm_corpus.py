"""`powercut corpus run --backend vm`: every job runs its cases in one live guest.

One small run (two entries on two ext4 rows, two jobs: one TCG boot each,
`--recovery both`) checks that the guest is booted once per job and reused,
that the verdicts are the guest kernel's (the ext4 fast_commit mount bug
shows on its row and nowhere else), that the live guest recovered every
crash state both ways (read-write and read-only mounts, each from its own
copy of the crash image) and that nothing is left behind.
"""

from __future__ import annotations

import json
import re

import pytest

from common import require_root
from conftest import PcEnv

KERNEL_612 = "debian:linux-image-6.12-amd64"


@pytest.mark.e2e
@pytest.mark.vm
@require_root
def test_corpus_cases_share_one_live_guest_per_job(pc: PcEnv) -> None:
    out = pc.tmp / "corpus"
    p = pc.run("corpus", "run", "--backend", "vm", "--kernel", KERNEL_612, "--jobs", "2",
               "--entries", "append-fsync,ext4-fc-unlinked-fsync-mount", "--rows", "ext4-ordered,ext4-fast-commit",
               "--recovery", "both", "--out", str(out), timeout=1200)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["backend"] == "vm" and doc["kernel"].startswith("6.12") and doc["summary"]["cases"] == 4
    verdicts = {k: c["verdict"] for k, c in doc["cases"].items()}
    assert verdicts == {"append-fsync@ext4-ordered": [], "append-fsync@ext4-fast-commit": [],
                        "ext4-fc-unlinked-fsync-mount@ext4-ordered": [],
                        "ext4-fc-unlinked-fsync-mount@ext4-fast-commit": ["mount"]}
    # Two jobs, two cases each, one boot each: every case ran in a guest that had booted once.
    assert sorted(re.findall(r"job (\d): (\d+) guest boot", p.stderr)) == [("0", "1"), ("1", "1")]
    assert "guests of its own" not in p.stderr
    for key, case in doc["cases"].items():
        r = json.loads((out / case["report"]).read_text())
        assert r["vm"]["live_guest"] and len(r["vm"]["boot_seconds"]) == 1
        # --recovery both in the live guest: every crash state recovered read-write and read-only.
        n = r["crash_states_checked"]
        assert r["recovery"] == "both" and r["recovery_checks"] == {"rw": n, "ro": n} and n > 0, key
    # The fast_commit replay bug fails the guest kernel's mount in both modes, state by state.
    r = json.loads((out / doc["cases"]["ext4-fc-unlinked-fsync-mount@ext4-fast-commit"]["report"]).read_text())
    mounts = [f for f in r["findings"] if f["kind"] == "mount"]
    failed = {mode: {f["state_id"] for f in mounts if (f.get("recovery") or "rw") == mode} for mode in ("rw", "ro")}
    assert failed["rw"] and failed["rw"] == failed["ro"], failed
    assert pc.leftovers() == []

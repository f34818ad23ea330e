"""The exchange-range time-to-find pair in guests (bench/bugpairs.json, xfs-exchange-range-to-eof).

The pair's validation workload (a TO_EOF exchange from offset 0 of foo to offset
4096 of bar, then fsyncs) on xfs made with -i exchange=1 in the guest (with
bookworm's xfsprogs the guest's mkfs sets the feature bit with xfs_db:
foundation/xfs_exchange.py): Debian 6.12.113 keeps bar at 8192 bytes after its
fsync (durability: 12288 were made durable), 6.12.115 (the fix "xfs: fix
exchange-range-to-eof file size exchange") is clean in every crash state."""

from __future__ import annotations

from common import ROOT, report, vm
from conftest import PcEnv

pytestmark = [*vm]

WORKLOAD = ROOT / "bench" / "validation" / "xfs-exchange-range-to-eof.json"


def _run(pc: PcEnv, package: str, rc: int, *args: str) -> dict:
    out = pc.tmp / package
    pc.run("run", str(WORKLOAD), "--fs", "xfs", "--mkfs-opts", "-i exchange=1", "--backend", "vm",
           "--kernel", f"debian:linux-image-{package}-amd64", "--out", str(out), *args, check_rc=rc)
    return report(out)


def test_the_to_eof_size_bug_shows_on_6_12_113_and_not_on_6_12_115(pc: PcEnv) -> None:
    buggy = _run(pc, "6.12.113+deb12", 1)
    lost = [f for f in buggy["findings"] if f["kind"] == "durability" and f["detail"].startswith("bar: size 8192")]
    assert lost and {f["kind"] for f in buggy["findings"]} == {"durability"}, buggy["findings"][:3]
    fixed = _run(pc, "6.12.115+deb12", 0, "--max-states", "all")
    assert fixed["findings"] == [] and fixed["crash_states_checked"] > 0
    assert pc.leftovers() == []

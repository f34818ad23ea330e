"""Device profiles (--device-profile) and the recorder-overhead calibration in
reports. No timing threshold is asserted (the machine is shared): that the
profile reaches the recorder and the report, what the calibration says, and
lower bounds from a delay the test injects (load only adds time)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CALIBRATION_FSYNCS, ROOT, WORKLOADS, PcEnv, needs_root_stack
from harness.backends.fuse.profiles import PROFILES, recorder_arg, resolve
from foundation.errors import UsageError


def test_named_profiles_and_json_files(tmp_path: Path) -> None:
    emmc = resolve("emmc")
    assert emmc["name"] == "emmc" and emmc["qd"] == 1 and emmc["flush_us"] > emmc["write_us"]
    assert set(PROFILES) == {"emmc", "sata-hdd", "ufs", "nvme", "none"}
    assert resolve(None) is None and recorder_arg(resolve("none")) == []
    assert recorder_arg(emmc)[0] == "--device" and "flush_us=3000" in recorder_arg(emmc)[1]
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"name": "board-x", "write_us": 700, "flush_us": 9000, "qd": 2}))
    assert resolve(str(mine)) == {"name": "board-x", "write_us": 700, "flush_us": 9000, "qd": 2}
    for bad in ({"write_us": -1}, {"warp": 1}, {"qd": "deep"}, [1]):
        mine.write_text(json.dumps(bad))
        with pytest.raises(UsageError):
            resolve(str(mine))
    with pytest.raises(UsageError):
        resolve("floppy")
    with pytest.raises(UsageError):
        resolve(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("case", ["behind-flush", "excl-flush", "shared-queue"])
def test_what_requests_wait_for_in_the_device_model(tmp_path: Path, case: str) -> None:
    """Queued requests wait behind a cache flush (qd 1; flush_excl also with a deeper
    queue) and not without flush_excl: seen through the model's own counters of requests
    in service and waiting (tests/c/devmodel_check.c), never through elapsed time."""
    src = ROOT / "harness" / "backends" / "fuse"
    exe = tmp_path / "devmodel_check"
    subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", f"-I{src}", "-o", str(exe),
                    str(ROOT / "tests" / "c" / "devmodel_check.c"), str(src / "devmodel.c"), "-lpthread"], check=True)
    # A case whose request does not wait as it should hangs in its wait for the counters.
    p = subprocess.run([str(exe), case], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("ok: "), p.stdout + p.stderr


def test_sata_flush_is_exclusive_and_emmc_serves_one_at_a_time() -> None:
    assert resolve("sata-hdd")["flush_excl"] == 1 and "flush_excl=1" in recorder_arg(resolve("sata-hdd"))[1]
    assert resolve("emmc")["qd"] == 1 and "flush_excl" not in resolve("emmc")


@pytest.mark.e2e
@needs_root_stack
def test_profile_and_recorder_overhead_in_the_reports(pc: PcEnv) -> None:
    out = pc.tmp / "out"
    p = pc.run("run", str(WORKLOADS / "fsync_then_more.json"), "--fs", "ext4", "--device-profile", "emmc",
               "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "report.json").read_text())
    assert r["device_profile"] == r["latency"]["device_profile"] == resolve("emmc")
    cal = r["latency"]["recorder_overhead"]
    # Counted from outside the measurement: the recorder's log holds at least one flush per fsync
    # (an appending fsync on ext4 commits the journal), so fewer fsyncs than claimed would show.
    assert cal["fsyncs"] == int(CALIBRATION_FSYNCS) and cal["log_flushes"] >= cal["fsyncs"], cal
    # the ratio is recorder over loop, not the other way round: above 1 exactly when the recorder
    # was slower (a product, so a ratio rounded to 1.00 or equal p50s passes either way)
    assert cal["ratio"] > 0 and (cal["ratio"] - 1) * (cal["recorder_p50_us"] - cal["loop_p50_us"]) >= 0, cal
    assert cal["backend"] == "fuse"
    md = (out / "report.md").read_text()
    assert "Recorder overhead, measured in this invocation" in md and "Device profile `emmc`" in md
    assert "through the FUSE recorder vs" in md
    p = pc.run("run", str(WORKLOADS / "fsync_then_more.json"), "--fs", "ext4", "--out", str(pc.tmp / "bad"),
               env=pc.env(POWERCUT_CALIBRATION_FSYNCS="many"), check_rc=2)
    assert p.stderr == "powercut: POWERCUT_CALIBRATION_FSYNCS='many': a whole number of fsyncs, at least 1\n"
    assert pc.leftovers() == []
    bad = pc.run("run", str(WORKLOADS / "fsync_then_more.json"), "--fs", "ext4", "--device-profile", "floppy",
                 "--out", str(pc.tmp / "bad"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
@needs_root_stack
def test_an_injected_flush_delay_shows_in_every_fsync_and_within_the_runs_own_clock(pc: PcEnv) -> None:
    """A profile whose cache flush takes FLUSH_MS: every fsync on ext4 waits for at least one
    flush (its journal commit), so each measured fsync is at least that long; and the latencies
    fit inside the run as a clock outside powercut saw it (the test's own monotonic clock
    around the whole command). Both are bounds load cannot break: it only adds time."""
    flush_ms = 60
    profile = pc.tmp / "slow-flush.json"
    profile.write_text(json.dumps({"flush_us": flush_ms * 1000}))
    out = pc.tmp / "out"
    t0 = time.monotonic()
    pc.run("run", str(WORKLOADS / "fsync_then_more.json"), "--fs", "ext4", "--device-profile", str(profile),
           "--crash-points", "100000000", "--out", str(out), check_rc=0)
    wall_us = (time.monotonic() - t0) * 1e6
    lat = json.loads((out / "report.json").read_text())["latency"]
    fsync = lat["kinds"]["fsync"]
    assert fsync["count"] == 2, fsync   # the workload's two fsyncs
    # nearest-rank p50 of two is the shorter one: both waited for the flush
    assert fsync["p50_us"] >= flush_ms * 1000 and fsync["max_us"] >= fsync["p50_us"], fsync
    total_us = sum(k["avg_us"] * k["count"] for k in lat["kinds"].values())
    assert total_us <= lat["duration_us"] <= wall_us, (total_us, lat["duration_us"], wall_us)

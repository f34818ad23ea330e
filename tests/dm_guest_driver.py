"""Runs inside the guest of tests/test_dm_guest.py (the host's root over 9p, a Debian kernel with
device-mapper): `powercut run` of one workload on ext4, xfs and btrfs with --backend auto (dm
there) and --backend fuse, and once on user-named devices; one Python process, so the
interpreter starts once under TCG. Writes OUT/driver.json: exit codes and what is left over.

and once a JSON workload (whose run measures the dm recorder's fsync overhead first, with 200
fsyncs a device instead of a run's 1000: the report's figures are checked, not their precision, and
each fsync costs a TCG guest about 10 ms). The dm recorder's own bench runs in a guest of its own:
tests/test_vm_speed.py (`bench --only recorder --backend dm --kernel K`).

Usage: python dm_guest_driver.py OUT [PART...]   (parts: ext4 xfs btrfs user calibrated killed; default: all)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from cli.main import main  # noqa: E402

WORKLOAD = os.path.join(ROOT, "tests", "workloads", "small.sh")
TIMED_WORKLOAD = os.path.join(ROOT, "tests", "workloads", "fsync_then_more.json")
COMMON = ["--crash-points", "mark", "--reorder", "none", "--jobs", "1", "--keep-image"]
FILE_SYSTEMS = ("ext4", "xfs", "btrfs")


def run(out: str, name: str, *args: str, workload: str = WORKLOAD) -> tuple[int, float]:
    t0 = time.monotonic()
    code = main(["run", workload, *COMMON, "--out", os.path.join(out, name), *args])
    return code, round(time.monotonic() - t0, 1)


def user_devices(out: str) -> tuple[int, float]:
    """--data-dev/--log-dev on two loop devices this driver made (the user's devices, to powercut)."""
    devs = []
    for name in ("user-data.img", "user-log.img"):
        path = os.path.join("/tmp", name)
        with open(path, "wb") as f:
            f.truncate(1 << 30)
        devs.append(subprocess.run(["losetup", "--find", "--show", path], capture_output=True, text=True,
                                   check=True).stdout.strip())
    try:
        return run(out, "ext4-user", "--fs", "ext4", "--backend", "dm", "--data-dev", devs[0], "--log-dev", devs[1],
                   "--i-know-this-erases", devs[0], "--i-know-this-erases", devs[1])
    finally:
        for dev in devs:
            subprocess.run(["losetup", "-d", dev], capture_output=True)


def killed_run(out: str) -> dict[str, object]:
    """A dm run killed with SIGKILL while its workload runs, then `powercut cleanup`: what is left."""
    ready = "/tmp/killed-run-ready"
    script = "/tmp/killed-run.sh"
    with open(script, "w") as f:
        f.write(f'printf started > "$POWERCUT_MARK_FILE"\ntouch {ready}\nexec sleep 600\n')
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", script, "--fs", "ext4",
                             "--backend", "dm", "--out", os.path.join(out, "killed")], cwd="/tmp",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    deadline = time.monotonic() + 600
    while not os.path.exists(ready) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # waiting for the workload to signal it runs, not instead of it
    targets = sorted(d for d in os.listdir("/sys/block") if d.startswith("dm-"))
    proc.kill()
    proc.wait()
    code = main(["cleanup"])
    return {"ready": os.path.exists(ready), "targets_while_running": targets, "cleanup_code": code,
            "left": leftovers()}


def leftovers() -> dict[str, list[str]]:
    dm = sorted(d for d in os.listdir("/sys/block") if d.startswith("dm-"))
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.split("\n")
    return {"dm": dm, "loop": [line for line in loops if line.strip()]}


def drive(out: str, parts: list[str]) -> None:
    results = {}
    for fs in FILE_SYSTEMS:
        if fs in parts:
            for backend in ("auto", "fuse"):
                results[f"{fs}-{backend}"] = run(out, f"{fs}-{backend}", "--fs", fs, "--backend", backend)
    if "user" in parts:
        results["ext4-user"] = user_devices(out)
    if "calibrated" in parts:
        os.environ["POWERCUT_CALIBRATION_FSYNCS"] = "200"
        results["ext4-calibrated"] = run(out, "ext4-calibrated", "--fs", "ext4", "--backend", "dm",
                                         workload=TIMED_WORKLOAD)
    killed = killed_run(out) if "killed" in parts else None
    doc = {"codes": {k: v[0] for k, v in results.items()}, "seconds": {k: v[1] for k, v in results.items()},
           "left": leftovers(), "killed": killed}
    with open(os.path.join(out, "driver.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    drive(sys.argv[1], sys.argv[2:] or [*FILE_SYSTEMS, "user", "calibrated", "killed"])

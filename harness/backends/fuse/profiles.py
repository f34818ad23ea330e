"""Device profiles: the timing pc-recorder plays (`--device-profile NAME|FILE.json`).

The recorded device normally answers in microseconds (a file on tmpfs
behind FUSE), so latency effects that come from slow storage (journal
commits waiting for a flush, writes queued behind writeback) vanish. A
profile makes the recorder behave like a class of device: a service time
per request (read, write, discard), a cache-flush cost, a bandwidth shared
by all transfers and a queue depth (requests beyond it wait). The log and
the crash states do not change: only when each request completes does.

The numbers are typical values for each class, not one product's
measurements; where they come from is in docs/device-profiles.md. A JSON
file with the same keys describes one's own device (measured e.g. with fio:
4 KiB random-write latency at queue depth 1, fsync latency, sequential MB/s).
"""

from __future__ import annotations

import json
import os
from typing import Any

from foundation.errors import UsageError

KEYS = {"read_us": "service time of a read request", "write_us": "service time of a write request",
        "flush_us": "cost of a cache flush", "discard_us": "service time of a discard",
        "mbps": "bandwidth in MB/s shared by all transfers (0: unlimited)",
        "qd": "queue depth: requests beyond it wait (0: unlimited)",
        "flush_excl": "1: a cache flush is not queued: it waits for the requests in service and holds the device alone"}

PROFILES: dict[str, dict[str, float]] = {
    # eMMC as on the recorder paper's board (Linux 4.4): no command queue engine
    # in that kernel (cqhci came in 4.15), so one command at a time.
    "emmc": {"read_us": 150, "write_us": 300, "flush_us": 3000, "discard_us": 500, "mbps": 40, "qd": 1},
    # 7200 rpm SATA disk with its write cache on: writes land in the cache, a
    # read waits for seek + half a turn (4.17 ms), a flush writes the cache out.
    # FLUSH CACHE EXT is not an NCQ command: libata issues it only once the
    # queued commands are done and queues nothing behind it (ata_std_qc_defer).
    "sata-hdd": {"read_us": 8300, "write_us": 100, "flush_us": 12000, "discard_us": 0, "mbps": 150, "qd": 32,
                 "flush_excl": 1},
    # UFS 2.x/3.x: 32-entry command queue.
    "ufs": {"read_us": 80, "write_us": 60, "flush_us": 1000, "discard_us": 200, "mbps": 500, "qd": 32},
    # Consumer NVMe SSD without power-loss protection (flushes cost something).
    "nvme": {"read_us": 80, "write_us": 20, "flush_us": 500, "discard_us": 50, "mbps": 2000, "qd": 1024},
    "none": {},
}


def resolve(spec: str | None) -> dict[str, Any] | None:
    """The profile named SPEC, or read from the JSON file SPEC; None for no profile."""
    if not spec:
        return None
    if spec in PROFILES:
        return {"name": spec, **PROFILES[spec]}
    if not spec.endswith(".json"):
        raise UsageError(f"--device-profile {spec}: not one of {', '.join(PROFILES)} nor a .json file")
    try:
        with open(spec) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"--device-profile {spec}: {e}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--device-profile {spec}: a JSON object of {', '.join(KEYS)} is needed")
    for k, v in doc.items():
        if k == "name":
            continue
        if k not in KEYS:
            raise UsageError(f"--device-profile {spec}: unknown key {k!r} (known: {', '.join(KEYS)})")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1e9:
            raise UsageError(f"--device-profile {spec}: {k} must be a number in [0, 1e9]")
    return {"name": doc.get("name", os.path.basename(spec)), **{k: v for k, v in doc.items() if k != "name"}}


def recorder_arg(profile: dict[str, Any] | None) -> list[str]:
    """pc-recorder's --device option for PROFILE (none for no profile or `none`)."""
    items = [f"{k}={profile[k]}" for k in KEYS if profile and k in profile]
    return ["--device", ",".join(items)] if items else []

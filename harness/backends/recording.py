"""One finished recording: the log, the device it was made on, what the workload recorded.

What every backend's `record` returns (harness/backends/engine.py `Backend`) and
the pipeline checks; a dataclass of its own so the generic engine layer and
each backend name it without importing one another.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Recording:
    log_path: str
    device_bytes: int
    sector_size: int
    workload: dict[str, Any] = field(default_factory=dict)
    final_image: str | None = None
    kernel: str = field(default_factory=platform.release)  # the kernel that wrote the log
    device_tuning: dict[str, str] = field(default_factory=dict)  # sysfs attribute -> value in force
    findings: list[Any] = field(default_factory=list)  # found while recording (a vm guest's kernel reports)

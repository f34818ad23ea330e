"""What every vm guest offers, written down: `Guest` (qemu.py, one boot per job) and
`LiveGuest` (live.py, booted once, serving jobs over a control channel) are both a
`VmGuest`; the recording (backend.py) and the recovery engine (recovery.py) use only this."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from foundation.runstate import RunState
from harness.backends.vm.kernel import Kernel
from harness.backends.vm.qemu import BatchDisk, Disk, Outcome


class VmGuest(Protocol):
    kernel: Kernel          # the kernel under test
    accel: str              # kvm or tcg (report.json `vm.accel`)
    boots: list[float]      # seconds of each boot so far

    def run_job(self, job: str, env: dict[str, str], disks: list[Disk], *, timeout: float,
                on_line: Callable[[str], None] | None = None) -> Outcome:
        """Run guest script JOB (harness/backends/vm/guest/JOB.sh) with ENV (PC_* variables) on DISKS
        (a live guest has its own); ON_LINE sees each result line as it comes, where the guest can say
        it then (a live guest). A job that reports an error raises EnvError."""

    def batch_disk(self, state: RunState, engine: int) -> BatchDisk:
        """Recovery engine ENGINE's batch disk: its host file and its device in the guest."""

    def batch_bytes(self, needed: int) -> int:
        """The size the batch disk gets for a batch of NEEDED bytes (EnvError if it cannot hold them)."""

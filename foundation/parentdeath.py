"""A child process that must not outlive its parent (a campaign worker, a corpus job, QEMU)."""

from __future__ import annotations

import ctypes

PR_SET_PDEATHSIG = 1


def signal_on_parent_death(signum: int) -> None:
    """Have the kernel send SIGNUM to this process when its parent dies (prctl PR_SET_PDEATHSIG):
    SIGTERM lets it tear down what it made, SIGKILL for a process with nothing to tear down."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)

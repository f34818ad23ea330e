"""Many runs in one live vm guest: what fuzz workers and corpus jobs share.

A one-job guest boot costs 20-40 s under TCG; a fuzz worker or a corpus job
runs many workloads, so with `--backend vm` each keeps one LiveVm
(harness/backends/vm/backend.py) and hands `opener(...)` to every run. The
guest boots on first use, and again only after its kernel died or hung.
Runs a live guest cannot serve (`why_not_live`) fall back to one-job boots.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from harness.backends import BackendOpener
from harness.foundation.filesystems import get_fs
from harness.pipeline.run import RunConfig

if TYPE_CHECKING:
    from harness.backends.vm.backend import LiveVm


@contextmanager
def live_guest(cfg: RunConfig, fs_names: Iterable[str]) -> Iterator["LiveVm | None"]:
    """A LiveVm for CFG's kernel serving FS_NAMES (None unless CFG's backend is vm); closed
    (QEMU killed, its scratch disks removed) on the way out, whatever happens."""
    if cfg.backend != "vm":
        yield None
        return
    from harness.backends.vm.backend import LiveVm
    with LiveVm(cfg.kernel, cfg.kernel_modules, [get_fs(n) for n in sorted(set(fs_names))], cfg.fault) as live:
        yield live


def why_not_live(cfg: RunConfig) -> str:
    """Why a run under CFG cannot share a live guest ("" if it can)."""
    if len(cfg.recovery_modes()) > 1:
        return f"--recovery {cfg.recovery} needs two recovery engines and a live guest has one batch disk"
    return ""


def opener(live: "LiveVm | None", cfg: RunConfig) -> BackendOpener | None:
    """The backend opener for one run under CFG: LIVE's, or None (the run boots its own guests)."""
    return live.open if live is not None and not why_not_live(cfg) else None

"""Many runs in one live vm guest: what fuzz workers and corpus jobs share.

A one-job guest boot costs 20-40 s under TCG; a fuzz worker or a corpus job
runs many workloads, so with an engine that keeps a guest (`--backend vm`)
each keeps one KeptGuest (harness/backends/engine.py; vm's LiveVm) and hands `opener(...)` to every run. The
guest boots on first use, and again only after its kernel died or hung.
Every run option a vm run takes works in a live guest (`--recovery both`
too: the guest has a batch disk per recovery mode).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from harness.backends import BackendConfig, BackendOpener, KeptGuest
from foundation.filesystems import get_fs
from harness.backends.tools import for_fs as tools_for_fs


@contextmanager
def live_guest(backend: BackendConfig, fs_names: Iterable[str], tools: str | None = None) -> Iterator[KeptGuest | None]:
    """BACKEND's live guest serving FS_NAMES (None unless its engine keeps one: vm), with the
    mkfs of TOOLS (--tools); closed (QEMU killed, its scratch disks removed) on the way out, whatever happens."""
    fss = [tools_for_fs(tools, get_fs(n)) for n in sorted(set(fs_names))]
    with backend.engine.live_guest(backend.options, fss) as live:
        yield live


def opener(live: KeptGuest | None) -> BackendOpener | None:
    """The backend opener for one run: LIVE's, or None (not --backend vm: the run opens its own)."""
    return live.open if live is not None else None

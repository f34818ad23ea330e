"""The `auto` engine, a chooser: dm where this kernel has dm-log-writes, else fuse."""

from __future__ import annotations

from harness.backends.engine import ENGINES, Engine, register_engine


class AutoEngine(Engine):
    name = "auto"
    summary = "dm where the host has it, else fuse"

    def resolve(self) -> Engine:
        from harness.backends.dm import support
        return ENGINES["fuse" if support.missing() else "dm"]


register_engine(AutoEngine())

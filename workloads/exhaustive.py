"""Bounded exhaustive workloads in the spirit of ACE (CrashMonkey, OSDI'18).

A workload of sequence length k is a fixed set-up (workloads/ace_setup.py:
dirs A and A/C, file foo with 16 KiB of data and two xattrs, file A/foo with
256 KiB: a deleted large file is what exposes freed blocks; then sync)
followed by k core ops, each
followed by one persistence op: fsync or fdatasync of what it changed,
fsync of that one's parent directory, or sync. All such workloads are enumerated
in a fixed order: workload i of `seq k` is the i-th tuple of (core op,
persistence op) pairs in lexicographic order, so a campaign is resumable by
index and splittable across machines by index. Core ops and their
persistence ops are fixed, not sampled: this is the bounded space, not a
random search. For k >= 3 the space is large; `capped` visits an evenly
spread, deterministic subset of it.

That product is the space of `--core-ops` (and of seq-1). seq-2 and seq-3
without `--core-ops` are the pruned, ordered space of workloads/ace.py (op
kinds over a small name set, related ops only, persistence points on what
they touch, likeliest shapes first).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from workloads import ace
from workloads.ace_setup import SETUP  # noqa: F401  (exhaustive.SETUP: what every workload starts with)
from workloads.ace_setup import parent as _parent
from workloads.format import workload_doc
from workloads.vocab import XATTRS

RW = ["O_RDWR"]


@dataclass(frozen=True)
class Core:
    """One core op: OPS act on PATH (an fd op gets the fd `c` opened on it);
    PERSIST_ON is what its fsync/fdatasync persists (a file, or a directory)."""

    name: str
    ops: tuple[dict[str, Any], ...]
    path: str | None = None        # opened O_RDWR as fd "c" before OPS (fd ops)
    flags: tuple[str, ...] = ("O_RDWR",)
    persist_on: str = "foo"
    data: bool = True              # data ops also get fdatasync


def _fd(kind: str, **fields: Any) -> dict[str, Any]:
    return {"op": kind, "fd": "c", **fields}


CORE: list[Core] = [
    Core("overwrite", (_fd("pwrite", offset=0, length=4096),), "foo"),
    Core("append", (_fd("pwrite", offset=16384, length=4096),), "foo"),
    Core("unaligned", (_fd("pwrite", offset=1000, length=5000),), "foo"),
    Core("large-new", (_fd("pwrite", offset=0, length=1 << 20),), "A/bar", ("O_CREAT", "O_RDWR"), "A/bar"),
    Core("direct", (_fd("pwrite", offset=4096, length=4096),), "A/foo", ("O_RDWR", "O_DIRECT"), "A/foo"),
    # Untorn writes over foo's 16 KiB, the range the overwrite, punch, zero-range and
    # shrink cores touch too (statx first: the limits go into the report).
    Core("atomic", ({"op": "statx", "path": "foo"}, _fd("pwritev2", iov=[4096], offset=0, flags=["RWF_ATOMIC"])),
         "foo", ("O_RDWR", "O_DIRECT")),
    Core("unshare", (_fd("fallocate", mode=["UNSHARE_RANGE"], offset=0, length=16384),), "foo"),
    Core("atomic-dsync", (_fd("pwritev2", iov=[16384], offset=0, flags=["RWF_ATOMIC", "RWF_DSYNC"]),),
         "foo", ("O_RDWR", "O_DIRECT")),
    Core("mmap", (_fd("mmap_write", offset=0, length=4096, msync=False),), "foo"),
    Core("falloc-keep", (_fd("fallocate", mode=["KEEP_SIZE"], offset=16384, length=65536),), "foo"),
    Core("punch", (_fd("fallocate", mode=["PUNCH_HOLE", "KEEP_SIZE"], offset=4096, length=4096),), "foo"),
    Core("zero-range", (_fd("fallocate", mode=["ZERO_RANGE"], offset=0, length=8192),), "foo"),
    Core("shrink", (_fd("ftruncate", length=3000),), "foo"),
    Core("grow", (_fd("ftruncate", length=100000),), "foo"),
    Core("creat", (), "A/bar", ("O_CREAT", "O_RDWR"), "A/bar", data=False),
    Core("mkdir", ({"op": "mkdir", "path": "B"},), persist_on="B", data=False),
    Core("link", ({"op": "link", "from": "foo", "to": "A/bar"},), persist_on="A/bar", data=False),
    Core("unlink", ({"op": "unlink", "path": "A/foo"},), persist_on="A", data=False),
    Core("rename", ({"op": "rename", "from": "foo", "to": "bar"},), persist_on="bar", data=False),
    Core("rename-over", ({"op": "rename", "from": "foo", "to": "A/foo"},), persist_on="A/foo", data=False),
    Core("rename-dir", ({"op": "rename", "from": "A/C", "to": "B"},), persist_on="B", data=False),
    Core("rmdir", ({"op": "rmdir", "path": "A/C"},), persist_on="A", data=False),
    Core("symlink", ({"op": "symlink", "target": "foo", "path": "A/bar"},), persist_on="A", data=False),
    Core("setxattr", ({"op": "setxattr", "path": "foo", "name": XATTRS[0], "length": 100},), data=False),
    Core("removexattr", ({"op": "removexattr", "path": "foo", "name": XATTRS[1]},), data=False),
    # The linux tier's states (docs/semantics.md): an fd whose file was renamed,
    # linked or unlinked, persisted through that fd; names reused by a new file,
    # directory or symlink; a file moved between directories. fsync-dir of a
    # top-level name is an fsync of the root.
    Core("rename-open", ({"op": "rename", "from": "foo", "to": "bar"},), "foo", data=False),
    Core("link-open", ({"op": "link", "from": "foo", "to": "A/bar"},), "foo", data=False),
    Core("unlink-open", ({"op": "unlink", "path": "foo"},), "foo", data=False),
    Core("move-across", ({"op": "rename", "from": "foo", "to": "A/C/foo"},), persist_on="A/C/foo", data=False),
    Core("reuse-file", ({"op": "rename", "from": "foo", "to": "bar"},
                        {"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "c"},
                        {"op": "close", "fd": "c"}), persist_on="foo", data=False),
    Core("reuse-dir", ({"op": "rename", "from": "A/C", "to": "A/D"}, {"op": "mkdir", "path": "A/C"}),
         persist_on="A/C", data=False),
    Core("reuse-symlink", ({"op": "unlink", "path": "A/foo"}, {"op": "symlink", "target": "foo", "path": "A/foo"}),
         persist_on="A", data=False),
]
PERSIST = ["fsync", "fdatasync", "fsync-dir", "sync"]
CORE_NAMES = [c.name for c in CORE]


def steps(names: list[str] | None = None) -> list[tuple[Core, str]]:
    """Every (core op, persistence op) pair of the core ops NAMES (default all, in that
    order); fdatasync only after data ops, fsync-dir only where that is another file."""
    by_name = {c.name: c for c in CORE}
    cores = [by_name[n] for n in names] if names else CORE
    return [(c, p) for c in cores for p in PERSIST
            if (p != "fdatasync" or c.data) and (p != "fsync-dir" or _parent(c.persist_on) != c.persist_on)]


def space_size(seq: int, names: list[str] | None = None) -> int:
    if _pruned(seq, names):
        return ace.space_size(seq)
    return len(steps(names)) ** seq


def _pruned(seq: int, names: list[str] | None) -> bool:
    """seq-2 and seq-3 without --core-ops are the pruned, ordered ACE space (workloads/ace.py);
    with --core-ops, the product of those core ops' steps."""
    return seq >= 2 and not names


def _ops_for(step: tuple[Core, str], n: int) -> list[dict[str, Any]]:
    """The ops of one step; fd names get suffix N so steps never share an fd."""
    core, persist = step
    c, p = f"c{n}", f"p{n}"
    ops: list[dict[str, Any]] = []
    if core.path:
        ops.append({"op": "open", "path": core.path, "flags": list(core.flags), "fd": c})
    ops += [{**op, "fd": c} if "fd" in op else dict(op) for op in core.ops]
    target = _parent(core.persist_on) if persist == "fsync-dir" else core.persist_on
    persist = "fsync" if persist == "fsync-dir" else persist
    if persist == "sync":
        ops.append({"op": "sync"})
    elif core.path and core.path == target:
        ops.append({"op": persist, "fd": c})
    else:  # open what the op changed (a directory read-only), persist it
        ops += [{"op": "open", "path": target, "flags": ["O_RDONLY"], "fd": p},
                {"op": persist, "fd": p}, {"op": "close", "fd": p}]
    if core.path:
        ops.append({"op": "close", "fd": c})
    return ops


def workload(seq: int, index: int, names: list[str] | None = None) -> dict[str, Any]:
    """Workload INDEX (0-based) of the seq-SEQ space (over the core ops NAMES, default all)."""
    if _pruned(seq, names):
        return ace.workload(seq, index)
    all_steps = steps(names)
    chosen, rest = [], index
    for _ in range(seq):
        rest, k = divmod(rest, len(all_steps))
        chosen.append(all_steps[k])
    chosen.reverse()  # the first step varies slowest: lexicographic order
    ops = list(SETUP)
    for n, step in enumerate(chosen):
        ops += _ops_for(step, n)
    doc = workload_doc(ops, name=f"seq{seq}-" + "-".join(f"{c.name}.{p}" for c, p in chosen))
    doc["description"] = f"ACE-style seq-{seq} workload #{index} of {space_size(seq, names)}"
    return doc


def capped(seq: int, cap: int, names: list[str] | None = None) -> Iterator[int]:
    """Indices to visit: all of them, or CAP of them when the space is larger: the first CAP
    of the pruned space (it is ordered likeliest first), else CAP evenly spread ones."""
    total = space_size(seq, names)
    if _pruned(seq, names):
        yield from range(min(total, cap) if cap > 0 else total)
        return
    if cap <= 0 or total <= cap:
        yield from range(total)
        return
    for k in range(cap):
        yield k * total // cap

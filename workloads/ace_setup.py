"""The set-up every exhaustive workload starts with, and the namespace it leaves.

Dirs A and A/C; file foo with 16 KiB of data and two xattrs, file A/foo with
256 KiB (a deleted large file is what exposes freed blocks); then sync. Both
the product space (workloads/exhaustive.py) and the pruned, ordered space
(workloads/ace.py) start here: the ops (SETUP) are the one source, and what
the model of ace.py starts from (START, SIZE_OF, XATTR_FILE) is read off them.
"""

from __future__ import annotations

import os
from typing import Any

from workloads.vocab import XATTRS

SETUP: list[dict[str, Any]] = [
    {"op": "mkdir", "path": "A"},
    {"op": "mkdir", "path": "A/C"},
    {"op": "open", "path": "foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "s0"},
    {"op": "pwrite", "fd": "s0", "offset": 0, "length": 16384},
    {"op": "close", "fd": "s0"},
    {"op": "open", "path": "A/foo", "flags": ["O_CREAT", "O_RDWR"], "fd": "s1"},
    {"op": "pwrite", "fd": "s1", "offset": 0, "length": 256 << 10},
    {"op": "close", "fd": "s1"},
    # Two xattrs whose names share a btrfs name hash (workloads/vocab.py XATTRS): one packed
    # item there, two ordinary xattrs elsewhere; the core ops replace one and remove the other.
    {"op": "setxattr", "path": "foo", "name": XATTRS[0], "length": 8},
    {"op": "setxattr", "path": "foo", "name": XATTRS[1], "length": 8},
    {"op": "sync"},
]


def parent(path: str) -> str:
    """The directory holding PATH ("." for a name in the root)."""
    return os.path.dirname(path) or "."


def _namespace() -> tuple[dict[str, str], dict[str, int], str]:
    """What SETUP leaves: name -> kind (the root first), file sizes, the file with the xattrs.
    Only the op kinds SETUP uses are read (mkdir, open O_CREAT, pwrite from 0, setxattr)."""
    kinds: dict[str, str] = {".": "dir"}
    sizes: dict[str, int] = {}
    on_fd: dict[str, str] = {}
    xattr_files = []
    for op in SETUP:
        if op["op"] == "mkdir":
            kinds[op["path"]] = "dir"
        elif op["op"] == "open":
            kinds.setdefault(op["path"], "file")
            on_fd[op["fd"]] = op["path"]
        elif op["op"] == "pwrite":
            path = on_fd[op["fd"]]
            sizes[path] = max(sizes.get(path, 0), op["offset"] + op["length"])
        elif op["op"] == "setxattr" and op["path"] not in xattr_files:
            xattr_files.append(op["path"])
    (xattr_file,) = xattr_files
    return kinds, sizes, xattr_file


START, SIZE_OF, XATTR_FILE = _namespace()

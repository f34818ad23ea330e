"""Hypothesis strategies for random workloads in the one workload format.

Op sequences over a small file set (dirs A, B, A/C; files foo, bar in each),
offsets and lengths mostly small and 4 KiB aligned, sometimes unaligned or
large. fds are opened before use and closed at the end; persistence ops are
frequent. Choices are listed simple-first so shrinking moves toward short,
plain workloads (Hypothesis shrinks `sampled_from` toward the first item).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from workloads.format import FORMAT

DIRS = ["A", "B", "A/C"]
FILES = ["foo", "A/foo", "A/bar", "B/foo", "bar", "A/C/foo"]
PATHS = FILES + DIRS
XATTRS = ["user.a", "user.b"]
MAX_FDS = 3

# Simple first. Data and persistence ops dominate: that is where the bugs are.
KINDS = ["pwrite", "fsync", "open", "close", "write", "fdatasync", "sync", "ftruncate", "rename", "unlink",
         "mkdir", "fallocate", "link", "truncate", "syncfs", "sync_file_range", "rmdir", "symlink",
         "setxattr", "removexattr", "mmap_write", "read", "pread"]
FD_KINDS = {"pwrite", "fsync", "close", "write", "fdatasync", "ftruncate", "fallocate", "syncfs",
            "sync_file_range", "mmap_write", "read", "pread"}
FALLOC_MODES = [["KEEP_SIZE"], [], ["PUNCH_HOLE", "KEEP_SIZE"], ["ZERO_RANGE"], ["ZERO_RANGE", "KEEP_SIZE"],
                ["COLLAPSE_RANGE"], ["INSERT_RANGE"]]
OPEN_FLAGS = [["O_CREAT", "O_RDWR"], ["O_RDWR"], ["O_CREAT", "O_RDWR", "O_TRUNC"], ["O_CREAT", "O_RDWR", "O_APPEND"],
              ["O_CREAT", "O_RDWR", "O_SYNC"], ["O_CREAT", "O_RDWR", "O_DSYNC"], ["O_CREAT", "O_RDWR", "O_DIRECT"],
              ["O_CREAT", "O_EXCL", "O_RDWR"], ["O_RDONLY"]]

lengths = st.one_of(st.sampled_from([4096, 8192, 16384, 65536]),
                    st.sampled_from([1, 512, 1000, 5000]),
                    st.sampled_from([1 << 20]))
offsets = st.one_of(st.sampled_from([0, 4096, 8192, 16384, 65536]), st.integers(0, 70000))


@st.composite
def op_lists(draw: st.DrawFn, min_ops: int = 5, max_ops: int = 20) -> list[dict[str, Any]]:
    n = draw(st.integers(min_ops, max_ops))
    ops: list[dict[str, Any]] = []
    fds: list[str] = []
    next_fd = 0
    while len(ops) < n:
        kind = draw(st.sampled_from(KINDS))
        if kind in FD_KINDS and not fds:
            kind = "open"
        if kind == "open":
            if len(fds) >= MAX_FDS:
                continue
            name = f"f{next_fd}"
            next_fd += 1
            ops.append({"op": "open", "path": draw(st.sampled_from(FILES)), "flags": draw(st.sampled_from(OPEN_FLAGS)),
                        "fd": name})
            fds.append(name)
            continue
        op: dict[str, Any] = {"op": kind}
        if kind in FD_KINDS:
            op["fd"] = draw(st.sampled_from(fds))
        if kind == "close":
            fds.remove(op["fd"])
        elif kind in ("pwrite", "pread", "mmap_write"):
            op.update(offset=draw(offsets), length=draw(lengths))
            if kind == "mmap_write":
                op["msync"] = draw(st.booleans())
        elif kind in ("write", "read"):
            op["length"] = draw(lengths)
        elif kind == "fallocate":
            op.update(mode=draw(st.sampled_from(FALLOC_MODES)), offset=draw(offsets), length=draw(lengths))
        elif kind == "sync_file_range":
            op.update(offset=draw(offsets), length=draw(st.sampled_from([0, 4096, 65536])),
                      flags=draw(st.sampled_from([["WAIT_BEFORE", "WRITE", "WAIT_AFTER"], ["WRITE"]])))
        elif kind in ("ftruncate", "truncate"):
            op["length"] = draw(st.sampled_from([0, 4096, 3000, 100000]))
            if kind == "truncate":
                op["path"] = draw(st.sampled_from(FILES))
        elif kind in ("rename", "link"):
            op.update({"from": draw(st.sampled_from(PATHS)), "to": draw(st.sampled_from(PATHS))})
        elif kind == "symlink":
            op.update(target=draw(st.sampled_from(["foo", "A/foo", "C/foo", "missing"])),
                      path=draw(st.sampled_from(FILES)))
        elif kind == "unlink":
            op["path"] = draw(st.sampled_from(FILES))
        elif kind in ("mkdir", "rmdir"):
            op["path"] = draw(st.sampled_from(DIRS))
        elif kind == "setxattr":
            op.update(path=draw(st.sampled_from(PATHS)), name=draw(st.sampled_from(XATTRS)),
                      length=draw(st.sampled_from([8, 100])))
        elif kind == "removexattr":
            op.update(path=draw(st.sampled_from(PATHS)), name=draw(st.sampled_from(XATTRS)))
        ops.append(op)
    ops += [{"op": "close", "fd": fd} for fd in fds]
    return ops


def workload_doc(ops: list[dict[str, Any]], name: str = "random") -> dict[str, Any]:
    """A one-thread workload document around OPS."""
    return {"format": FORMAT, "name": name, "threads": [{"name": "main", "ops": ops}]}


def workloads(min_ops: int = 5, max_ops: int = 20) -> st.SearchStrategy[dict[str, Any]]:
    return op_lists(min_ops, max_ops).map(workload_doc)

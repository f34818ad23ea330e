"""Kernel coverage of a vm run: which functions of the file system's modules ran, and how often.

The guest counts calls to every ftrace-able function of the file system's
modules (and the block layer's flush path) with a BPF program on a
kprobe-multi link (harness/backends/vm/cover/pc-cover.c): stock Debian
kernels have no kcov, but BPF and fprobe. Two paths are kept apart: the
workload (from after the mount through its umount: "cov w" from the record
job) and recovery (every recovery mount and umount of the run's crash
images: "cov r" from each recover job, summed). Recovery is where log
replay runs (ext4's jbd2 and fast-commit replay, btrfs' tree-log replay,
xfs' log recovery): a workload whose crash states reach new replay code is
what a coverage-guided campaign looks for (fuzz/coverage.py).

A run's coverage is its function -> call count per path; report.json's
`coverage` has the counts and the functions. It is off unless POWERCUT_VM_COVERAGE=on:
a campaign whose engine uses it as feedback (fuzz/engine.py `uses_kernel_coverage`) turns
it on for its workers; anything else pays nothing. Why off by default: in the campaign-way
bench its probes made btrfs guest workloads several times slower (docs/coverage.md).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from foundation.filesystems import FsType

# The modules whose functions are counted, per file system: its own and its journal's.
MODULES = {"ext4": ("ext4", "jbd2"), "btrfs": ("btrfs",), "xfs": ("xfs",), "f2fs": ("f2fs",)}
BLOCK_FLUSH = "blk-flush"  # pc-cover's name for the block layer's flush functions (built in)
# Helpers left out: called everywhere (accessors, validity checks, plugging), they were most of
# the counted calls (btrfs recovery mounts: ~11,000 calls each, btrfs_get_32 alone 14%; xfs:
# xlog_add_record 55%) and say nothing of which path ran (docs/coverage.md, "What it costs").
HOT = {"": ("blk_mq_flush_plug_list",),
       "ext4": ("ext4_inode_block_valid", "ext4_sb_block_valid", "__check_block_validity.constprop.0",
                "ext4_es_lookup_extent", "ext4_map_blocks", "ext4_journal_bmap", "jbd2_journal_bmap"),
       "btrfs": (*(f"btrfs_{op}_{n}" for op in ("get", "set", "get_token", "set_token") for n in (8, 16, 32, 64)),
                 "free_extent_buffer", "read_extent_buffer", "release_extent_buffer", "__write_extent_buffer",
                 "btrfs_root_node", "btrfs_comp_cpu_keys", "assert_eb_folio_uptodate", "check_buffer_tree_ref",
                 "leaf_space_used", "btrfs_bin_search", "btrfs_tree_read_lock_nested", "btrfs_tree_read_unlock",
                 "btrfs_read_lock_root_node", "unlock_up", "btrfs_tree_lock_nested", "btrfs_tree_unlock",
                 "btrfs_release_path", "btrfs_alloc_path", "btrfs_free_path"),
       "xfs": ("xlog_add_record", "xfs_buf_log_overhead", "xfs_calc_buf_res")}
PATHS = {"w": "workload", "r": "recovery"}
PLANT_FUNCTIONS = 300
SOURCE = "BPF counters on a kprobe-multi link over every ftrace-able function of the modules"


ENV = "POWERCUT_VM_COVERAGE"


def enabled() -> bool:
    return os.environ.get(ENV, "off") == "on"


def modules(fs: FsType) -> tuple[str, ...]:
    return (*MODULES.get(fs.name, (fs.name,)), BLOCK_FLUSH)


def guest_env(fs: FsType) -> dict[str, str]:
    """The job variable that turns coverage on in the guest (guest/init.sh `cover_begin`):
    pc-cover's words, the modules and -NAME for each hot helper left out."""
    return {"PC_COVERAGE": " ".join([*modules(fs), *(f"-{h}" for h in left_out(fs))])} if enabled() else {}


def left_out(fs: FsType) -> tuple[str, ...]:
    return (*HOT[""], *HOT.get(fs.name, ()))


def planted(cov: RunCoverage) -> dict[str, str] | None:
    """The `coverage-plant` test fault's kernel event, if the workload path ran at least
    POWERCUT_VM_PLANT_FUNCTIONS functions (default PLANT_FUNCTIONS)."""
    limit = int(os.environ.get("POWERCUT_VM_PLANT_FUNCTIONS", PLANT_FUNCTIONS))
    n = len(cov.paths["workload"])
    if n < limit:
        return None
    return {"event": "planted", "phase": "workload", "rule": "workload:coverage-plant", "console": "",
            "line": f"coverage-plant: the workload ran {n} functions of {', '.join(cov.modules)} (>= {limit})"}


def parse_counts(words: Iterable[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for w in words:
        name, _, n = w.rpartition(":")
        if name and n.isdigit():
            out[name] += int(n)
    return out


@dataclass
class RunCoverage:
    """One run's coverage, filled from the guest's result lines (record and recover jobs)."""

    modules: tuple[str, ...]
    left_out: tuple[str, ...] = ()  # hot helpers not counted (HOT)
    paths: dict[str, Counter[str]] = field(default_factory=lambda: {p: Counter() for p in PATHS.values()})
    errors: list[str] = field(default_factory=list)
    jobs: int = 0  # jobs that reported coverage

    def add_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            words = line.split(" ")
            if words[0] == "cov" and len(words) >= 2 and words[1] in PATHS:
                self.paths[PATHS[words[1]]].update(parse_counts(words[2:]))
                self.jobs += 1
            elif words[0] == "cov-error":
                msg = line.partition(" ")[2].strip() or "pc-cover attach failed"
                if msg not in self.errors:
                    self.errors.append(msg)

    def report(self) -> dict[str, Any]:
        """report.json's `coverage`: per path the number of functions that ran, the calls, and
        each function's call count; `total_functions` counts a function in both paths once."""
        out: dict[str, Any] = {"source": SOURCE, "modules": list(self.modules), "left_out": list(self.left_out),
                               "available": self.jobs > 0}
        if self.errors:
            out["errors"] = self.errors
        for path, counts in self.paths.items():
            out[path] = {"functions": len(counts), "calls": sum(counts.values()), "hits": dict(sorted(counts.items()))}
        out["total_functions"] = len(set().union(*(c.keys() for c in self.paths.values())))
        return out

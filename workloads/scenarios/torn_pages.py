"""Torn database pages, with and without untorn writes (RWF_ATOMIC).

A database-style page writer: a file of PAGES pages of PAGE_BYTES (16 KiB,
InnoDB's default), filled and fsync'd, then COMMITS commit groups that
each write PAGES_PER_COMMIT pages in place with O_DIRECT pwritev2 and end
with one fdatasync. With `atomic=1` every page write carries RWF_ATOMIC,
the promise a database relies on to turn off its double-write buffer or
full-page writes. The crash walk (`--reorder drop-one,torn`) then counts,
per crash state, the page writes that are torn (new data in part of the
page, old data in the rest); a torn RWF_ATOMIC page is also an
`atomicity` finding. Compare both ways in one command:

    powercut run scenario:torn-pages --fs xfs --mkfs-opts "-m reflink=1" \\
        --reorder drop-one,torn --param-matrix "atomic=0;1"

On xfs with reflink the kernel does the untorn writes in software
(copy-on-write, 6.16+); ext4 refuses them here (EOPNOTSUPP: the loop device
has no atomic write support), which the section shows as refused writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from foundation.mdtable import table
from workloads.results import Results
from workloads.scenarios.common import count, group, group_stats, op, repeat, thread, workload

NAME = "torn-pages"
SUMMARY = ("database pages of 16 KiB written in place with O_DIRECT, fdatasync per commit group, "
           "optionally RWF_ATOMIC: torn pages per crash state and write latency, each way")
RUN_DEFAULTS: dict[str, str] = {}
EOPNOTSUPP = 95


@dataclass(frozen=True)
class Params:
    commits: int = 16
    pages_per_commit: int = 4
    page_bytes: int = 16384
    atomic: int = 1           # 1: pwritev2 with RWF_ATOMIC; 0: the same writes without it


def params(scale: float) -> Params:
    return Params(commits=count(16, scale, minimum=2))


def generate(p: Params) -> dict[str, Any]:
    """Page k of commit i is at (i * pages_per_commit + k) * page_bytes: every page is
    written once in place, over the fsync'd fill."""
    group_bytes = p.pages_per_commit * p.page_bytes
    flags = ["RWF_ATOMIC"] if p.atomic else []
    writes = [op("pwritev2", f"commit.write:{k}", fd="db", iov=[p.page_bytes], offset=k * p.page_bytes,
                 stride=group_bytes, flags=flags) for k in range(p.pages_per_commit)]
    ops = [
        op("open", "db.open", path="db", flags=["O_CREAT", "O_RDWR", "O_DIRECT"], fd="db"),
        op("statx", "db.statx", path="db"),
        op("pwrite", "db.fill", fd="db", offset=0, length=p.commits * group_bytes),
        op("fsync", "db.fill-fsync", fd="db"),
        repeat(p.commits, [*writes, op("fdatasync", "commit.fdatasync", fd="db")], op_id="commit"),
        op("close", "db.close", fd="db"),
    ]
    return workload(NAME, SUMMARY, [thread("pages", ops)])


def analyze(results: Results, p: Params, facts: dict[str, Any]) -> dict[str, Any]:
    writes = group(results, "commit.write")
    st = next((r.statx for r in results.records if r.op_id == "db.statx" and r.statx), None)
    torn = facts.get("torn_writes") or {}
    w = group_stats(results, "commit.write")
    f = group_stats(results, "commit.fdatasync")
    keys = ("count", "errors", "avg_us", "p50_us", "p99_us", "max_us")
    return {
        "atomic": bool(p.atomic),
        "pages_written": len(writes),
        "page_bytes": p.page_bytes,
        "refused": sum(r.errno == EOPNOTSUPP for r in writes),
        "statx": {"atomic_unit_min": st.atomic_unit_min, "atomic_unit_max": st.atomic_unit_max,
                  "supported": st.atomic_supported} if st else None,
        "write": {k: w[k] for k in keys},
        "fdatasync": {k: f[k] for k in keys},
        "crash_states": torn.get("states", 0),
        "states_with_torn_pages": torn.get("states_torn", 0),
        "torn_pages_max": torn.get("torn_max", 0),
        "torn_pages_total": torn.get("torn_total", 0),
        "torn_per_state": torn.get("torn_per_state", {}),
    }


def render(section: dict[str, Any]) -> list[str]:
    s, w, f = section, section["write"], section["fdatasync"]
    lim = s["statx"] or {}
    out = [f"Page writes {'with' if s['atomic'] else 'without'} RWF_ATOMIC: {s['pages_written']} of "
           f"{s['page_bytes']} B, {s['refused']} refused (EOPNOTSUPP); statx atomic unit "
           f"{lim.get('atomic_unit_min', 0)}..{lim.get('atomic_unit_max', 0)} B.", ""]
    out += table(["crash states", "with torn pages", "torn pages max per state", "torn pages total"],
                 [[s["crash_states"], s["states_with_torn_pages"], s["torn_pages_max"], s["torn_pages_total"]]])
    out += [""] + table(["op", "count", "errors", "avg us", "p50 us", "p99 us", "max us"],
                        [[name, x["count"], x["errors"], x["avg_us"], x["p50_us"], x["p99_us"], x["max_us"]]
                         for name, x in (("page write", w), ("fdatasync", f))])
    return out


def headline(section: dict[str, Any]) -> dict[str, float]:
    w, f = section["write"], section["fdatasync"]
    return {"states with torn pages": section["states_with_torn_pages"], "torn pages max": section["torn_pages_max"],
            "page write p50 us": w["p50_us"], "page write p99 us": w["p99_us"], "fdatasync p50 us": f["p50_us"],
            "refused writes": section["refused"]}

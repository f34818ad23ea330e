"""Seed experiment 1 (Okabe & Toyama): the periodic recorder with pre-allocation.

One recording is one new file. The high-priority `recorder` thread opens it,
fallocate()s FALLOCATE_BYTES (mode 0: the paper's "predefined number of
blocks", so the file is that long until post-processing; keep_size=1 uses
FALLOC_FL_KEEP_SIZE instead), then write()s WRITE_BYTES every PERIOD_US. The
lower-priority `syncer` thread calls sync_file_range() each time the
recorder should have written another SFR_BYTES, on the same file, from its
start to its end: what the recorder wrote late is synced by the next call. When a recording ends, the `post`
thread ftruncate()s the file to what was written (removing the unused
pre-allocated tail) and fsync()s it, while the recorder already opens and
fallocates the next file: the two overlap, as in the paper.

The experiment runs twice, in two phases of one workload: `quiet` (nothing
else runs) and `loaded` (a `background` thread repeats fallocate + ftruncate
+ fsync on another file), each starting with sync() (the paper flushed all
dirty pages before each test). The report prints Table 1 from the two phases.

Table 1's "none" row is writes with no ftruncate + fsync running. The
design's own post-processing is one (on the previous recording), so in the
quiet phase the next recording starts once it is done (barrier `posted`;
quiet_overlap=1 lets them overlap as in the loaded phase). Traced on a slow
device profile, every quiet write over 1 ms waited in
do_get_write_access for the inode block that the post thread's fsync commit
was writing (docs/device-profiles.md). A warm-up fallocate + ftruncate +
fsync before the quiet phase reads the allocator's bitmaps in, so that cost
(a device read in the first fallocate after mount) is not charged to the
quiet phase alone (warmup=0: none).

Threads meet at barriers: `phase` (all, at each phase start), `start`
(recorder, syncer: a recording's first write) and `end` (recorder, syncer,
post: its last write). The syncer's sync_file_range runs on its own period
(the time SFR_BYTES take to write), starting one such period plus half a
write period after the recording. The paper's syncer runs "each time a
fixed amount has been written", so it never skips data the recorder wrote
late; a syncer on a clock that synced only the range due (as this scenario
did until 2026-11-23) left records that the recorder wrote after their call
unsynced while later ranges were, a hole in the middle of the recording
after a power cut that the design itself does not have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from foundation.mdtable import table
from workloads.results import Results
from workloads.scenarios.common import (MIB, count, device_mib, group, group_stats, op, repeat, size, thread,
                                        workload)

NAME = "recorder"
SUMMARY = "Okabe & Toyama: periodic 16 KB writes into fallocated files, sync_file_range, ftruncate+fsync; Table 1"
RUN_DEFAULTS = {"mount_opts": "noatime,lazytime"}  # the paper's ext4 options (data=ordered is the default)
PHASES = {"quiet": "none", "loaded": "ftruncate + fsync"}  # phase -> Table 1's "background" column
# Table 1 of the paper (embedded board, eMMC, Linux 4.4), microseconds.
PUBLISHED = {
    "quiet": {"fallocate_avg_us": 141, "fallocate_max_us": 4299, "write_avg_us": 178, "write_max_us": 359},
    "loaded": {"fallocate_avg_us": 813, "fallocate_max_us": 208440, "write_avg_us": 181, "write_max_us": 1043},
}
SFR_FLAGS = ["WAIT_BEFORE", "WRITE", "WAIT_AFTER"]
WARMUP = "warmup.dat"


@dataclass(frozen=True)
class Params:
    writes: int = 8000                 # write() calls per phase (paper: 8000)
    write_bytes: int = 16384           # paper: 16 KB
    period_us: int = 5000              # paper: one write every 5 ms
    recordings: int = 20               # files per phase; writes are spread over them
    fallocate_bytes: int = 100 * MIB   # per recording (paper: 100 MB per call)
    keep_size: int = 0                 # 1: FALLOC_FL_KEEP_SIZE
    sfr_bytes: int = 2 * MIB           # sync_file_range every 2 MB written (rounded to whole writes)
    background: int = 1                # 0: the quiet phase only
    bg_bytes: int = 100 * MIB          # what each background cycle allocates and truncates away
    bg_period_us: int = 20000          # one background cycle at most every 20 ms
    rt: int = 1                        # 1: recorder SCHED_FIFO 50, syncer SCHED_FIFO 40; 0: SCHED_OTHER
    quiet_overlap: int = 0             # 1: a quiet recording may start while the previous one is post-processed
    warmup: int = 1                    # 1: one fallocate + ftruncate + fsync before the quiet phase


def params(scale: float) -> Params:
    """Counts and sizes shrink with SCALE; a recording keeps at least 2 per phase, and
    sync_file_range keeps its cadence within a recording (about 3 calls in each)."""
    p = Params()
    writes, recordings = count(p.writes, scale), count(p.recordings, scale, minimum=2)
    shrink = (writes / recordings) / (p.writes / p.recordings)  # how much shorter a recording is
    return replace(p, writes=writes, recordings=recordings, fallocate_bytes=size(p.fallocate_bytes, scale),
                   sfr_bytes=size(p.sfr_bytes, shrink, p.write_bytes), bg_bytes=size(p.bg_bytes, scale))


def phases(p: Params) -> list[str]:
    return list(PHASES) if p.background else ["quiet"]


def recording_writes(p: Params) -> list[int]:
    """Writes of each recording of a phase: WRITES spread as evenly as possible."""
    n = min(p.recordings, p.writes)
    return [p.writes // n + (k < p.writes % n) for k in range(n)]


def recording_paths(p: Params) -> list[str]:
    return [f"{ph}-{k:03d}.rec" for ph in phases(p) for k in range(len(recording_writes(p)))]


def generate(p: Params) -> dict[str, Any]:
    per_sfr = max(1, p.sfr_bytes // p.write_bytes)   # writes per sync_file_range
    mode = ["KEEP_SIZE"] if p.keep_size else []
    rec: list[dict[str, Any]] = []
    syncer: list[dict[str, Any]] = []
    post: list[dict[str, Any]] = []
    paths = iter(recording_paths(p))
    if p.warmup:  # bring the allocator's metadata into memory before either phase measures
        rec += [op("open", "warmup.open", path=WARMUP, flags=["O_CREAT", "O_WRONLY"], fd="warm"),
                op("fallocate", "warmup.fallocate", fd="warm", mode=[], offset=0, length=p.fallocate_bytes),
                op("ftruncate", "warmup.ftruncate", fd="warm", length=0), op("fsync", "warmup.fsync", fd="warm"),
                op("close", fd="warm")]
    for ph in phases(p):
        isolated = ph == "quiet" and not p.quiet_overlap
        rec += [op("sync", f"{ph}.sync"), op("barrier", name="phase")]
        syncer.append(op("barrier", name="phase"))
        post.append(op("barrier", name="phase"))
        for k, writes in enumerate(recording_writes(p)):
            path = next(paths)
            rec += [
                op("open", f"{ph}.open:{k}", path=path, flags=["O_CREAT", "O_WRONLY"], fd="rec"),
                op("fallocate", f"{ph}.fallocate:{k}", fd="rec", mode=mode, offset=0, length=p.fallocate_bytes),
                op("barrier", name="start"),
                repeat(writes, [op("write", f"{ph}.write:{k}", fd="rec", length=p.write_bytes)],
                       p.period_us, f"{ph}.record:{k}"),
                op("barrier", name="end"),
                op("close", fd="rec"),
            ] + ([op("barrier", name="posted")] if isolated else [])
            syncer += [op("barrier", name="start"), op("open", path=path, flags=["O_WRONLY"], fd="sfr")]
            if writes >= per_sfr:
                syncer += [
                    op("sleep", us=per_sfr * p.period_us + p.period_us // 2),
                    # Every call covers the whole file (length 0: to its end), not just the
                    # SFR_BYTES due: a recorder that fell behind the syncer's clock writes some of
                    # a range after the call meant for it, and the next call must still sync them.
                    repeat(writes // per_sfr, [op("sync_file_range", f"{ph}.sfr:{k}", fd="sfr", offset=0,
                                                  length=0, flags=SFR_FLAGS)],
                           per_sfr * p.period_us, f"{ph}.sfr-period:{k}"),
                ]
            syncer += [op("close", fd="sfr"), op("barrier", name="end")]
            post += [
                op("barrier", name="end"),
                op("open", path=path, flags=["O_WRONLY"], fd="post"),
                op("ftruncate", f"{ph}.ftruncate:{k}", fd="post", length=writes * p.write_bytes),
                op("fsync", f"{ph}.fsync:{k}", fd="post"),
                op("close", fd="post"),
            ] + ([op("barrier", name="posted")] if isolated else [])
    hi, lo = (("fifo", 50), ("fifo", 40)) if p.rt else (("other", 0), ("other", 0))
    threads = [thread("recorder", rec, *hi), thread("syncer", syncer, *lo, nice=0 if p.rt else 10),
               thread("post", post)]
    if p.background:
        cycles = math.ceil(p.writes * p.period_us / p.bg_period_us)  # as long as the loaded phase records
        threads.append(thread("background", [
            op("barrier", name="phase"), op("barrier", name="phase"),
            op("open", path="background.dat", flags=["O_CREAT", "O_WRONLY"], fd="bg"),
            repeat(cycles, [op("fallocate", "bg.fallocate", fd="bg", mode=[], offset=0, length=p.bg_bytes),
                            op("ftruncate", "bg.ftruncate", fd="bg", length=0),
                            op("fsync", "bg.fsync", fd="bg")], p.bg_period_us, "bg.cycle"),
            op("close", fd="bg"),
        ]))
    kept = p.writes * p.write_bytes * len(phases(p))
    return workload(
        NAME, SUMMARY, threads,
        invariants={"records": {"path": recording_paths(p), "record_bytes": p.write_bytes, "period_us": p.period_us}},
        device={"size_mib": device_mib(kept + 2 * p.fallocate_bytes + p.bg_bytes * p.background)},
    )


def analyze(results: Results, p: Params, facts: dict[str, Any]) -> dict[str, Any]:
    """Table 1 (fallocate and write latency, without and with background), and how the design kept time."""
    rows = {}
    for ph in phases(p):
        f, w = group_stats(results, f"{ph}.fallocate"), group_stats(results, f"{ph}.write")
        fsync = group_stats(results, f"{ph}.fsync")
        rows[ph] = {
            "background": PHASES[ph],
            "fallocate_avg_us": f["avg_us"], "fallocate_max_us": f["max_us"],
            "write_avg_us": w["avg_us"], "write_max_us": w["max_us"],
            "fallocates": f["count"], "writes": w["count"],
            "writes_over_1ms": sum(r.duration_ns > 1_000_000 for r in group(results, f"{ph}.write")),
            "write_deadline_misses": sum(r.deadline_miss for r in group(results, f"{ph}.record")),
            "sync_file_range_avg_us": group_stats(results, f"{ph}.sfr")["avg_us"],
            "post_fsync_avg_us": fsync["avg_us"], "post_fsync_max_us": fsync["max_us"],
            "published": PUBLISHED[ph],
        }
    return {"table1": rows}


def _cell(measured: float, published: float) -> str:
    return f"{measured:.0f} ({published})"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b else "-"


def render(section: dict[str, Any]) -> list[str]:
    rows = section["table1"]
    cols = ["fallocate_avg_us", "fallocate_max_us", "write_avg_us", "write_max_us"]
    out = ["Table 1 of the paper, measured here (the paper's number in parentheses), in microseconds:", ""]
    out += table(["background", "fallocate avg", "fallocate max", "write avg", "write max"],
                 [[r["background"], *(_cell(r[c], r["published"][c]) for c in cols)] for r in rows.values()])
    if "loaded" in rows:
        q, ld = rows["quiet"], rows["loaded"]
        out += ["", "With background over without (the paper's ratio in parentheses):", ""]
        out += table(["", *(c.removesuffix("_us").replace("_", " ") for c in cols)],
                     [["loaded / quiet", *(f"{_ratio(ld[c], q[c])} ({_ratio(ld['published'][c], q['published'][c])})"
                                           for c in cols)]])
    out += ["", "How the recorder kept its period:", ""]
    out += table(["background", "fallocates", "writes", "writes > 1 ms", "deadline misses", "sync_file_range avg us",
                  "post fsync avg us", "post fsync max us"],
                 [[r["background"], r["fallocates"], r["writes"], r["writes_over_1ms"], r["write_deadline_misses"],
                   r["sync_file_range_avg_us"], r["post_fsync_avg_us"], r["post_fsync_max_us"]] for r in rows.values()])
    return out


def headline(section: dict[str, Any]) -> dict[str, float]:
    return {f"{ph} {c.removesuffix('_us').replace('_', ' ')} us": r[c] for ph, r in section["table1"].items()
            for c in ("fallocate_avg_us", "fallocate_max_us", "write_avg_us", "write_max_us")}

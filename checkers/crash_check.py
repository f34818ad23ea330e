"""Walk the crash states of a log: build each image, let the kernel recover it, inspect, fsck.

States come from replay/crashstates.py (crash points x reorder modes). The
main thread generates them in order, skips each one whose image (by content
hash) was already checked, and hands the rest to JOBS worker threads; each
worker owns a CheckSlot (its own images, loop device and mount point) and
moves it from state to state by deltas. The work is in system calls and
fsck processes, so threads run in parallel.

The content oracle plugs in as INSPECT: called with the mount point of the
recovered image and the CrashState (crash point, id, which entries persisted,
were dropped or torn) while it is mounted; the findings it returns are
reported like mount and fsck findings. Calls come from the worker threads
but one at a time, so an inspector needs no locking. With an inspector,
two states are duplicates only if they also share the last mark before
their crash point: a mark is where the workload reports what it finished,
which is what an oracle's expectations depend on.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field, replace

from checkers.checkslot import CheckSlot
from checkers.findings import Finding
from checkers.recovery import Verdict, first_problem, recover_and_check
from harness.filesystems import FsType
from harness.runstate import RunState
from replay.crashstates import DEFAULT_REORDER, CrashPlan, CrashState, ReorderSpec, plan_for_log
from replay.logformat import LogReader
from replay.statehash import StateHasher

Progress = Callable[[int, int, int], None]  # (done, total, findings so far)
Inspect = Callable[[str, CrashState], list[Finding]]
BeforeMount = Callable[[str, CrashState], None]  # (loop device, state), e.g. to hash what the kernel will read
_POLL_S = 0.2


def default_jobs() -> int:
    return len(os.sched_getaffinity(0))


@dataclass
class CrashCheckResult:
    states_total: int = 0        # states the plan has
    states_checked: int = 0      # mounted, inspected, fsck'ed
    states_duplicate: int = 0    # skipped: same image as a state already checked
    findings: list[Finding] = field(default_factory=list)
    stopped_early: bool = False  # --first-failure


def verdict_findings(v: Verdict, cs: CrashState, fs: FsType) -> list[Finding]:
    where = {"crash_point": cs.point, "crash_mark": cs.mark, "state_id": cs.id}
    out = []
    if not v.mount_ok:
        out.append(Finding("mount", f"recovery mount failed: {v.mount_error}", **where,
                           evidence={"mount_error": v.mount_error}))
    elif v.fsck_failed:
        out.append(Finding("fsck", f"{fs.fsck[0]} exit {v.fsck_code} after recovery: {first_problem(v.fsck_output)}",
                           **where, evidence={"fsck_code": v.fsck_code, "fsck_output": v.fsck_output[-4000:]}))
    # The oracle need not know where it was called from: fill in what it left out.
    out += [replace(f, **{k: val for k, val in where.items() if getattr(f, k) is None}) for f in v.inspected]
    return out


@dataclass
class _Item:
    seq: int
    state: CrashState
    findings: list[Finding] = field(default_factory=list)
    checked: bool = False
    error: BaseException | None = None


class _Walk:
    def __init__(self, plan: CrashPlan, hasher: StateHasher, slots: list[CheckSlot], fs: FsType, mount_opts: str,
                 inspect: Inspect | None, before_mount: BeforeMount | None) -> None:
        self.plan, self.hasher, self.slots = plan, hasher, slots
        self.fs, self.mount_opts = fs, mount_opts
        self.inspect, self.before_mount = inspect, before_mount
        self._inspect_lock = threading.Lock()
        self.todo: queue.Queue[_Item | None] = queue.Queue()
        self.done: queue.Queue[_Item] = queue.Queue()
        self.stop = threading.Event()

    def check(self, slot: CheckSlot, cs: CrashState) -> list[Finding]:
        loop = slot.load(cs)
        if self.before_mount:
            self.before_mount(loop.path, cs)
        inspect = (lambda mnt: self.inspect_one(mnt, cs)) if self.inspect else None
        return verdict_findings(recover_and_check(loop, self.fs, self.mount_opts, slot.mnt, inspect), cs, self.fs)

    def inspect_one(self, mnt: str, cs: CrashState) -> list[Finding]:
        assert self.inspect is not None
        with self._inspect_lock:
            return self.inspect(mnt, cs)

    def worker(self, slot: CheckSlot) -> None:
        while (item := self.todo.get()) is not None:
            if not self.stop.is_set():
                try:
                    item.findings = self.check(slot, item.state)
                    item.checked = True
                except BaseException as e:  # reported by the main thread, which stops the walk
                    item.error = e
                    self.stop.set()
            self.done.put(item)

    def dedup_key(self, cs: CrashState) -> Hashable:
        return self.hasher.hash(cs), (cs.mark_index if self.inspect else None)

    def run(self, result: CrashCheckResult, first_failure: bool, progress: Progress | None) -> None:
        threads = [threading.Thread(target=self.worker, args=(s,), name=f"crash-worker-{i}", daemon=True)
                   for i, s in enumerate(self.slots)]
        for t in threads:
            t.start()
        try:
            self._feed(result, first_failure, progress)
        finally:
            self.stop.set()
            for _ in threads:
                self.todo.put(None)
            for t in threads:
                t.join()

    def _feed(self, result: CrashCheckResult, first_failure: bool, progress: Progress | None) -> None:
        states: Iterator[CrashState] | None = iter(self.plan.states())
        seen: set[Hashable] = set()
        found: list[tuple[int, Finding]] = []
        inflight, done, seq = 0, 0, 0
        while True:
            # Keep every worker busy with one state queued behind the current one.
            while states is not None and inflight < 2 * len(self.slots) and not self.stop.is_set():
                cs = next(states, None)
                if cs is None:
                    states = None
                    break
                seq += 1
                key = self.dedup_key(cs)
                if key in seen:
                    result.states_duplicate += 1
                    done += 1
                    continue
                seen.add(key)
                self.todo.put(_Item(seq, cs))
                inflight += 1
            if progress:
                progress(done, result.states_total, len(found))
            if not inflight:
                break
            try:
                item = self.done.get(timeout=_POLL_S)  # a timeout keeps Ctrl-C and SIGTERM responsive
            except queue.Empty:
                continue
            inflight -= 1
            done += 1
            if item.error is not None:
                raise item.error
            result.states_checked += item.checked
            found += [(item.seq, f) for f in item.findings]
            if item.findings and first_failure:
                result.stopped_early = True
                self.stop.set()
        result.findings = [f for _, f in sorted(found, key=lambda p: p[0])]


def check_crash_states(log_path: str, points: list[int], *, fs: FsType, mount_opts: str, device_bytes: int,
                       state: RunState, reorder: ReorderSpec | None = None, jobs: int = 0,
                       first_failure: bool = False, inspect: Inspect | None = None,
                       before_mount: BeforeMount | None = None, progress: Progress | None = None) -> CrashCheckResult:
    """Check every crash state of POINTS in LOG_PATH (see the module doc); JOBS 0 = one per CPU."""
    reorder = reorder or ReorderSpec.parse(DEFAULT_REORDER)
    with LogReader(log_path) as reader:
        plan = plan_for_log(reader, points, reorder)
        result = CrashCheckResult(states_total=len(plan))
        slots: list[CheckSlot] = []
        try:
            for i in range(max(1, min(jobs or default_jobs(), result.states_total))):
                slots.append(CheckSlot(state, reader, device_bytes, f"worker{i}"))
            walk = _Walk(plan, StateHasher(reader, plan.entries), slots, fs, mount_opts, inspect, before_mount)
            walk.run(result, first_failure, progress)
        finally:
            for slot in slots:
                slot.close()
    return result

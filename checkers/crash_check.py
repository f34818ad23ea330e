"""Walk the crash states of a log: build each image, let the kernel recover it, inspect, fsck.

States come from replay/crashstates.py (crash points x reorder modes). The
main thread generates them in order and skips each one whose image (by
content hash) was already checked. By default the host kernel recovers
them: the rest go to JOBS worker threads, each owning a CheckSlot (its own
images, loop device and mount point) that it moves from state to state by
deltas; the work is in system calls and fsck processes, so threads run in
parallel. A backend with its own recovery engine (the vm backend: the
kernel under test in a guest) gets every state's image in turn instead.

The content oracle plugs in as INSPECT (host recovery only): called with
the mount point of the recovered image and the CrashState (crash point, id,
which entries persisted, were dropped or torn) while it is mounted; the
findings it returns are reported like mount and fsck findings. Calls come
from the worker threads but one at a time, so an inspector needs no
locking. With an inspector, two states are duplicates only if they also
share the last mark before their crash point: a mark is where the workload
reports what it finished, which is what an oracle's expectations depend on.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from checkers.checkslot import CheckSlot
from checkers.findings import Finding
from checkers.recovery import RecoveryEngine, Verdict, first_problem, recover_and_check
from harness.foundation import ownership
from harness.foundation.filesystems import FsType
from harness.foundation.runstate import RunState
from replay.crashstates import DEFAULT_REORDER, CrashPlan, CrashState, ReorderSpec, plan_for_log
from replay.logformat import LogReader
from replay.statehash import StateHasher
from replay.stateimage import StateImage

Progress = Callable[[int, int, int], None]  # (done, total, findings so far)
Inspect = Callable[[str, CrashState], list[Finding]]
BeforeMount = Callable[[str, CrashState], None]  # (loop device, state), e.g. to hash what the kernel will read
_POLL_S = 0.2


def default_jobs() -> int:
    return len(os.sched_getaffinity(0))


@dataclass
class CrashCheckResult:
    states_total: int = 0        # states the plan has
    states_checked: int = 0      # recovered, inspected, fsck'ed
    states_duplicate: int = 0    # skipped: same image as a state already checked
    findings: list[Finding] = field(default_factory=list)
    stopped_early: bool = False  # --first-failure
    # States whose recovery mount failed once, then succeeded on the identical
    # image rebuilt from the log: not a property of the crash state, so no
    # finding; listed in the report so that nothing goes unseen.
    mount_retries: list[dict[str, str]] = field(default_factory=list)


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
    out += [replace(f, **{k: val for k, val in where.items() if getattr(f, k) is None}) for f in v.content]
    return out


@dataclass
class _Walk:
    """The states to check, in order without duplicates, and what checking them found."""

    plan: CrashPlan
    hasher: StateHasher
    fs: FsType
    result: CrashCheckResult
    progress: Progress | None
    first_failure: bool
    dedup_by_mark: bool
    only: list[CrashState] | None = None   # these states instead of the plan's (a finding's, re-checked)
    stop: threading.Event = field(default_factory=threading.Event)
    found: list[tuple[int, Finding]] = field(default_factory=list)

    def unique_states(self) -> Iterator[tuple[int, CrashState]]:
        """(sequence number, state), skipping states whose image was already handed out."""
        seen: set[tuple[int, int | None]] = set()
        for seq, cs in enumerate(self.only or self.plan.states()):
            if self.stop.is_set():
                return
            key = (self.hasher.hash(cs), cs.mark_index if self.dedup_by_mark else None)
            if key in seen:
                self.result.states_duplicate += 1
                continue
            seen.add(key)
            yield seq, cs

    def checked(self, seq: int, cs: CrashState, findings: list[Finding]) -> None:
        self.result.states_checked += 1
        self.found += [(seq, f) for f in findings]
        if findings and self.first_failure:
            self.result.stopped_early = True
            self.stop.set()

    def tick(self) -> None:
        if self.progress:
            r = self.result
            self.progress(r.states_checked + r.states_duplicate, r.states_total, len(self.found))

    def finish(self) -> None:
        self.result.findings = [f for _, f in sorted(self.found, key=lambda p: p[0])]


@dataclass
class _Item:
    seq: int
    state: CrashState
    findings: list[Finding] = field(default_factory=list)
    checked: bool = False
    error: BaseException | None = None


class _HostWorkers:
    """Recovery by the host kernel: one thread per CheckSlot."""

    def __init__(self, walk: _Walk, slots: list[CheckSlot], mount_opts: str,
                 inspect: Inspect | None, before_mount: BeforeMount | None) -> None:
        self.walk, self.slots, self.mount_opts = walk, slots, mount_opts
        self.inspect, self.before_mount = inspect, before_mount
        self._inspect_lock = threading.Lock()
        self.todo: queue.Queue[_Item | None] = queue.Queue()
        self.done: queue.Queue[_Item] = queue.Queue()

    def check(self, slot: CheckSlot, cs: CrashState) -> list[Finding]:
        loop = slot.load(cs)
        if self.before_mount:
            self.before_mount(loop.path, cs)
        inspect = (lambda mnt: self.inspect_one(mnt, cs)) if self.inspect else None
        fs = self.walk.fs
        verdict = recover_and_check(loop, fs, self.mount_opts, slot.mnt, inspect)
        if not verdict.mount_ok:
            # Mountability is a function of the image's bytes: mount the same
            # state once more, rebuilt from the log (undoing anything the failed
            # recovery wrote). Only a failure that repeats is a finding.
            first = verdict.mount_error
            verdict = recover_and_check(slot.load(cs), fs, self.mount_opts, slot.mnt, inspect)
            if verdict.mount_ok:  # (list.append is atomic: workers are threads)
                self.walk.result.mount_retries.append({"state_id": cs.id, "error": first})
        return verdict_findings(verdict, cs, fs)

    def inspect_one(self, mnt: str, cs: CrashState) -> list[Finding]:
        assert self.inspect is not None
        with self._inspect_lock:
            return self.inspect(mnt, cs)

    def worker(self, slot: CheckSlot) -> None:
        while (item := self.todo.get()) is not None:
            if not self.walk.stop.is_set():
                try:
                    item.findings = self.check(slot, item.state)
                    item.checked = True
                except BaseException as e:  # reported by the main thread, which stops the walk
                    item.error = e
                    self.walk.stop.set()
            self.done.put(item)

    def run(self) -> None:
        threads = [threading.Thread(target=self.worker, args=(s,), name=f"crash-worker-{i}", daemon=True)
                   for i, s in enumerate(self.slots)]
        for t in threads:
            t.start()
        try:
            self._feed()
        finally:
            self.walk.stop.set()
            for _ in threads:
                self.todo.put(None)
            for t in threads:
                t.join()

    def _feed(self) -> None:
        states: Iterator[tuple[int, CrashState]] | None = self.walk.unique_states()
        inflight = 0
        while True:
            # Keep every worker busy with one state queued behind the current one.
            while states is not None and inflight < 2 * len(self.slots):
                nxt = next(states, None)
                if nxt is None:
                    states = None
                    break
                self.todo.put(_Item(*nxt))
                inflight += 1
            self.walk.tick()
            if not inflight:
                return
            try:
                item = self.done.get(timeout=_POLL_S)  # a timeout keeps Ctrl-C and SIGTERM responsive
            except queue.Empty:
                continue
            inflight -= 1
            if item.error is not None:
                raise item.error
            if item.checked:
                self.walk.checked(item.seq, item.state, item.findings)


def _check_with_engine(walk: _Walk, engine: RecoveryEngine, reader: LogReader, device_bytes: int,
                       state: RunState) -> None:
    """Every state's image, built in one file by deltas, to ENGINE (which copies what it needs)."""
    path = os.path.join(state.scratch, "crash-state.img")
    fd = ownership.create_file(path, device_bytes)
    # The engine gets each CrashState as its key (and hands it to the inspector
    # it was made with); the walk's sequence number is kept here.
    pending: dict[int, tuple[int, CrashState]] = {}

    def collect(verdicts: list[tuple[CrashState, Verdict]]) -> None:
        for key, v in verdicts:
            seq, cs = pending.pop(id(key))
            walk.checked(seq, cs, verdict_findings(v, cs, walk.fs))
        walk.tick()

    try:
        with StateImage(reader, fd) as image:
            for seq, cs in walk.unique_states():
                image.load(cs)
                pending[id(cs)] = (seq, cs)
                collect(engine.submit(cs, path))
            collect(engine.finish())
    finally:
        os.close(fd)


def check_crash_states(log_path: str, points: list[int], *, fs: FsType, mount_opts: str, device_bytes: int,
                       state: RunState, reorder: ReorderSpec | None = None, jobs: int = 0,
                       first_failure: bool = False, inspect: Inspect | None = None,
                       before_mount: BeforeMount | None = None, engine: RecoveryEngine | None = None,
                       progress: Progress | None = None, only: Sequence[str] = ()) -> CrashCheckResult:
    """Check every crash state of POINTS in LOG_PATH (see the module doc); JOBS 0 = one per CPU.
    ONLY: just the states with these ids (e.g. a finding's), whatever POINTS and REORDER say.

    ENGINE (a backend's own recovery, e.g. in a guest) replaces the host
    workers; INSPECT and BEFORE_MOUNT need the host's mounts.
    """
    if engine is not None and before_mount:
        raise ValueError("before_mount needs recovery by the host kernel")
    reorder = reorder or ReorderSpec.parse(DEFAULT_REORDER)
    with LogReader(log_path) as reader:
        plan = plan_for_log(reader, points, reorder)
        chosen = [plan.state(i) for i in only] or None
        result = CrashCheckResult(states_total=len(chosen) if chosen else len(plan))
        walk = _Walk(plan, StateHasher(reader, plan.entries), fs, result, progress, first_failure,
                     dedup_by_mark=inspect is not None, only=chosen)
        if engine is not None:
            try:
                _check_with_engine(walk, engine, reader, device_bytes, state)
            finally:
                engine.close()
        else:
            slots: list[CheckSlot] = []
            try:
                for i in range(max(1, min(jobs or default_jobs(), result.states_total))):
                    slots.append(CheckSlot(state, reader, device_bytes, f"worker{i}"))
                _HostWorkers(walk, slots, mount_opts, inspect, before_mount).run()
            finally:
                for slot in slots:
                    slot.close()
        walk.finish()
    return result

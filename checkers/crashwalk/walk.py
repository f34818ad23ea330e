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
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from checkers.crashwalk import devchanges
from checkers.crashwalk.slot import CheckSlot
from checkers.findings import Finding, kernel_finding
from checkers.crashwalk.recovery import FsckMemo, FsckVerdicts, RecoveryEngine, Verdict, first_problem, recover_and_check
from checkers.crashwalk.recovery_crash import (LOG_DIR, RecordRecovery, RecoveryCrashSpec, RecoveryImages, join_id, log_name,
                                     recovery_plan, split_id, states_of)
from checkers.crashwalk.recovery_modes import mode_opts
from foundation import ownership
from foundation.blockwrites import WriteTracker, open_tracker
from foundation.errors import UsageError
from foundation.loopdev import LoopDevice
from foundation.filesystems import FsType
from foundation.runstate import RunState
from replay.crashstates import DEFAULT_REORDER, CrashPlan, CrashState, ReorderSpec, plan_for_log
from replay.logformat import LogReader
from replay.statehash import StateHasher
from replay.stateimage import StateImage

Progress = Callable[[int, int, int], None]  # (done, total, findings so far)
Inspect = Callable[[str, CrashState], list[Finding]]
BeforeMount = Callable[[str, CrashState], None]  # (loop device, state), e.g. to hash what the kernel will read
_POLL_S = 0.2
# Follow the kernel's writes to the workers' devices (checkers/crashwalk/slot.py) only in walks
# with at least this many states per worker: below, setting the tracer up and down (~5 ms
# of CPU, ~50 ms of waiting for the kernel to remove it) costs more than it saves (1-2 ms
# of CPU per state, and on ext4 half the fsck runs).
TRACK_MIN_STATES = 24


def default_jobs() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def default_walk_workers() -> int:
    """Crash-walk workers when the caller does not say: one more than the CPUs. A worker
    spends much of each state waiting, not computing: for its synchronous reads through the
    loop device's kernel worker during the recovery mount, and for fsck's threads handing
    work to each other (xfs_repair: ~50 threads per run). One worker per CPU left the CPUs
    idle a quarter of the time (docs/exploration.md, where the time per state goes)."""
    return default_jobs() + 1


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
    # Recovery mounts that found the device busy (or gone) and waited for it
    # (checkers/crashwalk/recovery.py mount_for_recovery): no finding either, but logged.
    device_waits: list[dict[str, object]] = field(default_factory=list)
    recovery_checks: dict[str, int] = field(default_factory=dict)   # mode -> recoveries checked
    recovery_crash_recorded: int = 0   # recovery mounts recorded (--recovery-crash)
    recovery_crash_unmounted: int = 0  # recovery mounts that failed while being recorded (nothing to crash in)
    recovery_crash_states: int = 0     # recovery crash states recovered again and checked
    # How worker images moved between states: by the ranges the log and the kernel
    # changed ("ranges", checkers/crashwalk/slot.py), or by comparing whole images ("compared").
    image_loads: dict[str, int] = field(default_factory=dict)
    # Recovered images identical to one fsck had already checked: its verdict, fsck not run again.
    fsck_reused: int = 0
    # With a recovery engine: seconds the host spent building the crash images (log replay
    # to each state), the part of a state's time outside the engine's own profile.
    image_build_s: float = 0.0


@dataclass
class RecoveryOptions:
    """How crash states are recovered: modes (rw, ro), and crashes during recovery."""

    modes: tuple[str, ...] = ("rw",)
    crash: RecoveryCrashSpec | None = None
    record: RecordRecovery | None = None   # the backend's recovery recorder, with CRASH
    log_dir: str = ""                       # where the recovery logs of findings are kept


@dataclass(frozen=True)
class WalkOptions:
    """How check_crash_states walks a log's crash states (what to check, who recovers, what else looks)."""

    reorder: ReorderSpec | None = None     # crash states per point (None: DEFAULT_REORDER)
    jobs: int = 0                          # host workers (0: default_walk_workers())
    first_failure: bool = False            # stop at the first finding
    inspect: Inspect | None = None         # the content oracle, called on each recovered image
    before_mount: BeforeMount | None = None
    engines: dict[str, RecoveryEngine] | None = None  # a backend's own recovery per mode (replaces host workers)
    progress: Progress | None = None
    only: Sequence[str] = ()               # just these state ids (a finding's, `p57-d3` or `p57/r12`)
    recovery: RecoveryOptions = field(default_factory=RecoveryOptions)
    image: str | None = None               # check this image as every state's crash image (a board's disk)


def verdict_findings(v: Verdict, cs: CrashState, fs: FsType, mode: str = "rw",
                     tagged: bool = False) -> list[Finding]:
    """Findings of one verdict; those of a non-default recovery (or TAGGED) name the recovery mode."""
    where: dict[str, object] = {"crash_point": cs.point, "crash_mark": cs.mark, "state_id": cs.id}
    if mode != "rw" or tagged:
        where["recovery"] = mode
    out = []
    if v.kernel is not None:
        out.append(kernel_finding(v.kernel, **where))
        if v.kernel.get("died"):  # nothing else is known about an image the kernel died on
            return out
    if not v.mount_ok:
        said = f" (kernel: {'; '.join(v.kernel_log[-3:])})" if v.kernel_log else ""
        evidence: dict[str, object] = {"mount_error": v.mount_error, "kernel_log": v.kernel_log}
        if v.mount_errno:
            evidence["errno"] = v.mount_errno
        out.append(Finding("mount", f"recovery mount failed: {v.mount_error}{said}", **where, evidence=evidence))
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
    recovery_only: dict[str, tuple[str, ...]] = field(default_factory=dict)  # id -> its recovery states to re-check
    stop: threading.Event = field(default_factory=threading.Event)
    found: list[tuple[int, Finding]] = field(default_factory=list)
    _count_lock: threading.Lock = field(default_factory=threading.Lock)

    def count_recovery(self, mode: str) -> None:
        with self._count_lock:
            checks = self.result.recovery_checks
            checks[mode] = checks.get(mode, 0) + 1

    def count_recovery_recorded(self, failed: bool = False) -> None:
        with self._count_lock:
            if failed:
                self.result.recovery_crash_unmounted += 1
            else:
                self.result.recovery_crash_recorded += 1

    def count_fsck_reused(self) -> None:
        with self._count_lock:
            self.result.fsck_reused += 1

    def count_recovery_state(self) -> None:
        with self._count_lock:
            self.result.recovery_crash_states += 1

    def unique_states(self) -> Iterator[tuple[int, CrashState, int]]:
        """(sequence number, state, its image's hash), skipping states whose image was already handed out."""
        seen: set[tuple[int, int | None]] = set()
        for seq, cs in enumerate(self.only or self.plan.states()):
            if self.stop.is_set():
                return
            key = (self.hasher.hash(cs), cs.mark_index if self.dedup_by_mark else None)
            if key in seen:
                self.result.states_duplicate += 1
                continue
            seen.add(key)
            yield seq, cs, key[0]

    def checked(self, seq: int, cs: CrashState, findings: list[Finding], count: bool = True) -> None:
        if count:
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
    image_hash: int
    recovery_only: tuple[str, ...] = ()   # re-check just these states inside its saved recovery logs
    findings: list[Finding] = field(default_factory=list)
    checked: bool = False
    error: BaseException | None = None


class _HostWorkers:
    """Recovery by the host kernel: one thread per CheckSlot."""

    def __init__(self, walk: _Walk, slots: list[CheckSlot], mount_opts: str, opts: WalkOptions,
                 reorder: ReorderSpec) -> None:
        self.walk, self.slots, self.mount_opts = walk, slots, mount_opts
        self.inspect, self.before_mount = opts.inspect, opts.before_mount
        self.recovery, self.reorder = opts.recovery, reorder
        self._inspect_lock = threading.Lock()
        self.fsck_verdicts = FsckVerdicts()   # shared by the workers
        self.todo: queue.Queue[_Item | None] = queue.Queue()
        self.done: queue.Queue[_Item] = queue.Queue()

    def check(self, slot: CheckSlot, cs: CrashState, image_hash: int) -> list[Finding]:
        findings: list[Finding] = []
        rec = self.recovery
        def recovered_hash() -> int | None:
            value = slot.recovered_hash(image_hash)
            self.fsck_verdicts.hashed_bytes += slot.hashed_bytes   # (approximate: threads, only a budget)
            return value

        memo = FsckMemo(recovered_hash, self.fsck_verdicts)
        for mode in rec.modes:
            verdict = self._recover(lambda: slot.load(cs), slot, cs, mode, memo)
            findings += verdict_findings(verdict, cs, self.walk.fs, mode)
            self.walk.count_recovery(mode)
            if rec.crash and verdict.mount_ok and rec.crash.chosen(cs.id, mode):
                findings += self.crash_in_recovery(slot, cs, mode)
        return findings

    def _recover(self, load: Callable[[], LoopDevice], slot: CheckSlot, cs: CrashState, mode: str,
                 memo: FsckMemo | None = None) -> Verdict:
        """Recover the image LOAD puts on SLOT's device in MODE and check it (the oracle sees CS).
        MEMO: fsck verdicts by recovered image, for a LOAD whose image's hash it knows."""
        loop = load()
        if self.before_mount:
            self.before_mount(loop.path, cs)
        inspect = (lambda mnt: self.inspect_one(mnt, cs, slot)) if self.inspect else None
        fs, opts = self.walk.fs, mode_opts(self.mount_opts, mode)
        verdict = recover_and_check(loop, fs, opts, slot.mnt, inspect, memo)
        self._log_waits(verdict, cs)
        if not verdict.mount_ok:
            # Mountability is a function of the image's bytes: mount the same
            # state once more, rebuilt from the log (undoing anything the failed
            # recovery wrote). Only a failure that repeats is a finding.
            first = verdict.mount_error
            verdict = recover_and_check(load(), fs, opts, slot.mnt, inspect, memo)
            self._log_waits(verdict, cs)
            if verdict.mount_ok:  # (list.append is atomic: workers are threads)
                self.walk.result.mount_retries.append({"state_id": cs.id, "error": first,
                                                       **({"recovery": mode} if mode != "rw" else {})})
        if verdict.fsck_reused:
            self.walk.count_fsck_reused()
        return verdict

    def crash_in_recovery(self, slot: CheckSlot, cs: CrashState, mode: str,
                          only: Sequence[str] = (), saved_log: str | None = None) -> list[Finding]:
        """Record the recovery of CS in MODE, then check crash states inside it against CS's guarantees.
        ONLY / SAVED_LOG: just these recovery states of a recovery log saved earlier (a finding's)."""
        rec = self.recovery
        assert rec.crash is not None
        scratch = os.path.dirname(slot.image)
        log = saved_log or os.path.join(scratch, f"recovery-{slot.name}.log")
        if saved_log is None:
            assert rec.record is not None
            if not rec.record(slot.ref_path, mode_opts(self.mount_opts, mode), log, f"-{slot.name}"):
                # The same image mounted in the check just before: a recorded mount that
                # fails is a harness problem or a flaky mount; counted, never silent.
                self.walk.count_recovery_recorded(failed=True)
                return []
            self.walk.count_recovery_recorded()
        findings: list[Finding] = []
        with LogReader(log) as reader:
            if only:
                plan = recovery_plan(reader, self.reorder)
                states = [plan.state(i) for i in only]
            else:
                states = list(states_of(reader, self.reorder, rec.crash.budget, cs.id, mode))
            with RecoveryImages(reader, slot.ref_path, os.path.join(scratch, f"recovery-{slot.name}.img")) as images:
                for rs in states:
                    if self.walk.stop.is_set():
                        break
                    images.load(rs)
                    inner = replace(cs, id=join_id(cs.id, rs.id))
                    verdict = self._recover(lambda: slot.load_image(images.fd), slot, inner, mode)
                    for f in verdict_findings(verdict, inner, self.walk.fs, mode, tagged=True):
                        f.evidence.setdefault("recovery_crash_point", rs.point)
                        f.detail = f"crash during {mode} recovery at its entry {rs.point}: {f.detail}"
                        findings.append(f)
                    self.walk.count_recovery_state()
        if findings and saved_log is None and rec.log_dir:
            os.makedirs(rec.log_dir, exist_ok=True)
            keep = os.path.join(rec.log_dir, log_name(cs.id, mode))
            with open(log, "rb") as src, os.fdopen(ownership.create_file(keep), "wb") as dst:
                shutil.copyfileobj(src, dst)
        return findings

    def recheck_in_recovery(self, slot: CheckSlot, cs: CrashState, ids: tuple[str, ...]) -> list[Finding]:
        """The recovery crash states IDS of CS again, from the recovery logs a run saved."""
        findings: list[Finding] = []
        found_log = False
        for mode in self.recovery.modes:
            saved = os.path.join(self.recovery.log_dir, log_name(cs.id, mode))
            if os.path.exists(saved):
                found_log = True
                slot.load(cs)
                findings += self.crash_in_recovery(slot, cs, mode, only=ids, saved_log=saved)
        if not found_log:
            raise UsageError(f"state {cs.id}/...: no saved recovery log {log_name(cs.id, '|'.join(self.recovery.modes))} "
                             f"in {self.recovery.log_dir or '(no run directory)'}")
        return findings

    def _log_waits(self, verdict: Verdict, cs: CrashState) -> None:
        # (list.extend of a list is atomic enough here: workers are threads under the GIL)
        self.walk.result.device_waits.extend({"state_id": cs.id, **w} for w in verdict.device_waits)

    def inspect_one(self, mnt: str, cs: CrashState, slot: CheckSlot) -> list[Finding]:
        assert self.inspect is not None
        changes = slot.changes_for_inspection(mnt)
        with self._inspect_lock:
            devchanges.publish(mnt, changes)
            try:
                return self.inspect(mnt, cs)
            finally:
                devchanges.retract(mnt)

    def worker(self, slot: CheckSlot) -> None:
        while (item := self.todo.get()) is not None:
            if not self.walk.stop.is_set():
                try:
                    if item.recovery_only:
                        item.findings = self.recheck_in_recovery(slot, item.state, item.recovery_only)
                    else:
                        item.findings = self.check(slot, item.state, item.image_hash)
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
        states: Iterator[tuple[int, CrashState, int]] | None = self.walk.unique_states()
        inflight = 0
        while True:
            # Keep every worker busy with one state queued behind the current one.
            while states is not None and inflight < 2 * len(self.slots):
                nxt = next(states, None)
                if nxt is None:
                    states = None
                    break
                self.todo.put(_Item(*nxt, self.walk.recovery_only.get(nxt[1].id, ())))
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


def _check_with_engine(walk: _Walk, engines: dict[str, RecoveryEngine], reader: LogReader, device_bytes: int,
                       state: RunState) -> None:
    """Every state's image, built in one file by deltas, to each mode's engine (which copies what it needs)."""
    path = os.path.join(state.scratch, "crash-state.img")
    fd = ownership.create_file(path, device_bytes)
    # The engines get each CrashState as their key (and hand it to the inspector
    # they were made with); the walk's sequence number is kept here.
    pending: dict[tuple[str, int], tuple[int, CrashState]] = {}
    first_mode = next(iter(engines))

    def collect(mode: str, verdicts: list[tuple[CrashState, Verdict]]) -> None:
        for key, v in verdicts:
            seq, cs = pending.pop((mode, id(key)))
            walk.count_recovery(mode)
            walk.result.device_waits.extend({"state_id": cs.id, **w} for w in v.device_waits)
            walk.checked(seq, cs, verdict_findings(v, cs, walk.fs, mode), count=mode == first_mode)
        walk.tick()

    try:
        with StateImage(reader, fd) as image:
            for seq, cs, _ in walk.unique_states():
                t0 = time.perf_counter()
                image.load(cs)
                walk.result.image_build_s += time.perf_counter() - t0
                for mode, engine in engines.items():
                    pending[(mode, id(cs))] = (seq, cs)
                    collect(mode, engine.submit(cs, path))
            for mode, engine in engines.items():
                collect(mode, engine.finish())
    finally:
        os.close(fd)


def check_crash_states(log_path: str, points: list[int], *, fs: FsType, mount_opts: str, device_bytes: int,
                       state: RunState, opts: WalkOptions = WalkOptions()) -> CrashCheckResult:
    """Check every crash state of POINTS in LOG_PATH (see the module doc and WalkOptions).
    OPTS.only: just the states with these ids, whatever POINTS and the reorder spec say.
    OPTS.recovery: the recovery modes and crashes during recovery. OPTS.image: check this
    image (a copy of it) as the crash image of every state, instead of rebuilding the
    states from the log (a board's disk after a real power cut).

    OPTS.engines (a backend's own recovery per mode, e.g. in a guest) replace the
    host workers; inspect, before_mount and recovery crashes need the host's mounts.
    """
    engines, recovery, image = opts.engines, opts.recovery, opts.image
    if engines and (opts.before_mount or recovery.crash or image):
        raise ValueError("before_mount, recovery crashes and a supplied image need recovery by the host kernel")
    if image and recovery.crash:
        raise ValueError("a supplied image has no recovery log to crash in")
    reorder = opts.reorder or ReorderSpec.parse(DEFAULT_REORDER)
    with LogReader(log_path) as reader:
        plan = plan_for_log(reader, points, reorder)
        inner: dict[str, tuple[str, ...]] = {}
        originals: list[str] = []
        for i in opts.only:
            orig, rid = split_id(i)
            if orig not in originals:
                originals.append(orig)
            if rid is not None:
                inner[orig] = (*inner.get(orig, ()), rid)
        if inner and recovery.crash is None:
            recovery = replace(recovery, crash=RecoveryCrashSpec())
        chosen = [plan.state(i) for i in originals] or None
        result = CrashCheckResult(states_total=len(chosen) if chosen else len(plan))
        walk = _Walk(plan, StateHasher(reader, plan.entries), fs, result, opts.progress, opts.first_failure,
                     dedup_by_mark=opts.inspect is not None, only=chosen, recovery_only=inner)
        if engines:
            try:
                _check_with_engine(walk, engines, reader, device_bytes, state)
            finally:
                for engine in engines.values():
                    engine.close()
        else:
            slots: list[CheckSlot] = []
            tracker: WriteTracker | None = None
            try:
                n = max(1, min(opts.jobs or default_walk_workers(), result.states_total))
                track = result.states_total >= TRACK_MIN_STATES * n and image is None
                for i in range(n):
                    slots.append(CheckSlot(state, reader, device_bytes, f"worker{i}", image, track))
                # One tracer for all workers' devices (removing one costs ~50 ms).
                tracker = open_tracker(state, [s.loop.path for s in slots], "walk") if track else None
                for slot in slots if tracker is not None else []:
                    slot.attach_tracker(tracker)
                _HostWorkers(walk, slots, mount_opts, replace(opts, recovery=recovery), reorder).run()
            finally:
                for slot in slots:
                    for k, n in slot.restores.items():
                        result.image_loads[k] = result.image_loads.get(k, 0) + n
                    slot.close()
                if tracker is not None:
                    tracker.close()
        walk.finish()
    return result

"""Backends as engines, registered by name (fio's ioengines: `.name`, `.options`, `register_ioengine`).

An engine says how a run's recording is made and who recovers its crash
images. It declares the options it takes (`options`: foundation/options.py,
each with its key, flag, type, default, help and the one line a user gets for
giving one to another engine: the CLI builds `--backend` and every backend
flag from them, cli/options.py), and the one line `--backend`'s help gives it
(`summary`). It turns their
values into its own typed options object, checked (`parse`), and opens a
`Backend` for one run (`open`). `--backend NAME` is a lookup in `ENGINES`;
nothing else chooses by a backend's name. The engines register themselves
in their own packages (fuse/engine.py, dm/engine.py, vm/engine.py, auto.py),
imported by harness/backends/__init__.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from checkers.crashwalk.recovery import PointInspect, RecoveryEngine
from checkers.crashwalk.recovery_crash import RecordRecovery
from foundation.errors import UsageError
from foundation.filesystems import FsType
from foundation.options import Option
from foundation.runstate import RunState
from workloads.runner import WorkloadRunner

from harness.backends.recording import Recording

if TYPE_CHECKING:
    from harness.backends.device import RecordedDevice


class Backend(Protocol):
    """One run's opened backend: what the pipeline (harness/pipeline/run.py) asks of it."""

    def record(self, fs: FsType, mkfs_opts: str, mount_opts: str, workload: WorkloadRunner,
               state: RunState, out_dir: str, device_bytes: int, log_path: str) -> Recording:
        """Make the file system, run WORKLOAD on it and return the finished log."""

    def recovery(self, fs: FsType, mount_opts: str, state: RunState,
                 inspect: PointInspect | None = None) -> RecoveryEngine | None:
        """The engine that recovers crash images (INSPECT reads each recovered one); None: the host kernel."""

    def recovery_recorder(self, fs: FsType, state: RunState, device_bytes: int) -> RecordRecovery:
        """Records a recovery mount of a crash image on the recorded device (--recovery-crash)."""

    def report_extra(self) -> dict[str, Any]:
        """Backend facts for report.json."""


# Gives the backend of one run (a campaign worker's kept guest: KeptGuest.open).
BackendOpener = Callable[[FsType, WorkloadRunner], Backend]


class KeptGuest(Protocol):
    """A guest an engine keeps across the runs of one process (`keeps_guest`: a campaign worker,
    a corpus job), as a context manager that closes it: every guest of the tree has this shape
    (vm: harness/backends/vm/backend.py LiveVm)."""

    def open(self, fs: FsType, workload: WorkloadRunner) -> Backend:
        """The backend of one run in this guest (the pipeline's BackendOpener)."""

    def stats(self) -> dict[str, Any]:
        """Where its time went (boots, seconds per job kind), for the campaign's report."""

    def __enter__(self) -> KeptGuest: ...

    def __exit__(self, *exc: object) -> None: ...


class Engine:
    """A backend. Subclasses set `name`, `summary` and `options`, and define `parse` and `open`.
    Several engines may declare the same Option (fuse and vm: --fault)."""

    name: ClassVar[str]
    summary: ClassVar[str]                    # what it is, in --backend's help
    options: ClassVar[tuple[Option, ...]] = ()
    faults: ClassVar[tuple[str, ...]] = ()   # its `--fault` test modes
    records_recovery: ClassVar[bool] = False  # --recovery-crash: it can record a recovery mount
    keeps_guest: ClassVar[bool] = False       # its runs share a guest it keeps (a KeptGuest) across runs
    # Its log holds a write that is not FUA until the next flush, after marks logged meanwhile
    # (dm-log-writes' unflushed list); otherwise a write is logged when it completes.
    logs_writes_at_flush: ClassVar[bool] = False

    def resolve(self) -> Engine:
        """The engine that records (`auto` chooses one)."""
        return self

    def parse(self, values: Mapping[str, Any]) -> Any:
        """Its options object from VALUES (one per declared key, defaults filled in), checked (UsageError)."""
        raise NotImplementedError

    def require(self) -> None:
        """EnvError if this host cannot record with it (campaigns check once, before any worker exists)."""

    def prepare(self, opts: Any) -> None:
        """What every run of a campaign needs from the host, done once before its workers start
        (UsageError/EnvError: the campaign ends with that one line, no worker started)."""

    def open(self, fs: FsType, workload: WorkloadRunner, opts: Any) -> Backend:
        """The backend of one run, checked and prepared before anything is created."""
        raise NotImplementedError

    def calibration_device(self, opts: Any) -> type[RecordedDevice] | None:
        """The recorded device `powercut run` measures the fsync overhead of (None: no calibration)."""
        return None

    def command_args(self, opts: Any) -> list[str]:
        """OPTS as `powercut run` arguments (a finding's reproduce.sh --rerun)."""
        fault = getattr(opts, "fault", None)
        return ["--fault", fault] if fault else []

    def describe(self, opts: Any) -> dict[str, Any]:
        """Facts about OPTS for a campaign's or corpus run's report (the kernel under test)."""
        return {}

    def live_guest(self, opts: Any, fss: list[FsType]) -> AbstractContextManager[KeptGuest | None]:
        """The guest runs in one process share (keeps_guest), or None."""
        return nullcontext(None)

    def recheck_config(self, saved: Mapping[str, Any]) -> BackendConfig:
        """Who recovers a crash state of the saved run SAVED (its report) again: the host kernel."""
        return configure("fuse", {})


@dataclass(frozen=True)
class BackendConfig:
    """The chosen engine (resolved: never `auto`) and its options object."""

    name: str
    options: Any

    @property
    def engine(self) -> Engine:
        return ENGINES[self.name]

    def open(self, fs: FsType, workload: WorkloadRunner) -> Backend:
        return self.engine.open(fs, workload, self.options)

    def to_json(self) -> dict[str, Any]:
        """The flat form of a saved run config: `backend` and every engine's option keys (others' defaults)."""
        flat = {o.key: o.default for e in ENGINES.values() for o in e.options}
        flat.update({o.key: getattr(self.options, o.key) for o in self.engine.options})
        return {"backend": self.name, **flat}


ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> None:
    ENGINES[engine.name] = engine


def engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"unknown --backend {name!r}: available: {', '.join(ENGINES)}") from None


def declared_options() -> list[Option]:
    """Every option an engine declares, once each (the command line's backend flags), in registration order."""
    seen: dict[str, Option] = {}
    for e in ENGINES.values():
        for o in e.options:
            seen.setdefault(o.key, o)
    return list(seen.values())


def fault_choices() -> list[str]:
    """Every engine's --fault test modes (the engine checks its own)."""
    return sorted({f for e in ENGINES.values() for f in e.faults})


def option_keys() -> set[str]:
    """Every key an engine declares (the backend part of a flat run config)."""
    return {o.key for e in ENGINES.values() for o in e.options}


def configure(name: str, values: Mapping[str, Any]) -> BackendConfig:
    """`--backend NAME` with the option VALUES (keys of any engine; others are ignored), checked
    (UsageError): an option NAME's engine does not declare must not be given."""
    chosen = engine(name).resolve()
    declared = {o.key for o in chosen.options}
    for other in ENGINES.values():
        for o in other.options:
            if o.key not in declared and values.get(o.key):
                raise UsageError(o.needs)
    own = {o.key: values.get(o.key, o.default) for o in chosen.options}
    return BackendConfig(chosen.name, chosen.parse(own))

"""Backends as engines, registered by name (fio's ioengines: `.name`, `.options`, `register_ioengine`).

An engine says how a run's recording is made and who recovers its crash
images. It declares the options it takes (`options`: their keys, defaults,
and the one line a user gets for giving one to another engine), turns their
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
from foundation.runstate import RunState
from workloads.runner import WorkloadRunner

if TYPE_CHECKING:
    from harness.backends.device import RecordedDevice
    from harness.backends.session import Recording
    from harness.backends.vm.backend import LiveVm


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


# Gives the backend of one run (a campaign worker's live vm guest: LiveVm.open).
BackendOpener = Callable[[FsType, WorkloadRunner], Backend]


@dataclass(frozen=True)
class Option:
    """One option an engine takes (fio's `struct fio_option`). Several engines may declare the same one."""

    key: str          # the argparse dest, and the key in a saved run config (finding.json, campaign.json)
    default: Any      # not given
    needs: str        # the one line for a user who gives it to an engine that does not declare it


class Engine:
    """A backend. Subclasses set `name` and `options`, and define `parse` and `open`."""

    name: ClassVar[str]
    options: ClassVar[tuple[Option, ...]] = ()
    faults: ClassVar[tuple[str, ...]] = ()   # its `--fault` test modes
    records_recovery: ClassVar[bool] = False  # --recovery-crash: it can record a recovery mount
    keeps_guest: ClassVar[bool] = False       # its runs share a guest it keeps (a LiveVm) across runs

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

    def live_guest(self, opts: Any, fss: list[FsType]) -> AbstractContextManager[LiveVm | None]:
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

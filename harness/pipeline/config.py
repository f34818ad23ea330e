"""A run's options as typed values: parsed once, where they come in, and handed down.

They come in as words: the command line (cli/options.py `run_config`), a
saved run config (finding.json `config`, campaign.json `run`: `to_json`'s
flat form), a corpus entry's `run`. `RunConfig.parse` turns any of these into
a RunConfig, checked (UsageError); the pipeline (run.py) only reads values:
crash points, reorder modes, recovery modes, the budget and the backend's own
options (an engine's options object, harness/backends/engine.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from checkers.crashwalk.recovery_crash import RecoveryCrashSpec
from checkers.crashwalk.recovery_modes import check_recovers, parse_recovery, recovery_name
from checkers.fsrules import DEFAULT_TIER, TIERS
from foundation.errors import UsageError
from foundation.filesystems import FsType, get_fs
from harness.backends import BackendConfig, configure
from harness.backends.engine import option_keys
from harness.backends.tools import parse as tools_suite
from replay.crashpoints import EVERY_POINT, Budget, CrashPointSpec, parse_budget
from replay.crashstates import DEFAULT_PER_POINT, DEFAULT_REORDER, ReorderSpec


def host_backend() -> BackendConfig:
    """The default backend: the fuse recorder, no options."""
    return configure("fuse", {})


@dataclass
class RunConfig:
    fs: str
    backend: BackendConfig = field(default_factory=host_backend)  # the engine (resolved) and its options
    mkfs_opts: str = ""
    mount_opts: str | None = None   # None: the workload's suggestion (a scenario's), else none
    size_mib: int = 0               # 0: the file system's default, or more if the workload asks
    crash_points: CrashPointSpec | None = None  # None: the workload's suggestion, else the default
    start_mark: str | None = None   # crash points only from this mark ...
    end_mark: str | None = None     # ... up to this one
    reorder: ReorderSpec = field(default_factory=lambda: ReorderSpec.parse(DEFAULT_REORDER))  # replay/crashstates.py
    jobs: int = 0                   # parallel crash checks; 0: one per CPU, plus one
    first_failure: bool = False
    recovery: tuple[str, ...] = ("rw",)  # recovery modes of every crash image (checkers/crashwalk/recovery_modes.py)
    recovery_crash: RecoveryCrashSpec | None = None  # also crash inside each recovery (recovery_crash.py)
    keep_image: bool = False
    calibrate: bool = False         # measure the recorder's own fsync overhead first (powercut run)
    max_states: Budget | None = None  # crash-point budget (None: every point): replay/crashpoints.py
    quiet: bool = False             # no crash-walk progress (campaigns print their own)
    markdown: bool = False          # also write OUT/report.md with latency figures (powercut run)
    semantics: str = DEFAULT_TIER   # the oracle's tier of rules: posix or linux (checkers/fsrules.py)
    known_damage_findings: bool = False  # damage the configuration documents as findings (checkers/known_damage.py)
    tools: str | None = None        # mkfs/fsck: None the host's, "debian:SUITE" that suite's (harness/backends/tools.py)

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> RunConfig:
        """VALUES in the flat form (KEYS; `fs` required) as a RunConfig, checked (UsageError)
        before anything is made, in the order a user meets them."""
        unknown = set(values) - KEYS
        if unknown:
            raise UsageError(f"unknown run option(s) {', '.join(sorted(unknown))}")
        v = {**FLAT_DEFAULTS, **values}
        fs = get_fs(v["fs"])
        if v["size_mib"]:
            check_size(fs, v["size_mib"])
        crash_points = CrashPointSpec.parse(v["crash_points"]) if v["crash_points"] else None
        budget = parse_budget(v["max_states"])
        if v["semantics"] not in TIERS:
            raise UsageError(f"--semantics {v['semantics']}: choose {' or '.join(TIERS)}")
        if v["jobs"] < 0:
            raise UsageError(f"--jobs {v['jobs']}: must be at least 1 (0: one per CPU, plus one)")
        reorder = ReorderSpec.parse(v["reorder"], v["states_per_point"])
        modes = parse_recovery(v["recovery"])
        check_recovers(v["mount_opts"])
        crash_spec = RecoveryCrashSpec(v["recovery_crash_states"], v["recovery_crash_rate"])
        backend = configure(v["backend"] or "fuse", v)
        tools_suite(v["tools"])
        if v["recovery_crash"] and not backend.engine.records_recovery:
            raise UsageError(f"--recovery-crash records the recovery mount on the fuse recorder; "
                             f"not available with --backend {backend.name}")
        return cls(fs=v["fs"], backend=backend, crash_points=crash_points, reorder=reorder, recovery=modes,
                   recovery_crash=crash_spec if v["recovery_crash"] else None, max_states=budget,
                   **{f.name: v[f.name] for f in plain_fields()})

    def to_json(self) -> dict[str, Any]:
        """The flat form (RunConfig.parse reads it back): the typed fields as words, the others as they are."""
        spec = self.recovery_crash or RecoveryCrashSpec()
        return {"fs": self.fs, **self.backend.to_json(),
                "crash_points": str(self.crash_points) if self.crash_points else None,
                "reorder": str(self.reorder), "states_per_point": self.reorder.per_point,
                "recovery": recovery_name(self.recovery), "recovery_crash": self.recovery_crash is not None,
                "recovery_crash_states": spec.budget, "recovery_crash_rate": spec.rate,
                "max_states": str(self.max_states) if self.max_states else EVERY_POINT,
                **{f.name: getattr(self, f.name) for f in plain_fields()}}


# The fields whose flat form is words of another type (parsed in `parse`, written back in
# `to_json`); every other field is the same value in both forms, listed only in the class.
TYPED_FIELDS = ("fs", "backend", "crash_points", "reorder", "recovery", "recovery_crash", "max_states")


def plain_fields() -> list[Field[Any]]:
    return [f for f in fields(RunConfig) if f.name not in TYPED_FIELDS]


def check_size(fs: FsType, size_mib: int) -> None:
    if size_mib < fs.min_size_mib:
        raise UsageError(f"--size {size_mib} MiB is too small for {fs.name} (minimum {fs.min_size_mib} MiB)")


# The flat form's keys besides the engines' own (option_keys), and their defaults: the typed
# fields' words, and every plain field's own default.
FLAT_DEFAULTS: dict[str, Any] = {
    "backend": "fuse", "crash_points": None, "reorder": DEFAULT_REORDER, "states_per_point": DEFAULT_PER_POINT,
    "recovery": "rw", "recovery_crash": False, "recovery_crash_states": RecoveryCrashSpec.budget,
    "recovery_crash_rate": RecoveryCrashSpec.rate, "max_states": 0,
    **{f.name: f.default for f in plain_fields() if f.default is not MISSING},
}
KEYS = {"fs", *FLAT_DEFAULTS, *option_keys()}

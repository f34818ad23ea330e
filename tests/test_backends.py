"""The backend registry: each engine checks its own options, a run config reads back as
itself, and the host's and the guest's recording sequences write the marks in one order."""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any

import pytest

from common import ROOT
from foundation.errors import UsageError
from harness.backends import ENGINES, configure
from harness.pipeline.config import RunConfig
from replay.crashpoints import Budget, CrashPointSpec
from replay.crashstates import ReorderSpec


def _given(default: Any) -> Any:
    return ("/dev/x",) if isinstance(default, tuple) else "x"


@pytest.mark.parametrize("name", [n for n, e in ENGINES.items() if e.resolve() is e])
def test_an_option_the_chosen_engine_does_not_declare_is_refused_with_that_options_line(name: str) -> None:
    declared = {o.key for o in ENGINES[name].options}
    foreign = {o.key: o for e in ENGINES.values() for o in e.options if o.key not in declared}
    assert foreign  # every engine lacks some other engine's option
    for key, option in foreign.items():
        with pytest.raises(UsageError) as e:
            configure(name, {"kernel": "debian:k", key: _given(option.default)})
        assert str(e.value) == option.needs


def test_each_engine_checks_its_own_values() -> None:
    with pytest.raises(UsageError, match="--backend vm needs --kernel"):
        configure("vm", {})
    with pytest.raises(UsageError, match="the vm backend knows"):
        configure("vm", {"kernel": "debian:k", "fault": "recovery-drop-flush"})
    with pytest.raises(UsageError, match="--fault recovery-panic needs --backend vm"):
        configure("fuse", {"fault": "recovery-panic"})
    with pytest.raises(UsageError, match="--device-profile warp"):
        configure("fuse", {"device_profile": "warp"})
    with pytest.raises(UsageError, match="unknown --backend 'tape': available: fuse, dm, vm, auto"):
        configure("tape", {})


def test_a_run_config_reads_back_from_its_saved_form_as_the_same_typed_values() -> None:
    flat = {"fs": "xfs", "backend": "vm", "kernel": "debian:linux-image-6.12-amd64", "fault": "recovery-hang",
            "mkfs_opts": "-m crc=1", "mount_opts": "wsync", "size_mib": 300, "crash_points": "write,7",
            "reorder": "torn:512,drop-one", "states_per_point": 3, "recovery": "both", "max_states": "design+9",
            "semantics": "linux", "jobs": 2}
    cfg = RunConfig.parse(flat)
    assert cfg.crash_points == CrashPointSpec("write,7", ("write",), 7)
    assert cfg.reorder == ReorderSpec(drop_one=True, torn_units=(512,), per_point=3)
    assert (cfg.recovery, cfg.max_states, cfg.backend.options.fault) == (("rw", "ro"), Budget(9, True), "recovery-hang")
    saved = cfg.to_json()
    assert {k: saved[k] for k in flat} == flat  # the flat form keeps the user's words
    assert RunConfig.parse(saved) == cfg
    # every field has its key in the flat form (the backend: its engine's option keys and `backend`)
    assert {f.name for f in dataclasses.fields(RunConfig)} <= set(saved)


def test_a_bad_spec_is_one_usage_line_before_anything_runs() -> None:
    for key, value, line in [("crash_points", "flush,often", "--crash-points 'flush,often'"),
                             ("reorder", "shuffle", "--reorder 'shuffle'"), ("recovery", "rx", "--recovery 'rx'"),
                             ("max_states", "some", "--max-states some"), ("jobs", -1, "--jobs -1")]:
        with pytest.raises(UsageError, match=re.escape(line)):
            RunConfig.parse({"fs": "ext4", key: value})
    with pytest.raises(UsageError, match="--recovery-crash records the recovery mount on the fuse recorder"):
        RunConfig.parse({"fs": "ext4", "backend": "vm", "kernel": "debian:k", "recovery_crash": True})


def _host_steps() -> list[str]:
    """The steps of harness/backends/session.py `record`, in source order."""
    tree = ast.parse((ROOT / "harness/backends/session.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "record")
    steps = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, obj = node.func.attr, ast.unparse(node.func.value)
            if name == "mkfs_cmd" or (obj, name) == ("fs", "make"):
                steps.append((node.lineno, "mkfs"))
            elif (obj, name) == ("sysres", "mount"):
                steps.append((node.lineno, "mount"))
            elif (obj, name) == ("device", "mark"):
                steps.append((node.lineno, "mark " + ast.unparse(node.args[0])))
            elif (obj, name) == ("workload", "run"):
                steps.append((node.lineno, "workload"))
            elif (obj, name) == ("state", "release"):  # the mount's release unmounts
                steps.append((node.lineno, "umount"))
    return [s for _, s in sorted(steps)]


def _guest_steps() -> list[str]:
    """The steps of the guest's harness/backends/vm/guest/record.sh, with its mark variables
    named by the host constants harness/backends/vm/backend.py sets them to."""
    backend = (ROOT / "harness/backends/vm/backend.py").read_text()
    names = dict(re.findall(r'"(PC_MARK_\w+)": (MARK_\w+)', backend))
    steps = []
    for line in (ROOT / "harness/backends/vm/guest/record.sh").read_text().splitlines():
        line = line.strip()
        if line.startswith("eval \"$PC_MKFS"):
            steps.append("mkfs")
        elif line.startswith("err=$(mount -t"):
            steps.append("mount")
        elif m := re.fullmatch(r'mark "\$(PC_MARK_\w+)"', line):
            steps.append("mark " + names[m[1]])
        elif line.startswith('eval "$PC_WORKLOAD"'):
            steps.append("workload")
        elif line.startswith("err=$(umount /mnt"):
            steps.append("umount")
    return steps


def test_the_host_and_the_guest_record_in_the_same_order() -> None:
    """The sequence is written twice (Python on the host, busybox sh in the guest: docs/architecture.md,
    "Backends"); the crash points rely on its marks, so the two must not drift apart."""
    host = _host_steps()
    assert host == ["mkfs", "mark MARK_MKFS", "mount", "mark MARK_MOUNTED", "workload", "mark MARK_WORKLOAD_END",
                    "umount"]
    assert _guest_steps() == host

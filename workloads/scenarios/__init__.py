"""The five seed experiments (seed-experiments.md) as workload generators.

Each scenario is one module here with:

    NAME, SUMMARY        its name (`powercut run scenario:NAME`) and one line
    RUN_DEFAULTS         `powercut run` options the experiment used, applied when
                         not given on the command line ({"mount_opts": ...})
    Params               a frozen dataclass of its parameters (int, float or str)
    params(scale)        the parameters at SCALE; 1.0 reproduces the paper's counts
    generate(p)          the powercut-workload/1 document (a dict)
    analyze(results, p, facts)  its report.json section: what the paper measured
                         (facts: the run's "sysctls" and "device_tuning" in force,
                         and the content oracle's "torn_writes" counts)
    render(section)      that section as Markdown lines
    headline(section)    a few named numbers to compare runs side by side

The document records the generator, scale and resolved parameters, so the
saved workload.json reruns (and re-analyzes) exactly the same experiment.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from foundation.errors import UsageError
from workloads.format import Workload
from workloads.results import Results

MODULES = {
    "recorder": "workloads.scenarios.recorder",
    "fsync-under-load": "workloads.scenarios.fsync_under_load",
    "recording-streams": "workloads.scenarios.recording_streams",
    "fsync-loop": "workloads.scenarios.fsync_loop",
    "lprobe": "workloads.scenarios.lprobe",
    "torn-pages": "workloads.scenarios.torn_pages",
}


def get(name: str) -> ModuleType:
    if name not in MODULES:
        raise UsageError(f"unknown scenario {name!r}: choose one of {', '.join(MODULES)}")
    return importlib.import_module(MODULES[name])


def _convert(field: dataclasses.Field[Any], text: str, name: str) -> Any:
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    try:
        return {"int": int, "float": float, "str": str}[kind](text)
    except ValueError:
        raise UsageError(f"--param {name}={text}: {name} must be {'an integer' if kind == 'int' else 'a number'}") from None


def resolve(name: str, scale: float = 1.0, overrides: Sequence[str] = ()) -> tuple[ModuleType, Any]:
    """The scenario module and its parameters at SCALE with OVERRIDES ("key=value") applied."""
    mod = get(name)
    if not scale > 0:
        raise UsageError(f"--scale {scale}: must be > 0")
    p = mod.params(scale)
    fields = {f.name: f for f in dataclasses.fields(p)}
    changes = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise UsageError(f"--param {item!r}: scenario {name} takes {', '.join(f'{k}=' for k in fields)}")
        changes[key] = _convert(fields[key], value, key)
    return mod, dataclasses.replace(p, **changes)


def document(name: str, scale: float = 1.0, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The workload document of scenario NAME, its generator recorded in it."""
    mod, p = resolve(name, scale, overrides)
    doc = mod.generate(p)
    doc["generator"] = {"name": name, "scale": scale, "params": dataclasses.asdict(p)}
    return doc


def section(workload: Workload, results: Results, facts: dict[str, Any]) -> dict[str, Any] | None:
    """report.json's `scenario` section if a scenario generated WORKLOAD, else None.
    FACTS: what the run had in force ("sysctls", "device_tuning")."""
    generated = of_workload(workload)
    if generated is None or workload.generator is None:
        return None
    mod, p = generated
    return {"name": workload.generator.name, **mod.analyze(results, p, facts)}


def of_workload(workload: Workload) -> tuple[ModuleType, Any] | None:
    """The scenario module and parameters that generated WORKLOAD, if a scenario did."""
    g = workload.generator
    if g is None or g.name not in MODULES:
        return None
    mod = get(g.name)
    known = {f.name for f in dataclasses.fields(mod.Params)}
    return mod, mod.Params(**{k: v for k, v in g.params.items() if k in known})

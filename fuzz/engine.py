"""Fuzz engines, registered by name, as the backends are (harness/backends/engine.py; fio's ioengines).

A fuzz engine generates a campaign's workloads: `run(worker)` runs them in one
worker process until the worker should stop. It declares, in its own module
(fuzz/engine_*.py, registered from the end of the file and listed in
fuzz/engines.py), what it is and what it needs:

- `summary`: its line in `--engine`'s help;
- `groups`: the option groups it reads (OptionGroup: foundation/options.py
  Options with their flags, types, defaults and help, and one check of the
  group's values); a group several engines read is declared once, by the
  engine that owns it, and listed by the others (mixed: exhaustive's and
  hypothesis');
- `defaults`: values it gives other groups' options the user left out (mixed: --seq 2);
- `walks_space`: its workloads are positions of the exhaustive space, so a
  report gives the space's size and progress; `ends_space`: its workers stop
  by themselves only when the space is done (the stop reason "exhausted");
  `space_note`/`counts_space_done`: how a status line says that progress;
- `one_process_per_workload`: it cannot run in a guest a worker keeps;
- `default_on`: the backend kind it is the default for ("host", "guest");
- `require()`: a missing tool ends the campaign with its install hint before any worker;
- `uses_kernel_coverage(options)`: its workers feed on the vm guest's kernel coverage, which
  the campaign then turns on (it costs guest time, so it is off otherwise);
- `report_extra(options, campaign_dir)`: its own report.json fields, and
  `summary_lines(report)` what the printed summary says of them.

Nothing else names an engine: `--engine NAME` is a lookup in ENGINES, and the
CLI builds `--engine`'s choices, its help and every engine flag from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from foundation.errors import UsageError
from foundation.options import Option
from workloads import exhaustive

if TYPE_CHECKING:
    from fuzz.worker import Worker


@dataclass(frozen=True)
class OptionGroup:
    """Options one engine owns (its --help group), and the check of their values together."""

    title: str
    options: tuple[Option, ...]
    # The group's values, parsed: fills defaults that depend on other values, checks
    # them together (UsageError), in place.
    check: Callable[[dict[str, Any]], None] | None = None


class FuzzEngine:
    """A workload generator of campaigns. Subclasses set `name` and `summary` and define `run`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    groups: ClassVar[tuple[OptionGroup, ...]] = ()
    defaults: ClassVar[Mapping[str, Any]] = {}
    walks_space: ClassVar[bool] = False
    ends_space: ClassVar[bool] = False
    counts_space_done: ClassVar[bool] = False   # its workloads are partly the space's: say how many were
    space_note: ClassVar[str] = ""              # after the space's size in a status line
    one_process_per_workload: ClassVar[bool] = False
    default_on: ClassVar[str | None] = None

    def run(self, w: Worker) -> None:
        """Generate and run workloads in worker W until W.should_stop()."""
        raise NotImplementedError

    def require(self) -> None:
        """EnvError if this host lacks what the engine runs (checked once, before any worker starts)."""

    def uses_kernel_coverage(self, options: Mapping[str, Any]) -> bool:
        """Whether its workers feed on the guest's kernel coverage (vm backend): the campaign
        then turns the guest's coverage on (harness/backends/vm/coverage.py; off by default)."""
        return False

    def report_extra(self, options: Mapping[str, Any], campaign_dir: Callable[[str], str]) -> dict[str, Any]:
        """Its own report.json fields (CAMPAIGN_DIR(SUB): a directory of the campaign)."""
        return {}

    def summary_lines(self, report: Mapping[str, Any]) -> list[str]:
        """The summary's lines about its own report fields (space_report's, report_extra's)."""
        e = report.get("exhaustive")
        return [f"  seq-{e['seq']} space: {e['done']} of {e['space']} workloads done"] if e else []

    # -- the exhaustive space, for engines that walk it ------------------------------------
    def space_report(self, options: Mapping[str, Any], done: int) -> dict[str, Any]:
        """The report's "exhaustive" field: the space and how much of it is DONE."""
        if not self.walks_space:
            return {}
        return {"exhaustive": {"seq": options["seq"], "space": space_of(options), "done": done}}

    def space_size(self, options: Mapping[str, Any]) -> str:
        """' of SIZE' (and the note) for an engine that walks the space, '' for one that does not."""
        if not self.walks_space:
            return ""
        note = self.space_note.format(**options)
        return f" of {space_of(options)}{note}"

    def space_progress(self, options: Mapping[str, Any], done: int) -> str:
        """What follows a workload count in a status line: for an engine whose every workload is one
        of the space's, the space's size; for one whose workloads are partly the space's, DONE of them."""
        size = self.space_size(options)
        return f" ({done}{size})" if self.counts_space_done and size else size

    def exhausted(self, options: Mapping[str, Any], done: int, given_up: int, leased: int) -> bool:
        """A joined campaign's space is all done (or given up) and nobody holds a lease."""
        return self.ends_space and done + given_up >= space_of(options) and not leased


def space_of(options: Mapping[str, Any]) -> int:
    """The size of the exhaustive space the engine OPTIONS bound."""
    total = exhaustive.space_size(options["seq"], options.get("core_ops"))
    return min(total, options["seq_cap"] or total)


ENGINES: dict[str, FuzzEngine] = {}


def register_engine(e: FuzzEngine) -> None:
    ENGINES[e.name] = e


def engine(name: str) -> FuzzEngine:
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"unknown --engine {name!r}: available: {', '.join(sorted(ENGINES))}") from None


def default_engine(kind: str) -> str:
    """The engine a campaign on a backend of KIND ("host", "guest") runs without --engine."""
    return next(e.name for e in ENGINES.values() if e.default_on == kind)


def option_groups() -> list[tuple[OptionGroup, list[str]]]:
    """Every engine's option groups, once each, with the engines that read each (registration order)."""
    groups: dict[str, tuple[OptionGroup, list[str]]] = {}
    for e in ENGINES.values():
        for g in e.groups:
            groups.setdefault(g.title, (g, []))[1].append(e.name)
    return list(groups.values())


def engine_options(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a campaign of engine NAME: every engine's option keys (a campaign's saved
    spec has them all), from GIVEN (the command line's values, None where not given), NAME's
    `defaults` filled in, parsed and checked (UsageError)."""
    chosen = engine(name)
    out: dict[str, Any] = {}
    for group, _ in option_groups():
        for o in group.options:
            value = given.get(o.key, o.default)
            if value is None and o.key in chosen.defaults:
                value = chosen.defaults[o.key]
            out[o.key] = o.value(value)
        if group.check is not None:
            group.check(out)
    return out

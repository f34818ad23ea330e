"""The fuzz engines are a registry (fuzz/engine.py): the CLI is built from it and nothing
else in the tree chooses by an engine's name."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from cli.main import build_parser
from foundation.options import Option
from fuzz import engine as registry
from fuzz.engine import FuzzEngine, OptionGroup
from fuzz.engines import ENGINES

ROOT = Path(__file__).resolve().parents[1]
# Where fuzz engines can be named at all: the layers at and above fuzz/ (tests/test_layers.py);
# below, a word like "exhaustive" means something else (a reorder mode).
PACKAGES = ("fuzz", "bench", "cli")


def name_comparisons(source: str, names: set[str]) -> list[int]:
    """Lines of SOURCE that compare something with a string in NAMES (==, !=, in, not in)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            consts = [c for o in operands for c in ([o] if isinstance(o, ast.Constant) else
                                                    getattr(o, "elts", []))]
            if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                lines.append(node.lineno)
    return lines


def test_no_module_compares_with_a_fuzz_engine_name() -> None:
    names = set(ENGINES)
    bad = [f"{p.relative_to(ROOT)}:{line}" for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
           if not p.name.startswith("engine_")   # an engine may name itself
           for line in name_comparisons(p.read_text(), names)]
    assert not bad, "code that branches on a fuzz engine's name (ask the engine instead):\n" + "\n".join(bad)


def test_the_name_check_catches_a_branch() -> None:
    planted = 'def f(spec):\n    if spec.engine == "afl":\n        pass\n    return spec.engine in ("exhaustive", "x")\n'
    assert name_comparisons(planted, {"afl", "exhaustive"}) == [2, 4]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_a_registered_engine_gets_its_choice_help_and_options_on_the_command_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A new engine is a module that registers itself: `powercut fuzz` offers it, says its summary
    # and takes its options, with nothing else changed (registered here for this test only).
    group = OptionGroup("planted engine", (Option("planted_level", "--planted-level", type=int, default=3,
                                                  help="how deep the planted engine digs"),))

    class Planted(FuzzEngine):
        name = "planted"
        summary = "an engine registered by a test"
        groups = (group,)

    monkeypatch.setitem(registry.ENGINES, "planted", Planted())
    fuzz = _subparser(build_parser(), "fuzz")
    engine_arg = next(a for a in fuzz._actions if a.dest == "engine")
    assert "planted" in engine_arg.choices and "an engine registered by a test" in (engine_arg.help or "")
    args = fuzz.parse_args(["--fs", "ext4", "--engine", "planted", "--planted-level", "7"])
    assert args.planted_level == 7
    options = registry.engine_options("planted", {"planted_level": 7})
    assert options["planted_level"] == 7 and options["seq"] == 1  # every engine's keys, as a saved spec holds


def test_an_unknown_engine_is_a_usage_error() -> None:
    from foundation.errors import UsageError
    with pytest.raises(UsageError, match="unknown --engine 'nope'"):
        registry.engine("nope")

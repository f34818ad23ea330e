"""The import rule: a module imports only from its own layer or the layers below.

Layers, bottom to top (docs/architecture.md): the top-level packages in the
order of the data flow (foundation, workloads, replay, checkers, harness,
fuzz, bench, cli), with harness/ split into backends, reports, pipeline and
the corpus runner. The rule is read from the source (ast), so a lazy import
inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("foundation", "workloads", "replay", "checkers", "harness", "fuzz", "bench", "cli")

# (layer name, module prefixes); a module belongs to the first layer with the longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("foundation",)),
    ("workloads", ("workloads",)),
    ("replay", ("replay",)),
    ("checks", ("checkers",)),
    ("backends", ("harness.backends",)),
    ("reports", ("harness.reports",)),
    ("pipeline", ("harness.pipeline",)),
    ("corpus", ("harness.corpus",)),
    ("fuzz", ("fuzz",)),
    ("bench", ("bench",)),
    ("commands", ("cli",)),
]


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of the project's own packages in PATH."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports pkg.mod when that is a module
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or \
                    (ROOT / sub.replace(".", "/") / "__init__.py").exists()
                found.append((node.lineno, sub if is_module else node.module))
    return [(line, m) for line, m in found if m.split(".")[0] in PACKAGES]


def violations(paths: list[Path], root: Path = ROOT) -> list[str]:
    bad = []
    for path in paths:
        me = module_name(path, root)
        mine = layer_of(me)
        if mine is None:
            bad.append(f"{path.relative_to(root)}: module {me} belongs to no layer")
            continue
        for line, target in imported_modules(path):
            theirs = layer_of(target)
            if theirs is None:
                bad.append(f"{path.relative_to(root)}:{line}: imports {target}, which belongs to no layer")
            elif theirs > mine:
                bad.append(f"{path.relative_to(root)}:{line}: {LAYERS[mine][0]} imports "
                           f"{target} ({LAYERS[theirs][0]})")
    return bad


def project_sources() -> list[Path]:
    """Every module of the project but the top-level package markers (empty __init__.py)."""
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if module_name(p) not in PACKAGES)


def test_imports_only_go_down() -> None:
    bad = violations(project_sources())
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    # A foundation module that imports a check must be reported (planted in a copy, not the tree).
    planted = tmp_path / "foundation" / "_planted_upward_import.py"
    planted.parent.mkdir()
    planted.write_text("from checkers.oracle import ContentOracle\n")
    bad = violations([planted], root=tmp_path)
    assert len(bad) == 1 and "foundation imports checkers.oracle (checks)" in bad[0]


def test_every_top_level_package_has_a_layer() -> None:
    # A new top-level package must be placed in the data flow, not slip past the rule.
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert on_disk == set(PACKAGES)


def test_every_layer_has_modules() -> None:
    layers = {layer_of(module_name(p)) for p in project_sources()}
    assert layers == set(range(len(LAYERS)))

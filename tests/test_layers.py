"""The import rule: a module imports only from its own layer or the layers below.

Layers, bottom to top (docs/architecture.md): the top-level packages in the
order of the data flow (foundation, workloads, replay, checkers, harness,
fuzz, bench, cli), with harness/ split into backends, reports, pipeline and
the corpus runner. The rule is read from the source (ast), so a lazy import
inside a function counts as much as one at the top. Within a layer, no two
files may import each other, even through others (test_no_import_cycles).
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


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
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
                is_module = (root / sub.replace(".", "/")).with_suffix(".py").exists() or \
                    (root / sub.replace(".", "/") / "__init__.py").exists()
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


def import_graph(paths: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (any import: at the top, in a function, for type
    checking only), each a file: a package's __init__.py when the name is a package's."""
    modules = {module_name(p, root): p for p in paths}
    graph: dict[str, set[str]] = {}
    for me, path in modules.items():
        graph[me] = {target for _, target in imported_modules(path, root) if target in modules and target != me}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of GRAPH: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    # File level: two modules that import each other (even lazily, or for type hints only) are one
    # module in two files; the fix is to move what both need below both.
    found = cycles(import_graph(project_sources()))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_catches_a_circle(tmp_path: Path) -> None:
    # Three modules in a circle, one import lazy (inside a function): one circle of three.
    pkg = tmp_path / "workloads"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from workloads import b\n")
    (pkg / "b.py").write_text("from workloads.c import thing\n")
    (pkg / "c.py").write_text("def thing():\n    from workloads.a import x\n")
    (pkg / "d.py").write_text("from workloads import a\n")  # imports the circle, is not in it
    paths = sorted(p for p in pkg.glob("*.py") if p.name != "__init__.py")
    assert cycles(import_graph(paths, root=tmp_path)) == [["workloads.a", "workloads.b", "workloads.c"]]

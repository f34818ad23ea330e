"""The time-to-find table's validation workloads (bench/validation/) stay out of every generator.

Each pair of bench/bugpairs.json was confirmed with a hand-written workload of
the bug's shape; they are kept in bench/validation/ so the confirmation can be
repeated (`powercut run FILE --backend vm --kernel debian:PKG`, docs/time-to-find.md).
The benchmark is honest only if the campaign has to find the shape itself, so
no module below the bench layer (the generators, the fuzzer, the corpus
runner) may name that folder or the table, and bench/ttf.py itself never
reads a bug's `workload` (it only builds the campaign from fs and options).
"""

from __future__ import annotations

import ast

from bench.ttf import load_table
from common import GENERATOR_PACKAGES, ROOT
from workloads.format import load_workload

VALIDATION = ROOT / "bench" / "validation"


def test_every_pair_names_a_validation_workload_that_loads() -> None:
    named = set()
    for b in load_table():
        assert b.workload.startswith("bench/validation/"), b.id
        path = ROOT / b.workload
        assert path.is_file(), f"{b.id}: {b.workload} missing"
        load_workload(path)   # schema and semantic checks of the workload format
        named.add(path.name)
    assert named == {p.name for p in VALIDATION.glob("*.json")}, "a validation workload no pair names"


def test_no_generator_package_names_the_validation_folder_or_the_table() -> None:
    hits = []
    for pkg in GENERATOR_PACKAGES:
        for src in (ROOT / pkg).rglob("*"):
            if src.suffix not in (".py", ".c", ".h", ".sh") or not src.is_file():
                continue
            text = src.read_text(errors="replace")
            hits += [f"{src.relative_to(ROOT)}: {word}" for word in ("validation/", "bugpairs") if word in text]
    assert hits == []


def test_the_benchmark_never_reads_a_bugs_validation_workload() -> None:
    tree = ast.parse((ROOT / "bench" / "ttf.py").read_text())
    reads = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "workload"]
    assert reads == []

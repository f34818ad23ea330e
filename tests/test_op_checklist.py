"""Every op kind the workload schema accepts is known everywhere an op must be.

An op lives in six files (docs/architecture.md, "Adding an op"): the schema
(its fields, and its plan line: `x-plan`, from which workloads/plan.py and
the executor's generated tables take theirs), the executor's syscall
(executor/ops.c), the model (checkers/history.py), the generators
(workloads/vocab.py, or the bounded spaces of workloads/exhaustive.py and
workloads/ace.py) and both exports (harness/reports/export/ops.py and
pc-repro.c). Adding a kind to the schema and forgetting one of them fails
here, naming the place. The few kinds a place leaves out on purpose are
listed with the reason.
"""

from __future__ import annotations

import json
import re

import pytest

from checkers.history import HistoryBuilder
from conftest import ROOT
from workloads import exhaustive, vocab

SCHEMA = json.loads((ROOT / "workloads/schema/workload.schema.json").read_text())
KINDS: list[str] = SCHEMA["$defs"]["kind"]["enum"]

# Kinds a place leaves out on purpose, and why.
NOT_MODELLED = {
    "read": "reads change nothing on disk",
    "pread": "reads change nothing on disk",
    "fiemap": "a query; its FIEMAP_FLAG_SYNC flush is no promise the model relies on",
    "sleep": "timing only",
    "repeat": "the executor expands it; the model sees the repeated ops",
    "barrier": "thread ordering only",
    "sync_file_range": "promises no durability (sync_file_range(2): no metadata, no cache flush)",
}
NOT_GENERATED = {
    "fiemap": "a query, for scenarios that count extents",
    "sleep": "timing only, for scenarios",
    "repeat": "for scenarios (periodic writers)",
    "barrier": "for hand-written multi-thread workloads",
    "creat": "open with O_CREAT|O_TRUNC covers it",
}
NOT_EXPORTED = {
    "read": "changes nothing on disk",
    "pread": "changes nothing on disk",
    "fiemap": "a query",
    "statx": "a query",
    "sleep": "timing only",
    "repeat": "exports take the shrunk, expanded ops",
    "barrier": "exports run one serialised order",
}
# pc-repro.c only: what export/ops.py writes as another kind.
REPRO_WRITTEN_AS = {"creat": "open O_CREAT|O_WRONLY|O_TRUNC"}


def _text(rel: str) -> str:
    return (ROOT / rel).read_text()


def _generated() -> set[str]:
    kinds = {k for tier in (*vocab.KIND_TIERS, *vocab.EXCHANGE_KIND_TIERS, *vocab.kind_tiers(False, atomic=True))
             for k in tier} | set(vocab.PERSIST_KINDS)
    kinds |= set(re.findall(r'"op": "(\w+)"', _text("workloads/exhaustive.py")))
    return kinds | {c for c in dir(exhaustive) if c in KINDS}


# Each place: the file a new op is written into, and whether a kind is known there.
PLACES = {
    "workloads/schema/workload.schema.json": lambda k: "x-plan" in SCHEMA["$defs"].get(f"op_{k}", {}),
    "workloads/executor/ops.c": lambda k: f"case K_{k.upper()}" in _text("workloads/executor/ops.c"),
    "checkers/history.py": lambda k: k in NOT_MODELLED or hasattr(HistoryBuilder, "op_" + k),
    "workloads/vocab.py": lambda k: k in NOT_GENERATED or k in _generated(),
    "harness/reports/export/ops.py": lambda k: k in NOT_EXPORTED or f'"{k}"' in _text("harness/reports/export/ops.py"),
    "harness/reports/export/pc-repro.c": lambda k: k in NOT_EXPORTED or k in REPRO_WRITTEN_AS or
    f'{{"{k}",' in _text("harness/reports/export/pc-repro.c"),
}


def test_a_new_op_is_written_in_at_most_six_files_the_guide_names() -> None:
    # The developers' promise (docs/architecture.md, "Adding an op"): these files and no others.
    section = _text("docs/architecture.md").split("## Adding an op")[1].split("\n## ")[0]
    assert len(PLACES) <= 6
    assert all(f"`{f}`" in section for f in PLACES), section

@pytest.mark.parametrize("place", PLACES)
def test_every_schema_kind_is_known_in(place: str) -> None:
    missing = [k for k in KINDS if not PLACES[place](k)]
    assert not missing, f"{place} does not know {missing} (docs/architecture.md: adding an op)"


def test_the_exemptions_name_real_kinds() -> None:
    # A stale exemption would hide a kind that has since been renamed or dropped.
    assert set(NOT_MODELLED) | set(NOT_GENERATED) | set(NOT_EXPORTED) | set(REPRO_WRITTEN_AS) <= set(KINDS)


def test_the_checklist_catches_a_kind_added_only_to_the_schema() -> None:
    added = "copy_file_range_planted"
    assert [p for p in PLACES if not PLACES[p](added)] == list(PLACES)

"""The regression corpus: workloads with expected verdicts per configuration.

A corpus entry (`corpus/**/*.json`, format `powercut-corpus/1`) holds a
workload (inline, in the one workload format), why it is there, run options
(crash points, ...), and the expected verdict per matrix row: `"clean"`,
the list of finding kinds expected, or `{"must": KINDS, "may": KINDS}` where
a kind may or may not show up (timing decides, e.g. ext4 without a journal:
whether background writeback persisted the bitmaps before a crash point). A matrix (`corpus/matrix.json`) names
configurations: file system, mkfs options, mount options. Expectations are
keyed by row *name*, so a row whose options change (a mount-option change
in a product) shows up as unexpected verdicts.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundation.errors import UsageError
from workloads.format import parse_workload

ENTRY_FORMAT = "powercut-corpus/1"
MATRIX_FORMAT = "powercut-matrix/1"
CORPUS_DIR = Path(__file__).resolve().parents[2] / "corpus"
# Verdicts ignore latency: timing depends on the machine; the baseline
# comparison judges latency instead.
VERDICT_KINDS = ("kernel", "mount", "fsck", "corruption", "durability", "stale-data", "atomicity", "design",
                 "semantics")


@dataclass(frozen=True)
class Row:
    name: str
    fs: str
    mkfs_opts: str = ""
    mount_opts: str = ""
    recovery: str | None = None    # rw, ro or both; None: what `corpus run --recovery` says (default rw)


@dataclass
class Entry:
    name: str
    path: str
    why: str
    workload: dict[str, Any]
    expect: dict[str, list[str]]          # row name (or fs name, or "default") -> kinds ([] = clean)
    run: dict[str, Any] = field(default_factory=dict)
    fs: list[str] = field(default_factory=list)  # file systems it applies to (empty: all)
    may: dict[str, list[str]] = field(default_factory=dict)  # same keys: kinds allowed on top of `expect`

    def _key(self, row: Row) -> str | None:
        return next((k for k in (row.name, row.fs, "default") if k in self.expect), None)

    def expected(self, row: Row) -> list[str]:
        key = self._key(row)
        return [] if key is None else self.expect[key]

    def allowed(self, row: Row) -> list[str]:
        """Kinds that may show up on ROW besides the expected ones."""
        key = self._key(row)
        return [] if key is None else self.may.get(key, [])

    def applies(self, row: Row) -> bool:
        return not self.fs or row.fs in self.fs


def _verdict(v: Any, where: str) -> list[str]:
    kinds = [] if v == "clean" else v
    if not isinstance(kinds, list) or any(k not in VERDICT_KINDS for k in kinds):
        raise UsageError(f"{where}: a verdict is \"clean\", a list of {', '.join(VERDICT_KINDS)}, "
                         f"or {{\"must\": ..., \"may\": ...}} of those")
    return sorted(set(kinds))


def _expectation(v: Any, where: str) -> tuple[list[str], list[str]]:
    """(kinds that must show up, kinds that may) of one expectation."""
    if not isinstance(v, dict):
        return _verdict(v, where), []
    if set(v) - {"must", "may"}:
        raise UsageError(f"{where}: an expectation object has only \"must\" and \"may\"")
    must, may = _verdict(v.get("must", "clean"), where), _verdict(v.get("may", "clean"), where)
    return must, sorted(set(may) - set(must))


def load_doc(path: str | Path, fmt: str, what: str) -> dict[str, Any]:
    """A JSON document of format FMT, or a one-line UsageError naming WHAT it should be."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: not {what} ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise UsageError(f"{path}: not {what} (format must be {fmt!r})")
    return doc


def load_entry(path: str | Path) -> Entry:
    doc = load_doc(path, ENTRY_FORMAT, "a corpus entry")
    for key in ("name", "why", "workload"):
        if key not in doc:
            raise UsageError(f"{path}: missing {key!r}")
    try:
        parse_workload(doc["workload"])
    except UsageError as e:  # name the entry and the workload's bad field
        raise UsageError(f"{path}: {e}") from None
    parsed = {k: _expectation(v, f"{path}: expect.{k}") for k, v in doc.get("expect", {}).items()}
    expect = {k: must for k, (must, _) in parsed.items()}
    may = {k: may for k, (_, may) in parsed.items() if may}
    return Entry(doc["name"], str(path), doc["why"], doc["workload"], expect, doc.get("run", {}), doc.get("fs", []), may)


def load_corpus(root: str | Path = CORPUS_DIR, pattern: str = "*") -> list[Entry]:
    entries = []
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith(".json") and f != "matrix.json" and not f.startswith("matrix"):
                e = load_entry(os.path.join(dirpath, f))
                if any(fnmatch.fnmatch(e.name, p.strip()) for p in pattern.split(",")):
                    entries.append(e)
    names = [e.name for e in entries]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UsageError(f"corpus: duplicate entry names: {', '.join(sorted(dup))}")
    return sorted(entries, key=lambda e: e.name)


def load_matrix(path: str | Path) -> list[Row]:
    doc = load_doc(path, MATRIX_FORMAT, "a matrix file")
    if not isinstance(doc.get("rows"), list):
        raise UsageError(f"{path}: not a matrix file (no list of rows)")
    rows = []
    for i, r in enumerate(doc["rows"]):
        if not isinstance(r, dict) or "name" not in r or "fs" not in r:
            raise UsageError(f"{path}: rows[{i}] needs a name and an fs")
        rows.append(Row(r["name"], r["fs"], r.get("mkfs_opts", ""), r.get("mount_opts", ""), r.get("recovery")))
    return rows


def entry_doc(name: str, why: str, workload: dict[str, Any], expect: dict[str, Any],
              run: dict[str, Any] | None = None, fs: list[str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": ENTRY_FORMAT, "name": name, "why": why}
    if fs:
        doc["fs"] = fs
    if run:
        doc["run"] = run
    doc["expect"] = expect
    doc["workload"] = workload
    return doc

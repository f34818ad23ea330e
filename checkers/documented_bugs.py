"""Triage: is a finding a bug docs/bugs/ already documents, or something new?

One matcher for every place that names a finding (the end of a campaign,
its report.md, `powercut export --format report`, and the campaign's
choice not to shrink a known bug again). The bugs are data
(documented_bugs.json beside this module; docs/bugs/README.md agrees with it,
tests/test_documented_bugs.py checks that): each a shape of the file system
and mkfs features it needs, the finding kinds and oracle rules it shows as,
and the op kinds its workload holds in order; a bug with `crash_state`
"unflushed-sync" only names findings whose crash state lost a write a
completed sync had not flushed (checkers/unflushed_sync.py: their signature's
rule ends in its SUFFIX), and no other bug needs that condition. A finding on
a kernel that has the bug's fix is not that bug: the triage says "new" and why.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from checkers.unflushed_sync import SUFFIX

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "documented_bugs.json")
CLASSES = {"kernel-bug": "documented kernel bug", "candidate": "documented candidate kernel bug (not yet verified)",
           "model-limit": "known model limit"}


@dataclass(frozen=True)
class Triage:
    verdict: str        # "documented" or "new"
    bug: str = ""       # the documented bug's id
    name: str = ""
    bug_class: str = ""  # kernel-bug, candidate, model-limit
    report: str = ""    # its report in docs/bugs/, if it has one
    note: str = ""      # why "new" when the shape matched (the kernel has the fix)

    def line(self) -> str:
        """The triage in one line, as a campaign prints it."""
        if self.verdict == "documented":
            return f"{CLASSES.get(self.bug_class, self.bug_class)} {self.bug}: {self.name}"
        return "new" + (f" ({self.note})" if self.note else ": no documented bug has this shape")

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}


def table_path() -> str:
    # Tests point this at a table of their own (a shape a harness fault produces).
    return os.environ.get("POWERCUT_DOCUMENTED_BUGS") or TABLE


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[dict[str, Any], ...]:
    with open(path) as f:
        return tuple(json.load(f)["bugs"])


def bugs() -> tuple[dict[str, Any], ...]:
    return _load(table_path())


def _version(kernel: str) -> tuple[int, ...] | None:
    """6.12.117+deb12-amd64 -> (6, 12, 117); Debian 6.1's uname (6.1.0-55-amd64) says nothing of its patch level."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", kernel or "")
    if not m or (m.group(3) == "0" and re.match(r"\d+\.\d+\.0-\d+", kernel)):
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def fixed_on(bug: dict[str, Any], kernel: str) -> bool | None:
    """Whether KERNEL has BUG's fix: True, False, or None (unknown: its version says too little)."""
    fix = bug.get("fixed_in") or {}
    v = _version(kernel)
    if not fix or v is None:
        return None if fix else False
    for first in fix.get("series", []):
        f = _version(first) or ()
        if v[:2] == f[:2]:
            return v >= f
    mainline = _version(fix.get("mainline", ""))
    if mainline is not None:
        return v[:2] >= mainline[:2]
    return None


def _op_matches(want: str, op: dict[str, Any]) -> bool:
    for alt in want.split("|"):
        kind, _, flag = alt.partition("[")
        if op.get("op") == kind and (not flag or flag.rstrip("]") in (op.get("flags") or [])):
            return True
    return False


def holds_ops(wanted: list[str], doc: dict[str, Any]) -> bool:
    """Whether DOC's ops (threads one after the other) hold WANTED's op kinds in that order."""
    i = 0
    for op in (op for t in doc.get("threads", []) for op in t.get("ops", [])):
        if i < len(wanted) and _op_matches(wanted[i], op):
            i += 1
    return i == len(wanted)


def _mount_fits(bug: dict[str, Any], mount_opts: str) -> bool:
    # "compress" matches compress=zstd, compress-force=lzo, ...; "nocompress"/"compress=no" do not
    opts = [o for o in (mount_opts or "").split(",") if o and not o.endswith("=no")]
    return all(any(re.fullmatch(rf"{re.escape(want)}([=-].*)?", o) for o in opts)
               for want in bug.get("mount_options", []))


def _shape_fits(bug: dict[str, Any], fs: str, mkfs_opts: str, kind: str, rule: str, doc: dict[str, Any],
                mount_opts: str = "") -> bool:
    rule, suffix, _ = rule.partition(SUFFIX)
    if bug["fs"] != fs or kind not in bug["kinds"]:
        return False
    if bug.get("crash_state") == SUFFIX.lstrip("@") and not suffix:
        return False
    if bug.get("rules") and rule not in bug["rules"]:
        return False
    if any(not re.search(rf"(?<![\w^]){re.escape(feat)}\b", mkfs_opts or "") for feat in bug.get("mkfs_features", [])):
        return False
    if not _mount_fits(bug, mount_opts):
        return False
    return holds_ops(bug["ops"], doc)


def triage(*, fs: str, mkfs_opts: str, signature: str, doc: dict[str, Any], kernel: str = "",
           mount_opts: str = "") -> Triage:
    """The documented bug a finding (its signature key KIND|OP|RULE, its workload DOC, made on
    FS with MKFS_OPTS and MOUNT_OPTS on KERNEL) is, or "new"."""
    kind, _, rest = signature.partition("|")
    rule = rest.partition("|")[2]
    fixed_note = ""
    for bug in bugs():
        if not _shape_fits(bug, fs, mkfs_opts, kind, rule, doc, mount_opts):
            continue
        if fixed_on(bug, kernel):
            fixed_note = fixed_note or f"the shape of {bug['id']}, but {kernel} has its fix"
            continue
        return Triage("documented", bug["id"], bug["name"], bug["class"], bug.get("report", ""))
    return Triage("new", note=fixed_note)


def triage_finding(info: dict[str, Any], doc: dict[str, Any], kernel: str = "") -> Triage:
    """triage() of a saved finding: its finding.json INFO and workload.json DOC."""
    cfg = info.get("config", {})
    sigs = info.get("signatures") or []
    best = Triage("new")
    for sig in sigs:  # a shrink may have moved to a neighbour signature: any of them names it
        t = triage(fs=cfg.get("fs", ""), mkfs_opts=cfg.get("mkfs_opts", ""), signature=sig, doc=doc, kernel=kernel,
                   mount_opts=cfg.get("mount_opts", ""))
        if t.verdict == "documented":
            return t
        best = best if best.note else t
    return best

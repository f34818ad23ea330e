"""Compare two corpus results files (`powercut corpus diff A B`): verdict
changes per case and latency side by side, as Markdown. Used to judge a
kernel upgrade: the same corpus sample on the old and the new kernel
(`make ci-kernel`). A verdict difference (a case that errored or is missing
on one side included) is what makes the diff fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.corpus.run import LATENCY_STATS

MISSING = "missing"


def verdict_text(case: dict[str, Any] | None) -> str:
    if case is None:
        return MISSING
    if case.get("verdict") is None:
        return f"error: {case.get('error', '')}".strip()
    return ", ".join(case["verdict"]) or "clean"


@dataclass
class CaseDiff:
    key: str
    a: str  # verdict text on side A
    b: str
    latency: dict[str, dict[str, tuple[float | None, float | None]]]  # kind -> stat -> (A, B)

    @property
    def changed(self) -> bool:
        return self.a != self.b


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[CaseDiff]:
    ca, cb = a.get("cases", {}), b.get("cases", {})
    out = []
    for key in sorted(set(ca) | set(cb)):
        la, lb = (ca.get(key) or {}).get("latency", {}), (cb.get(key) or {}).get("latency", {})
        latency = {kind: {s: (la.get(kind, {}).get(s), lb.get(kind, {}).get(s)) for s in LATENCY_STATS}
                   for kind in sorted(set(la) | set(lb))}
        out.append(CaseDiff(key, verdict_text(ca.get(key)), verdict_text(cb.get(key)), latency))
    return out


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ratio(old: float | None, new: float | None) -> str:
    return f"{new / old:.2f}x" if old and new is not None else "-"


def side(doc: dict[str, Any]) -> str:
    return f"{doc.get('kernel', '?')} ({doc.get('backend', 'fuse')})"


def markdown(a: dict[str, Any], b: dict[str, Any], diffs: list[CaseDiff], names: tuple[str, str]) -> str:
    changed = [d for d in diffs if d.changed]
    lines = [f"# powercut corpus diff: A = {side(a)}, B = {side(b)}", "",
             f"A: `{names[0]}`  ", f"B: `{names[1]}`", "",
             f"{len(diffs)} cases, **{len(changed)} verdict changes**." if changed else f"{len(diffs)} cases, no verdict change.",
             "", "## Verdicts", "", "| case | A | B | |", "| --- | --- | --- | --- |"]
    for d in sorted(diffs, key=lambda d: (not d.changed, d.key)):
        lines.append(f"| {d.key} | {d.a} | {d.b} | {'**changed**' if d.changed else ''} |")
    lines += ["", "## Latency (us; B/A)", "", "| case | op | p99 A | p99 B | p99 B/A | max A | max B | max B/A |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in diffs:
        for kind, st in d.latency.items():
            (pa, pb), (ma, mb) = st["p99_us"], st["max_us"]
            lines.append(f"| {d.key} | {kind} | {_us(pa)} | {_us(pb)} | {_ratio(pa, pb)} "
                         f"| {_us(ma)} | {_us(mb)} | {_ratio(ma, mb)} |")
    return "\n".join(lines) + "\n"

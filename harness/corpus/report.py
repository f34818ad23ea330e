"""The corpus run's Markdown summary and JUnit XML (one testcase per entry x row)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from harness.corpus.run import Case


def _verdict(v: list[str] | None) -> str:
    if v is None:
        return "error"
    return ", ".join(v) if v else "clean"


def _expected(c: Case) -> str:
    return _verdict(c.expected) + (f", may: {', '.join(c.may)}" if c.may else "")


def markdown(cases: list[Case], doc: dict) -> str:
    s = doc["summary"]
    lines = [f"# powercut corpus run on kernel {doc['kernel']}", "",
             f"{s['cases']} cases, {s['unexpected']} unexpected verdicts, {s['regressions']} latency regressions, "
             f"{s['errors']} errors, {doc['seconds']} s.", "",
             "| entry | row | expected | verdict | baseline | regressions |", "| --- | --- | --- | --- | --- | --- |"]
    for c in sorted(cases, key=lambda c: (not c.failed, c.row, c.entry)):
        mark = "**" if c.failed else ""
        base = "" if c.baseline_verdict is None else _verdict(c.baseline_verdict)
        lines.append(f"| {mark}{c.entry}{mark} | {c.row} | {_expected(c)} | {mark}{_verdict(c.verdict)}{mark} "
                     f"| {base} | {'; '.join(c.regressions) or c.error} |")
    return "\n".join(lines) + "\n"


def junit(cases: list[Case], doc: dict) -> bytes:
    suite = ET.Element("testsuite", name="powercut-corpus", tests=str(len(cases)),
                       failures=str(sum(c.failed and not c.error for c in cases)),
                       errors=str(sum(bool(c.error) for c in cases)), time=str(doc["seconds"]))
    for c in cases:
        tc = ET.SubElement(suite, "testcase", classname=f"corpus.{c.row}", name=c.entry)
        if c.error:
            ET.SubElement(tc, "error", message=c.error)
        elif c.failed:
            msgs = []
            if c.unexpected:
                msgs.append(f"expected {_expected(c)}, got {_verdict(c.verdict)}")
            msgs += c.regressions
            ET.SubElement(tc, "failure", message="; ".join(msgs)).text = f"report: {c.report}"
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)

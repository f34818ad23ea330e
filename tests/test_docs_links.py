"""Every relative link in README.md and docs/ points at a file that exists, and at a heading in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes."""
    heads = [l.lstrip("#").strip() for l in page.read_text().splitlines() if l.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no such heading")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Title\n[a](p.md#title) [b](missing.md) [c](#nowhere)\n")
    assert broken_links(page) == ["missing.md: no such file", "#nowhere: no such heading"]


def test_the_readme_stays_a_readme() -> None:
    # The manual lives in docs/ (issue 26): the README says what, set-up, first steps.
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300

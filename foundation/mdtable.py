"""Markdown tables, for every report that prints one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table; cells are str()-ed and '|' escaped."""
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [line(headers), line(["---"] * len(headers)), *(line(r) for r in rows)]

"""Results of the oracle's checks kept between crash states of one worker.

A crash state differs from the one checked before by a few writes: a file's
chunks unchanged since then are not decoded again, and a check whose inputs
(the file's bytes, what the model expects of it) are unchanged is not redone.
The file bytes themselves are reused by checkers/filememo.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from checkers.findings import Finding
from checkers.untorn import WriteVerdict
from workloads.pattern import ChunkScan, scan_chunks

T = TypeVar("T")
FileVerdict = tuple[Finding | None, list[WriteVerdict]]


class CheckMemo:
    def __init__(self) -> None:
        self._scans: dict[str, ChunkScan] = {}   # path -> its chunks at the last crash state checked
        self._verdicts: dict[tuple[Any, ...], FileVerdict] = {}
        self.records: dict[tuple[Any, ...], tuple[dict[str, Any], list[Finding]]] = {}  # check_records' own memo
        self.written: dict[tuple[Any, ...], dict[int, tuple[int, int, int, int]]] = {}  # design.written_records

    def scan(self, path: str, data: bytes) -> ChunkScan:
        """PATH's chunks, reusing the verdicts of chunks unchanged since the last
        crash state checked (a crash state differs from the one before by a few writes)."""
        prev = self._scans.get(path)
        if prev is not None and prev.data is data:
            return prev
        got = scan_chunks(data, prev)
        self._scans[path] = got
        return got

    def file_verdict(self, key: tuple[Any, ...] | None, compute: Callable[[], FileVerdict]) -> FileVerdict:
        """The verdict for a file check with inputs KEY (None: not memoised)."""
        hit = self._verdicts.get(key) if key is not None else None
        if hit is None:
            hit = compute()
            if key is not None:
                if len(self._verdicts) > 4096:
                    self._verdicts.clear()
                self._verdicts[key] = hit
        return hit

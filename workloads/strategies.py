"""Hypothesis strategies for random workloads in the one workload format.

A workload is a list of op records (workloads/opcodec.py), each one op and
the persistence op after it, decoded by the builder in workloads/vocab.py:
op sequences over A/, B/, A/C/, foo and bar; offsets and lengths mostly small
and 4 KiB aligned, sometimes unaligned or 1 MiB; fds always opened before
use; most ops followed by fsync or fdatasync of the fd just used, or sync.
AFL++ mutates the same records.

Why records and not a composite strategy: Hypothesis deletes list elements
cleanly, so a failing workload shrinks op by op; and every choice is a byte
whose zero is the simplest option, so shrinking moves toward short, plain
workloads (pwrite, no persistence op, first file, aligned).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from workloads.format import workload_doc
from workloads.opcodec import RECORD, decode

_records = st.binary(min_size=RECORD, max_size=RECORD)


def op_lists(min_ops: int = 3, max_ops: int = 12, reflink: bool = True,
             exchange: bool = False, atomic: bool = False) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Op lists of MIN_OPS..MAX_OPS records (each an op, maybe an open before it and a
    persistence op after it), never empty; clones only if REFLINK (the file system has them),
    range exchanges only if EXCHANGE, f2fs atomic batches only if ATOMIC."""
    return st.lists(_records, min_size=max(1, min_ops), max_size=max_ops).map(
        lambda r: decode(b"".join(r), reflink, exchange, atomic))


def workloads(min_ops: int = 3, max_ops: int = 12, reflink: bool = True,
              exchange: bool = False, atomic: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    return op_lists(min_ops, max_ops, reflink, exchange, atomic).map(workload_doc)

"""Hypothesis strategies for random workloads in the one workload format.

The vocabulary and the rules that keep an op list valid are in
workloads/vocab.py; here Hypothesis makes the choices. Every choice is a
tier, then an item, both `sampled_from` lists ordered simple-first, so
shrinking (toward the first item) moves toward short, plain workloads.

Most ops are followed by a persistence op (fsync or fdatasync of an open
fd, or sync), the way ACE builds its workloads: bugs show up at persistence
points, and sequences such as "large write, fsync; unlink, sync; new large
write; fsync of another file" (freed blocks exposed as stale data) need
several of them in a row.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from workloads.format import workload_doc
from workloads.vocab import KIND_TIERS, PERSIST_KINDS, OpListBuilder, Tiers


def _picker(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    def pick(tiers: Tiers) -> Any:
        tier = tiers[draw(st.integers(0, len(tiers) - 1))] if len(tiers) > 1 else tiers[0]
        return draw(st.sampled_from(tier))
    return pick


@st.composite
def op_lists(draw: st.DrawFn, min_ops: int = 5, max_ops: int = 20) -> list[dict[str, Any]]:
    n = draw(st.integers(min_ops, max_ops))
    pick = _picker(draw)
    b = OpListBuilder()
    while len(b.ops) < n:
        b.add(pick(KIND_TIERS), pick)
        # Persist after most ops; "no persistence op" is listed first so shrinking drops them.
        persist = draw(st.sampled_from([None, *PERSIST_KINDS]))
        if persist and len(b.ops) < n:
            b.add(persist, pick)
    return b.finish()


def workloads(min_ops: int = 5, max_ops: int = 20) -> st.SearchStrategy[dict[str, Any]]:
    return op_lists(min_ops, max_ops).map(workload_doc)

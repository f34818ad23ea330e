"""A compact binary encoding of workloads: op records, shared by the
Hypothesis strategy (workloads/strategies.py) and AFL++'s inputs.

An input is a sequence of fixed-size op records (RECORD bytes each, at most
MAX_RECORDS):

    byte 0     the op kind's tier (workloads/vocab.py KIND_TIERS), byte 1 the kind in it
    byte 2     the persistence op after it: 0 none, then fsync, fdatasync, sync, fsync of a directory
               (after a namespace op, modulo 8: also 5-7, fsync of a directory or the file)
    bytes 3-4  the persistence op's choices (which fd)
    bytes 5-11 the op's choices, in the order the op makes them: a tier byte,
               then one item byte (two for tiers longer than 256)

Decoding is total: every byte string decodes to a valid op list (a trailing
partial record is ignored, missing bytes read as zero), so no run is wasted
on an invalid workload. Zero bytes are the simplest choices (the first tier
and item everywhere, no persistence op), so a shrinker that moves bytes
toward zero and drops records moves toward short, plain workloads; a
mutator moves whole records around (workloads/afl_mutator.py).

Standard library only (imported by the custom mutator under the system Python).
"""

from __future__ import annotations

import random
from typing import Any

from workloads.vocab import (KIND_TIERS, NAMESPACE_KINDS, PERSIST_AFTER_NAMESPACE, PERSIST_KINDS, OpListBuilder, Tiers,
                             kind_tiers)

RECORD = 12
MAX_RECORDS = 32
_PERSIST = slice(3, 5)
_OP = slice(5, RECORD)


class _BytesPicker:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def __call__(self, tiers: Tiers) -> Any:
        tier = tiers[self.byte() % len(tiers)] if len(tiers) > 1 else tiers[0]
        n = self.byte() if len(tier) <= 256 else self.byte() << 8 | self.byte()
        return tier[n % len(tier)]


def records(data: bytes) -> list[bytes]:
    n = min(len(data) // RECORD, MAX_RECORDS)
    return [data[i * RECORD:(i + 1) * RECORD] for i in range(n)]


def decode(data: bytes, reflink: bool = True, exchange: bool = False, atomic: bool = False) -> list[dict[str, Any]]:
    """The op list DATA encodes (possibly empty); REFLINK: the file system clones;
    EXCHANGE: it exchanges ranges (its kind tiers have exchange_range: vocab.kind_tiers);
    ATOMIC: it has f2fs atomic writes (f2fs_atomic batches)."""
    b = OpListBuilder(reflink, exchange, atomic)
    tiers = kind_tiers(exchange, atomic)
    for rec in records(data):
        tier = tiers[rec[0] % len(tiers)]
        kind = tier[rec[1] % len(tier)]
        b.add(kind, _BytesPicker(rec[_OP]))
        choices = PERSIST_AFTER_NAMESPACE if kind in NAMESPACE_KINDS else [None, *PERSIST_KINDS]
        persist = choices[rec[2] % len(choices)]
        if persist:
            b.add(persist, _BytesPicker(rec[_PERSIST]))
    return b.finish()


def random_record(rng: random.Random, kind: str | None = None, persist: str | None = None) -> bytes:
    """A random record; KIND and PERSIST (a persistence op, or none) fix those fields."""
    rec = bytearray(rng.randbytes(RECORD))
    if kind is not None:
        t = next(i for i, tier in enumerate(KIND_TIERS) if kind in tier)
        rec[0], rec[1] = t, KIND_TIERS[t].index(kind)
    rec[2] = PERSIST_KINDS.index(persist) + 1 if persist else (rec[2] if kind is None else 0)
    return bytes(rec)


def with_persist(rec: bytes, persist: str) -> bytes:
    """REC followed by the persistence op PERSIST."""
    return rec[:2] + bytes([PERSIST_KINDS.index(persist) + 1]) + rec[3:]

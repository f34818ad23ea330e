"""A compact binary encoding of workloads: AFL++'s inputs.

An input is a sequence of fixed-size op records (RECORD bytes each, at most
MAX_RECORDS). Byte 0 picks the op kind, the rest feed the op's choices in
order (workloads/vocab.py): a tier byte, then one item byte, two for tiers
longer than 256. Decoding is total: every byte string decodes to a valid op
list (a trailing partial record is ignored, missing bytes read as zero), so
AFL++'s own byte mutations never waste a run on an invalid workload, and a
record-level mutator (workloads/afl_mutator.py) moves whole ops around.

Standard library only (imported by the custom mutator under the system Python).
"""

from __future__ import annotations

import random
from typing import Any

from workloads.vocab import KINDS, OpListBuilder, Tiers

RECORD = 8
MAX_RECORDS = 32


class _RecordPicker:
    def __init__(self, record: bytes) -> None:
        self.data = record
        self.pos = 1  # byte 0 is the kind

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


def decode(data: bytes) -> list[dict[str, Any]]:
    """The op list DATA encodes (possibly empty)."""
    b = OpListBuilder()
    for rec in records(data):
        b.add(KINDS[rec[0] % len(KINDS)], _RecordPicker(rec))
    return b.finish()


def kind_byte(kind: str) -> int:
    return KINDS.index(kind)


def random_record(rng: random.Random, kind: str | None = None) -> bytes:
    head = kind_byte(kind) if kind else rng.randrange(len(KINDS))
    return bytes([head]) + rng.randbytes(RECORD - 1)

"""AFL++ custom mutator (AFL_PYTHON_MODULE=workloads.afl_mutator): mutates
inputs as op records (workloads/opcodec.py), never as loose bytes.

Each call applies a few record-level edits: insert a random op, insert a
persistence op (fsync/fdatasync/sync: where crash bugs show), delete,
duplicate or swap ops, re-roll one choice byte of an op, or splice in a run
of ops from another corpus entry. Loaded by afl-fuzz's embedded Python
(Debian's afl++ links the system python3.11), so standard library only.
AFL++ 4.04c requires init and deinit, describe must return bytes, and fuzz
must never return an empty buffer.
"""

from __future__ import annotations

import random

from workloads.opcodec import MAX_RECORDS, RECORD, random_record, records, with_persist
from workloads.vocab import PERSIST_KINDS

_rng = random.Random(0)
_last = "none"


def init(seed: int) -> None:
    _rng.seed(seed)


def deinit() -> None:
    pass


def _insert(recs: list[bytes], other: list[bytes]) -> str:
    recs.insert(_rng.randint(0, len(recs)), random_record(_rng))
    return "insert"


def _persist(recs: list[bytes], other: list[bytes]) -> str:
    i = _rng.randrange(len(recs))
    recs[i] = with_persist(recs[i], _rng.choice(PERSIST_KINDS))
    return "persist"


def _delete(recs: list[bytes], other: list[bytes]) -> str:
    if len(recs) > 1:
        del recs[_rng.randrange(len(recs))]
    return "delete"


def _duplicate(recs: list[bytes], other: list[bytes]) -> str:
    i = _rng.randrange(len(recs))
    j = min(len(recs), i + _rng.randint(1, 3))
    recs[j:j] = recs[i:j]
    return "duplicate"


def _swap(recs: list[bytes], other: list[bytes]) -> str:
    i, j = _rng.randrange(len(recs)), _rng.randrange(len(recs))
    recs[i], recs[j] = recs[j], recs[i]
    return "swap"


def _reroll(recs: list[bytes], other: list[bytes]) -> str:
    i = _rng.randrange(len(recs))
    rec = bytearray(recs[i])
    rec[_rng.randrange(RECORD)] = _rng.randrange(256)
    recs[i] = bytes(rec)
    return "reroll"


def _splice(recs: list[bytes], other: list[bytes]) -> str:
    if not other:
        return _insert(recs, other)
    i = _rng.randrange(len(other))
    part = other[i:i + _rng.randint(1, 4)]
    at = _rng.randint(0, len(recs))
    recs[at:at] = part
    return "splice"


_EDITS = [_insert, _persist, _delete, _duplicate, _swap, _reroll, _reroll, _splice]


def fuzz(buf: bytearray, add_buf: bytearray | None, max_size: int) -> bytearray:
    global _last
    recs = records(bytes(buf)) or [random_record(_rng)]
    other = records(bytes(add_buf)) if add_buf else []
    done = [edit(recs, other) for edit in _rng.choices(_EDITS, k=_rng.randint(1, 3))]
    _last = "+".join(done)
    cap = max(1, min(MAX_RECORDS, max_size // RECORD))
    return bytearray(b"".join(recs[:cap]))


def describe(max_description_length: int) -> bytes:
    return _last.encode()[:max_description_length]

"""Content hashes of crash states, each in O(its reordered pieces), to skip duplicates.

Many crash states hold the same bytes: a mark right after a flush, a
dropped write that a later one overwrote, the same block rewritten with the
same content. The hash of an image is the XOR over its sectors of a
position-bound hash of each sector's content (an all-zero sector counts 0),
so it changes sector by sector: the base image's hash is updated as the
epoch start moves forward, a prefix state's from its epoch's writes, and a
reordered state's only over the sectors of the writes it drops or tears.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from foundation.sparse import is_zero
from replay.crashstates import CrashState
from replay.logformat import Entry, LogReader

_ZERO = bytes(64 * 1024)


def sector_hashes(reader: LogReader, entry: Entry) -> list[int]:
    """Position-bound hash of each sector ENTRY leaves behind (0 for zeros and discards)."""
    if entry.is_discard:
        return [0] * entry.nr_sectors
    ss = reader.sectorsize
    raw = reader.read_data(entry)
    if is_zero(raw):  # mkfs zeroing a log: no per-sector work
        return [0] * entry.nr_sectors
    data = memoryview(raw)
    return [sector_hash(data[i * ss:(i + 1) * ss], entry.sector + i) for i in range(entry.nr_sectors)]


def sector_hash(chunk: bytes | memoryview, sector: int) -> int:
    """The position-bound hash of one sector's content (0 for zeros)."""
    if _ZERO.startswith(chunk):
        return 0
    salt = sector.to_bytes(16, "little")
    return int.from_bytes(hashlib.blake2b(chunk, digest_size=16, salt=salt).digest(), "little")


def rewrite_delta(old: bytes, new: bytes, first_sector: int, sectorsize: int) -> int:
    """What to XOR into an image's hash when its sectors from FIRST_SECTOR on, holding OLD,
    come to hold NEW (same length, whole sectors); sectors left as they were cost a compare."""
    delta = 0
    o, n = memoryview(old), memoryview(new)
    for i in range(0, len(o), sectorsize):
        a, b = o[i:i + sectorsize], n[i:i + sectorsize]
        if a != b:
            sector = first_sector + i // sectorsize
            delta ^= sector_hash(a, sector) ^ sector_hash(b, sector)
    return delta


class _Epoch:
    """Who writes each sector within one epoch, and the prefix state's hash delta."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.entries: list[int] = []
        self.writers: dict[int, list[tuple[int, int]]] = {}   # sector -> [(entry index, hash)] in log order
        self.delta = 0                                        # prefix hash XOR base hash


class StateHasher:
    """Hashes the states of one crash plan, given in plan order (epoch starts never go back)."""

    def __init__(self, reader: LogReader, entries: Sequence[Entry]) -> None:
        self.reader = reader
        self.entries = entries
        self._base: dict[int, int] = {}    # sector -> hash, for the image before the epoch start
        self._base_hash = 0
        self._base_end = 0
        self._epoch = _Epoch(0)
        self._cache: dict[int, list[int]] = {}

    def _hashes(self, entry: Entry) -> list[int]:
        h = self._cache.get(entry.index)
        if h is None:
            h = self._cache[entry.index] = sector_hashes(self.reader, entry)
        return h

    def _advance_base(self, end: int) -> None:
        for entry in self.entries[self._base_end:end]:
            if not (entry.is_write or entry.is_discard):
                continue
            hashes = self._cache.pop(entry.index, None) or sector_hashes(self.reader, entry)
            if not any(hashes):  # a discard or zeros: only the sectors the base holds change
                self._clear_base(entry.sector, entry.sector + entry.nr_sectors)
                continue
            for s, h in enumerate(hashes, entry.sector):
                old = self._base.pop(s, 0)
                self._base_hash ^= old ^ h
                if h:
                    self._base[s] = h
        self._base_end = end

    def _clear_base(self, lo: int, hi: int) -> None:
        """Sectors [LO, HI) become zeros in the base image (mkfs discards whole devices)."""
        if hi - lo > len(self._base):
            gone = [s for s in self._base if lo <= s < hi]
        else:
            gone = [s for s in range(lo, hi) if s in self._base]
        for s in gone:
            self._base_hash ^= self._base.pop(s)

    def _epoch_for(self, state: CrashState) -> _Epoch:
        ep = self._epoch
        # Within one epoch start, a later crash point's epoch extends an earlier one's.
        if ep.start != state.epoch_start or len(state.epoch) < len(ep.entries):
            if state.epoch_start < self._base_end:
                raise ValueError(f"state {state.id}: epoch start {state.epoch_start} is behind {self._base_end}")
            self._advance_base(state.epoch_start)
            ep = self._epoch = _Epoch(state.epoch_start)
            self._cache = {i: h for i, h in self._cache.items() if i >= state.epoch_start}
        for entry in state.epoch[len(ep.entries):]:
            for s, h in enumerate(self._hashes(entry), entry.sector):
                ws = ep.writers.setdefault(s, [])
                ep.delta ^= (ws[-1][1] if ws else self._base.get(s, 0)) ^ h
                ws.append((entry.index, h))
            ep.entries.append(entry.index)
        return ep

    def hash(self, state: CrashState) -> int:
        ep = self._epoch_for(state)
        value = self._base_hash ^ ep.delta
        changed = state.dropped | set(state.torn)
        if not changed:
            return value
        tear = state.tear
        # (by index, not a pass over the epoch: an epoch grows with the workload, its changes do not)
        sectors = {s for i in changed for e in (self.entries[i],) for s in range(e.sector, e.sector + e.nr_sectors)}
        for s in sectors:
            ws = ep.writers[s]
            final = self._base.get(s, 0)
            for index, h in reversed(ws):
                if index in state.dropped or (tear and index == tear.entry and not tear.start <= s < tear.stop):
                    continue
                final = h
                break
            value ^= ws[-1][1] ^ final
        return value

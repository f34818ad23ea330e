"""The coverage engine: an AFL-style corpus kept by the kernel's own coverage (vm backend).

Each worker keeps the workloads whose runs reached kernel code none of its
earlier runs had (fuzz/coverage.py: a function of the file system's modules
not seen before, or a new hit bucket of one, on the workload path or in the
recovery mounts of its crash states), and mutates them. A workload is op
records (workloads/opcodec.py: every byte string decodes to a valid
workload), mutated as AFL++'s custom mutator does (workloads/afl_mutator.py:
insert and replace ops, persistence points, delete, duplicate, swap,
splice in ops of another entry), plus two edits of its own: a new
directory (a mkdir record, which later records' names may land in) and a
namespace op put right after one that removed a name, with the same choice
bytes (so its name draws from the same place: often the removed name, now
for another kind of inode).

An entry's energy is its novelty score when it was kept (recovery-path
novelty weighs RECOVERY_WEIGHT times workload-path novelty), divided by how
often it has been picked. The first SEEDS workloads are random records, and
so is every RANDOM_SHARE-th one after, so a corpus that stops growing still
explores. Without kernel coverage (the fuse and dm backends: no guest to
count in) nothing is ever novel and it generates random workloads only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from checkers.fsrules import Semantics
from fuzz import engine_hypothesis
from fuzz.engine import FuzzEngine, register_engine
from fuzz.worker import Worker
from workloads import afl_mutator
from workloads.format import workload_doc
from workloads.opcodec import MAX_RECORDS, RECORD, decode, random_record, records
from workloads.vocab import kind_tiers

SEEDS = 6
RANDOM_SHARE = 8
CROSSOVER = 0.4  # share of mutations that join two entries (the rest: edits of one)
REMOVING = ("unlink", "rmdir", "rename")
CREATING = ("mkdir", "symlink", "link", "open")   # open creates a file (O_CREAT among its flag choices)


@dataclass
class Entry:
    data: bytes
    score: float
    picked: int = 0

    def energy(self) -> float:
        # log: an early entry with a hundred new functions must not starve the later ones that
        # each added a little (the steps toward deep coverage); picks wear it down.
        return (1 + math.log2(1 + self.score)) / (1 + self.picked)


class Corpus:
    def __init__(self, w: Worker) -> None:
        self.w = w
        self.rng = random.Random(hash((w.seed, w.number, "coverage")) & 0xFFFFFFFF)
        afl_mutator.init(self.rng.randrange(1 << 32))
        sem = Semantics(fs=w.cfg.fs, mkfs_opts=w.cfg.mkfs_opts)
        self.reflink, self.exchange, self.atomic = sem.reflink(), sem.exchange(), sem.f2fs_atomic()
        self.min_ops, self.max_ops = int(w.options.get("min_ops", 3)), int(w.options.get("max_ops", 8))
        # Joined entries grow: at most twice --max-ops records (a record is an op and maybe its
        # persistence op, plus the opens and closes the decoder adds): a run's cost grows with it.
        self.cap = min(MAX_RECORDS, 2 * self.max_ops)
        self.entries: list[Entry] = []
        self.done = w.campaign.totals().workloads  # names stay unique in a resumed campaign
        self.n = 0

    def kind(self, rec: bytes) -> str:
        tiers = kind_tiers(self.exchange, self.atomic)
        tier = tiers[rec[0] % len(tiers)]
        return str(tier[rec[1] % len(tier)])

    def random_input(self) -> bytes:
        return b"".join(random_record(self.rng) for _ in range(self.rng.randint(self.min_ops, self.max_ops)))

    def mutate(self, parent: bytes, other: bytes) -> bytes:
        r = self.rng.random()
        recs = records(parent)
        if r < CROSSOVER:
            self._crossover(recs, records(other))
        elif r < CROSSOVER + 0.2:
            self.rng.choice((self._new_directory, self._reuse_name, self._fresh_ops))(recs)
        else:
            return bytes(afl_mutator.fuzz(bytearray(parent), bytearray(other), self.cap * RECORD))
        return b"".join(recs[:self.cap])

    def _crossover(self, recs: list[bytes], other: list[bytes]) -> None:
        """A run of OTHER's records put into RECS: two entries' novel ops in one workload
        (coverage that needs both: a conjunction neither reaches alone)."""
        i = self.rng.randrange(len(other))
        part = other[i:i + self.rng.randint(1, max(1, len(other) - i))]
        at = self.rng.randint(0, len(recs))
        recs[at:at] = part

    def _fresh_ops(self, recs: list[bytes]) -> None:
        for _ in range(self.rng.randint(1, 3)):
            recs.insert(self.rng.randint(0, len(recs)), random_record(self.rng))

    def _new_directory(self, recs: list[bytes]) -> None:
        recs.insert(self.rng.randint(0, len(recs)), random_record(self.rng, kind="mkdir"))

    def _reuse_name(self, recs: list[bytes]) -> None:
        removed = [i for i, r in enumerate(recs) if self.kind(r) in REMOVING]
        if not removed:
            recs.insert(self.rng.randint(0, len(recs)), random_record(self.rng, kind=self.rng.choice(REMOVING)))
            return
        i = self.rng.choice(removed)
        new = random_record(self.rng, kind=self.rng.choice(CREATING))
        recs.insert(i + 1, new[:3] + recs[i][3:])  # the removing op's choice bytes: the same names

    def pick(self) -> tuple[bytes, bytes]:
        weights = [e.energy() for e in self.entries]
        parent = self.rng.choices(self.entries, weights=weights)[0]
        parent.picked += 1
        return parent.data, self.rng.choice(self.entries).data

    def next(self) -> None:
        self.n += 1
        seeding = len(self.entries) == 0 or self.n <= SEEDS or self.n % RANDOM_SHARE == 0
        data = self.random_input() if seeding else self.mutate(*self.pick())
        ops = decode(data, self.reflink, self.exchange, self.atomic)
        if not ops:
            return
        doc = workload_doc(ops, name=f"cov-{self.w.name}-{self.done}-{self.n}")
        trial = self.w.run(doc, engine="coverage", mutated=not seeding)
        if trial is None:
            return
        if trial.novelty:
            self.entries.append(Entry(data, trial.novelty.score()))
        self.w.triage(trial)


def run(w: Worker) -> None:
    corpus = Corpus(w)
    while not w.should_stop():
        corpus.next()


class CoverageEngine(FuzzEngine):
    name = "coverage"
    summary = ("an AFL-style corpus kept by the kernel's own coverage of the workload and its recovery "
               "mounts (vm backend; docs/coverage.md)")
    groups = (engine_hypothesis.GENERATION,)  # --min-ops/--max-ops: the random workloads' sizes

    def run(self, w: Worker) -> None:
        run(w)

    def uses_kernel_coverage(self, options: Mapping[str, Any]) -> bool:
        return True


register_engine(CoverageEngine())

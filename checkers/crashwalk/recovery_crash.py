"""A second power cut, during recovery: crash states of the recovery mount itself.

For one crash state S (the first crash) the backend records the recovery
mount of S on its recorded device: the recovery log starts from S instead
of a zeroed device and holds every write, flush and discard the recovering
kernel issued (journal/log replay, orphan cleanup, super block updates)
until the unmount. Its crash states are made exactly like the main walk's
(replay/crashstates.py: every write, flush, FUA and mark is a crash point,
with the run's reorder modes), on top of S. Each is recovered again and checked
against the guarantees of the ORIGINAL crash point: the content oracle
is asked about S's crash point, fsck must pass, the mount must succeed.

Ids: `ORIGINAL/rN[-...]` is the state `pN[-...]` of the recovery log of
crash state ORIGINAL, e.g. `p57/r12` or `p57-d33/r12-d10`. The recovery
log of a finding is kept in OUT/recovery-logs/ORIGINAL.MODE.log, which is
what rebuilds it (`powercut crash-image --state p57/r12`, `powercut recheck`).

Which states: all of the recovery log's unique states that differ from S,
or a sample of at most BUDGET of them seeded by the original state's id
(so a rerun checks the same ones). Dedup is by content hash relative to S
(a write of zeros counts like no write: at worst a state goes unchecked).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from foundation import ownership
from foundation.errors import UsageError
from foundation.sparse import sparse_copy
from replay.crashstates import (CrashPlan, CrashState, ReorderSpec, join_recovery_id as join_id,
                               plan_for_recovery_log as recovery_plan, split_recovery_id as split_id,
                               RECOVERY_LOG_DIR as LOG_DIR, recovery_log_name as log_name)
from replay.logformat import LogReader
from replay.statehash import StateHasher
from replay.stateimage import StateImage

# Records the recovery mount of a crash image: (image of S, mount options,
# log path to write, tag unique among concurrent recordings) -> whether the
# kernel mounted it (no mount, no recovery to crash in).
RecordRecovery = Callable[[str, str, str, str], bool]


@dataclass(frozen=True)
class RecoveryCrashSpec:
    """What `--recovery-crash` asked for."""

    budget: int = 8          # at most this many recovery crash states per crash state and mode
    rate: float = 1.0        # fraction of crash states whose recovery is recorded (seeded by state id)

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise UsageError(f"--recovery-crash-states {self.budget}: must be at least 1")
        if not 0 < self.rate <= 1:
            raise UsageError(f"--recovery-crash-rate {self.rate}: must be in (0, 1]")

    def chosen(self, state_id: str, mode: str) -> bool:
        return self.rate >= 1 or random.Random(f"{state_id}:{mode}:rate").random() < self.rate


def sample_states(reader: LogReader, plan: CrashPlan, budget: int, seed: str) -> list[CrashState]:
    """Unique states of PLAN that differ from the base, at most BUDGET (seeded sample), in plan order."""
    hasher = StateHasher(reader, plan.entries)
    seen: set[int] = {0}   # 0: nothing changed, the state is S itself (checked by the main walk)
    unique = []
    for cs in plan.states():
        h = hasher.hash(cs)
        if h not in seen:
            seen.add(h)
            unique.append(cs)
    if len(unique) > budget:
        keep = sorted(random.Random(seed).sample(range(len(unique)), budget))
        unique = [unique[i] for i in keep]
    return unique


class RecoveryImages:
    """Images of the recovery crash states of one recovery log, built by deltas on a copy of S."""

    def __init__(self, reader: LogReader, base_image: str, work_image: str) -> None:
        self.path = work_image
        self.fd = ownership.create_file(work_image)
        try:
            sparse_copy(base_image, self.fd)
            self.image = StateImage(reader, self.fd)
        except BaseException:
            os.close(self.fd)
            raise

    def load(self, cs: CrashState) -> None:
        self.image.load(cs)

    def close(self) -> None:
        self.image.close()
        os.close(self.fd)

    def __enter__(self) -> RecoveryImages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def states_of(reader: LogReader, reorder: ReorderSpec, budget: int, original_id: str,
              mode: str) -> Iterator[CrashState]:
    plan = recovery_plan(reader, reorder)
    yield from sample_states(reader, plan, budget, f"{original_id}:{mode}")

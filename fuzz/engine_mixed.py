"""The mixed engine, the default of `powercut fuzz --backend vm`: a guest kernel runs
10 to 30 workloads a minute, so a campaign of minutes must spend them where bugs are.

Half the workers (the even ones) walk the ordered ACE seq-2 space of the
exhaustive engine (workloads/ace.py: a namespace op on something just
persisted, then an fsync of it or its directory, each shape once before any
twice), splitting its indices between them; the other half run Hypothesis,
whose vocabulary weighs namespace ops followed by an fsync of what they
touched (workloads/vocab.py), for the shapes longer than two core ops and the
data ops the ordered space puts later; a worker whose share of the space is
done generates too. With one worker it alternates: STRETCH exhaustive
indices, then a Hypothesis round of STRETCH workloads. `--seq` (default 2 here)
and `--seq-cap` choose the space, as for the exhaustive engine.

In a joined campaign (--coordinator) the exhaustive half claims positions
from the coordinator instead of splitting indices by worker, and Hypothesis
keeps its example database in the coordinator's Redis (engine_hypothesis):
the same workers explore and generate as above. A worker finding every
position handed out runs a Hypothesis round instead of waiting, then claims
again, so the positions of a machine that died are taken over by a live
one's next claim; once every position is done it only generates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fuzz import engine_exhaustive, engine_hypothesis
from fuzz.coordinator import ALL_DONE, WAIT
from fuzz.engine import FuzzEngine, register_engine
from fuzz.worker import Worker

STRETCH = 5


def run(w: Worker) -> None:
    if w.jobs >= 2 and w.number % 2:
        engine_hypothesis.run(w)
        return
    if w.coord is not None:
        return run_joined(w)
    explorers = (w.jobs + 1) // 2
    todo = engine_exhaustive.indices(w, w.number // 2, explorers)
    if w.jobs >= 2:
        engine_exhaustive.run_indices(w, todo)
        engine_hypothesis.run(w)  # the space is done before the time is: generate on
        return
    rounds = engine_hypothesis.Rounds(w, STRETCH)
    while not w.should_stop():
        if todo:
            engine_exhaustive.run_indices(w, todo[:STRETCH])
            todo = todo[STRETCH:]
        rounds.next()


def run_joined(w: Worker) -> None:
    """An explorer of a joined campaign (the Hypothesis half is as in one alone)."""
    stretch = STRETCH if w.jobs == 1 else None  # one worker alternates; an explorer claims until none is free
    rounds = engine_hypothesis.Rounds(w, STRETCH) if stretch else engine_hypothesis.Rounds(w)
    order, all_done = engine_exhaustive.space_order(w), False
    while not w.should_stop():
        ran = 0
        while not all_done and not w.should_stop() and (stretch is None or ran < stretch):
            how = engine_exhaustive.claim_and_run(w, order)
            all_done = how == ALL_DONE
            if how in (WAIT, ALL_DONE):
                break
            ran += 1
        if not w.should_stop():
            rounds.next()


class MixedEngine(FuzzEngine):
    name = "mixed"
    summary = ("the ordered exhaustive seq-2 space and hypothesis, half the workers each "
               "(the default with a backend that keeps a guest: vm)")
    groups = (engine_exhaustive.SPACE, engine_hypothesis.GENERATION)
    defaults = {"seq": 2}
    walks_space = True
    counts_space_done = True
    space_note = " ordered seq-{seq}"
    default_on = "guest"

    def run(self, w: Worker) -> None:
        run(w)

    def uses_kernel_coverage(self, options: Mapping[str, Any]) -> bool:
        return bool(options.get("coverage_target"))


register_engine(MixedEngine())

"""The program AFL++ runs once per input (AFL_NO_FORKSRV=1):

    python -m fuzz.afl_target --campaign DIR --worker NAME INPUT

It decodes INPUT (op records, workloads/opcodec.py) into a workload, runs it
through the run pipeline in-process, journals it, writes its features into
AFL's shared-memory map (fuzz/feedback.py) and abort()s if the run showed a
finding with a signature not saved yet, leaving the input in a pending
directory for the campaign's AFL worker, which shrinks it and saves the
finding (AFL++ keeps it in crashes/ too, if its coverage is new). Exit 0
otherwise. AFL++ stops a run with SIGTERM (AFL_KILL_SIGNAL), which the
pipeline turns into a clean teardown; so does the target's own time limit,
TIME_LIMIT_S, below AFL++'s -t.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys

from foundation import ownership
from foundation.errors import PowercutError, Terminated
from harness.pipeline.config import RunConfig
from fuzz.feedback import Extents, SharedMap, features
from fuzz.layout import CampaignDir
from fuzz.store import FindingStore
from fuzz.trial import run_doc
from workloads.format import workload_doc
from workloads.opcodec import decode

PIDFILE = "target.pid"
TIME_LIMIT_S = 240


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fuzz.afl_target")
    p.add_argument("--campaign", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("input")
    args = p.parse_args(argv)
    campaign = CampaignDir(args.campaign)
    signal.signal(signal.SIGALRM, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))
    signal.alarm(TIME_LIMIT_S)
    shm = SharedMap()
    shm.touch()
    with open(args.input, "rb") as f:
        data = f.read()
    ops = decode(data)
    if not ops:
        return 0
    doc = workload_doc(ops, name="afl-" + hashlib.sha1(data).hexdigest()[:12])
    cfg = RunConfig.parse(campaign.config()["run"])
    work = campaign.work_dir(args.worker)
    pidfile = os.path.join(work, PIDFILE)  # the AFL worker waits for the last target to finish teardown
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    extents = Extents()
    try:
        trial = run_doc(doc, cfg, work, extents)
    except Terminated:
        return 143  # stopped by AFL++ or its own time limit, torn down: not a result
    except PowercutError as e:
        campaign.append(args.worker, {"name": doc["name"], "error": str(e)})
        return 0
    finally:
        os.remove(pidfile)
    campaign.append(args.worker, trial.journal_entry(engine="afl"))
    shm.add(features(trial, extents))
    known = FindingStore(campaign.sub("findings")).known()
    if any(s.key() not in known for s, _ in trial.signatures()):
        # AFL++ keeps crashing inputs only when their coverage is new, and none found while
        # it calibrates the seeds: hand the input to the campaign worker directly too.
        pending = ownership.make_dir(pending_dir(campaign, args.worker))
        path = os.path.join(pending, hashlib.sha1(data).hexdigest())
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        os.abort()
    return 0


def pending_dir(campaign: CampaignDir, worker: str) -> str:
    """Inputs with new findings, waiting for the campaign worker to shrink and save them."""
    return campaign.sub("pending", worker)


if __name__ == "__main__":
    sys.exit(main())

"""Deduplicated findings of a campaign: CAMPAIGN/findings/NNN-KIND/.

    finding.json        kind, signature, detail, crash point and state id, expected vs found, evidence,
                        the set-up (fs, mkfs and mount options), shrinking stats, the original workload
    workload.json       the shrunk workload (powercut-workload/1)
    run/                the shrunk workload's run: report.json, recording.log, records, plan
    crash.img.tar.gz    the crash image of that state, unrecovered (GNU tar --sparse, gzip: holes stay holes)
    fsck.txt            fsck's output on that image after the kernel's recovery mount
    reproduce.sh        re-checks exactly that crash state from run/recording.log and prints the finding
                        (`--rerun`: records the shrunk workload afresh instead)

One signature (fuzz/trial.py), one directory. Workers of one campaign (and
the AFL++ target processes) share the store: a signature is claimed under a
lock before it is shrunk, so two workers never shrink the same bug.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, unquote

from foundation.jsondoc import write_json
from checkers.findings import Finding
from checkers.crashwalk.recovery import first_problem, recover_and_check
from checkers.crashwalk.recovery_modes import mode_opts, recovery_name
from foundation import ownership, paths
from foundation.errors import EnvError
from foundation.filesystems import get_fs, host_kernel_lacks
from harness.pipeline.config import RunConfig
from harness.pipeline.run import terminate_as_exception
from foundation.loopdev import recorded_loop
from foundation.runstate import RunState
from replay.crashpoints import DEFAULT as DEFAULT_POINTS
from replay.crashstates import RECOVERY_LOG_DIR, recovery_log_name, split_recovery_id
from replay.logformat import LogReader
from replay.stateimage import build_crash_image
from fuzz.trial import RUN_DIR, Signature, Trial, op_count

FINDING = "finding.json"
CLAIMS = ".claims"


class FindingStore:
    def __init__(self, path: str) -> None:
        self.path = path

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(os.path.join(self.path, ".lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def dirs(self) -> list[str]:
        return sorted(d for d in os.listdir(self.path) if d[:3].isdigit())

    def saved(self) -> list[dict[str, Any]]:
        out = []
        for d in self.dirs():
            try:
                with open(os.path.join(self.path, d, FINDING)) as f:
                    out.append({"dir": d, **json.load(f)})
            except (OSError, json.JSONDecodeError):
                continue  # being written, or cut by a kill
        return out

    def known(self) -> set[str]:
        """Signature keys saved or claimed (being shrunk) so far."""
        keys = {k for s in self.saved() for k in s["signatures"]}
        claims = os.path.join(self.path, CLAIMS)
        if os.path.isdir(claims):
            keys |= {Signature.parse(unquote(n)).key() for n in os.listdir(claims)}
        return keys

    def documented_saved(self) -> set[str]:
        """Documented bugs (checkers/documented_bugs.py) a finding of this campaign was saved as."""
        return {s["shrink"]["known_bug"] for s in self.saved() if s.get("shrink", {}).get("known_bug")}

    def next_number(self) -> int:
        """The number of the next finding directory (called under the lock)."""
        return len(self.dirs()) + 1

    def claim(self, sig: Signature) -> bool:
        """True if SIG was new and is now this caller's to shrink and save."""
        with self._locked():
            if sig.key() in self.known():
                return False
            os.makedirs(os.path.join(self.path, CLAIMS), exist_ok=True)
            open(self._claim_path(sig), "w").close()
            return True

    def _claim_path(self, sig: Signature) -> str:
        # One file name per signature: a kernel finding's rule names a source file ("fs/ext4/...").
        return os.path.join(self.path, CLAIMS, quote(sig.key(), safe=""))

    def clear_claims(self) -> None:
        """Claims of a campaign that was killed while shrinking: those bugs are free again."""
        shutil.rmtree(os.path.join(self.path, CLAIMS), ignore_errors=True)

    def save(self, trial: Trial, sig: Signature, finding: Finding, cfg: RunConfig, *,
             original: dict[str, Any], also: list[Signature], shrink: dict[str, Any],
             triage: dict[str, str] | None = None) -> str:
        """Move TRIAL's run into a new finding directory and complete it; returns the directory
        ("" from a joined campaign's store when another machine saved it first)."""
        with self._locked():
            d = ownership.make_dir(os.path.join(self.path, f"{self.next_number():03d}-{finding.kind}"))
            os.replace(trial.out_dir, os.path.join(d, RUN_DIR))
            info = finding_json(trial, sig, finding, cfg, original=original, also=also, shrink=shrink)
            if triage:  # checkers/documented_bugs.py: a documented bug's name, or new
                info["triage"] = triage
            write_json(os.path.join(d, "workload.json"), trial.doc, indent=1)
            write_crash_state(d, cfg, finding.state_id, finding.recovery)
            write_reproduce(d, cfg, finding, info)
            write_json(os.path.join(d, FINDING), info)  # last: its presence means complete
            if os.path.exists(self._claim_path(sig)):
                os.remove(self._claim_path(sig))
        return d


def finding_json(trial: Trial, sig: Signature, finding: Finding, cfg: RunConfig, *, original: dict[str, Any],
                 also: list[Signature], shrink: dict[str, Any]) -> dict[str, Any]:
    ev = finding.evidence
    expected, found = ev.get("expected"), ev.get("found")
    if finding.kind == "fsck":
        expected, found = "fsck clean after recovery", first_problem(ev.get("fsck_output", ""))
    elif finding.kind == "mount":
        expected, found = "the recovery mount succeeds", ev.get("mount_error")
    return {
        "kind": finding.kind, "signature": vars(sig), "signatures": sorted({sig.key(), *(s.key() for s in also)}),
        "detail": finding.detail, "crash_point": finding.crash_point, "crash_mark": finding.crash_mark,
        "state_id": finding.state_id,
        "expected": expected, "found": found, "evidence": ev, "config": cfg.to_json(),
        "ops": op_count(trial.doc), "shrink": shrink, "original_workload": original,
    }


def write_crash_state(d: str, cfg: RunConfig, state_id: str | None, recovery: str | None = None) -> None:
    """crash.img.tar.gz and fsck.txt of the finding's crash state (none for latency/semantics),
    recovered the way the finding's was (RECOVERY: rw or ro; a state inside a recovery
    is rebuilt from the recovery log the run kept)."""
    if state_id is None:
        return
    run = os.path.join(d, RUN_DIR)
    with open(os.path.join(run, "report.json")) as f:
        report = json.load(f)
    fs = get_fs(cfg.fs)
    state = RunState.create(f"save finding {d}")
    try:
        with terminate_as_exception():
            img = os.path.join(state.scratch, "crash.img")
            with LogReader(os.path.join(run, report["log"])) as reader:
                original, inner = split_recovery_id(state_id)
                rec_log = (os.path.join(run, RECOVERY_LOG_DIR, recovery_log_name(original, recovery or "rw"))
                           if inner is not None else None)
                build_crash_image(reader, state_id, report["device_bytes"], img, rec_log)
            p = subprocess.run(["tar", "--sparse", "-czf", os.path.join(d, "crash.img.tar.gz"),
                                "-C", state.scratch, "crash.img"], capture_output=True, text=True)
            if p.returncode != 0:
                raise EnvError(f"tar of the crash image failed: {p.stderr.strip()}")
            lacks = host_kernel_lacks(fs.name)
            if not lacks:
                with recorded_loop(state, img) as loop:
                    v = recover_and_check(loop, fs, mode_opts(report["mount_opts"], recovery or "rw"),
                                          state.subdir("mnt"))
    finally:
        state.teardown_or_warn()
    with open(os.path.join(d, "fsck.txt"), "w") as f:
        if lacks:  # (a vm campaign on f2fs, say): the guest's own verdict is in finding.json
            f.write(f"not recovered on this host ({lacks}): finding.json's evidence has the fsck output "
                    "of the recovery by the kernel under test\n")
            return
        if not v.mount_ok:
            f.write(f"recovery mount failed: {v.mount_error}\n")
            return
        f.write(f"$ {' '.join(fs.fsck_cmd('crash.img'))}   # after the kernel's recovery mount\n")
        f.write(f"{v.fsck_output}\nexit code: {v.fsck_code}\n")


def write_reproduce(d: str, cfg: RunConfig, finding: Finding, info: dict[str, Any]) -> None:
    python = f"{shlex.quote(sys.executable)} -m cli.main"
    rerun = ["run", '"$here/workload.json"', "--fs", cfg.fs, "--mkfs-opts", shlex.quote(cfg.mkfs_opts),
             "--mount-opts", shlex.quote(cfg.mount_opts or ""),
             "--crash-points", shlex.quote(str(cfg.crash_points or DEFAULT_POINTS)),
             "--reorder", shlex.quote(str(cfg.reorder)), "--out", '"$(mktemp -d)"',
             "--recovery", recovery_name(cfg.recovery)]
    rerun += ["--known-damage-findings"] if cfg.known_damage_findings else []
    if cfg.recovery_crash:
        rerun += ["--recovery-crash", "--recovery-crash-states", str(cfg.recovery_crash.budget)]
    rerun += [shlex.quote(a) for a in cfg.backend.engine.command_args(cfg.backend.options)]
    how = f" --recovery {finding.recovery}" if finding.recovery else ""
    check = (f'exec $POWERCUT recheck "$here/{RUN_DIR}" --state {shlex.quote(finding.state_id)}{how}'
             if finding.state_id is not None else f"exec $POWERCUT {' '.join(rerun)}")
    text = f"""#!/bin/sh
# {info['kind']} finding, signature {info['signature']['kind']}|{info['signature']['op']}|{info['signature']['rule']}, crash state {info['state_id']}:
#   {finding.detail.splitlines()[0][:200]}
# Rebuilds that crash state from {RUN_DIR}/recording.log, lets the kernel recover it, runs fsck and
# the content oracle, and prints the finding (exit 1). `./reproduce.sh --rerun` records the shrunk
# workload afresh instead: a new log, so other crash states, but usually the same finding.
# The image alone: powercut crash-image --log {RUN_DIR}/recording.log --state ID --size BYTES --out crash.img
set -e
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH={shlex.quote(paths.ROOT)}${{PYTHONPATH:+:$PYTHONPATH}}
POWERCUT=${{POWERCUT:-{shlex.quote(python)}}}
if [ "$1" = "--rerun" ]; then
    exec $POWERCUT {' '.join(rerun)}
fi
{check}
"""
    path = os.path.join(d, "reproduce.sh")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)

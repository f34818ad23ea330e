"""The finding store of a joined campaign: the machine's own findings/ directory,
with signatures claimed and findings numbered and recorded in Redis.

A signature is claimed locally (the machine's workers) and then in Redis
(the other machines): the one machine that holds both shrinks it, the
others skip it. A machine that dies while shrinking loses its claim with
its heartbeat, so the signature is free again for the next machine that
meets it. Each saved finding's directory goes into Redis once, as tar.gz
(up to FILE_LIMIT: bigger ones are recorded without their files, and say
on which machine and where they are), so `powercut campaign report` can
lay out every machine's findings in one place.
"""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
from typing import Any

from checkers.findings import Finding
from harness.pipeline.config import RunConfig
from fuzz.coordinator import FILE_LIMIT, Coordinator
from fuzz.layout import remove_owned
from fuzz.store import FINDING, FindingStore
from fuzz.trial import Signature, Trial


class SharedFindingStore(FindingStore):
    def __init__(self, path: str, coord: Coordinator) -> None:
        super().__init__(path)
        self.coord = coord

    def known(self) -> set[str]:
        return super().known() | self.coord.known_signatures()

    def claim(self, sig: Signature) -> bool:
        if not super().claim(sig):
            return False
        if self.coord.claim_signature(sig.key()):
            return True
        os.remove(self._claim_path(sig))  # another machine has it
        return False

    def next_number(self) -> int:
        return self.coord.next_finding_number()

    def save(self, trial: Trial, sig: Signature, finding: Finding, cfg: RunConfig, *,
             original: dict[str, Any], also: list[Signature], shrink: dict[str, Any],
             triage: dict[str, str] | None = None) -> str:
        d = super().save(trial, sig, finding, cfg, original=original, also=also, shrink=shrink, triage=triage)
        if not upload(self.coord, d):
            # Every signature it shows was saved by another machine meanwhile (this shrink ended on
            # one that machine was shrinking): theirs is the campaign's; a copy here would be a second.
            remove_owned(d)
            return ""
        return d

    def upload_missing(self) -> int:
        """Record the findings this machine saved while Redis was out of reach; how many."""
        recorded = {f["dir"] for f in self.coord.findings().values() if f.get("machine") == self.coord.machine}
        known = self.coord.known_signatures()
        n = 0
        for s in self.saved():
            if s["dir"] not in recorded and not set(s["signatures"]) <= known:
                n += upload(self.coord, os.path.join(self.path, s["dir"]))
        return n


def upload(coord: Coordinator, d: str) -> bool:
    """Record finding directory D (NNN-KIND) in Redis: its finding.json and, within the size
    limit, its files. False if every signature it has was saved by another machine first."""
    with open(os.path.join(d, FINDING)) as f:
        info = json.load(f)
    name = os.path.basename(d)
    tarball = pack(d)
    where = "redis" if tarball is not None else f"{socket.gethostname()}:{os.path.abspath(d)} (over the size limit)"
    doc = {**info, "dir": name, "machine": coord.machine, "files": where}
    return coord.save_finding(int(name.split("-", 1)[0]), doc, list(info["signatures"]), tarball)


def pack(d: str) -> bytes | None:
    """Directory D as tar.gz bytes; None if its files add up to more than FILE_LIMIT."""
    size = sum(os.path.getsize(os.path.join(root, n)) for root, _, names in os.walk(d) for n in names)
    if size > FILE_LIMIT:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(d, arcname=os.path.basename(d))
    return buf.getvalue()

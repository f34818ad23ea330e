"""The coordinator's Redis scripts against a real redis-server (on loopback, a port of its own):
leases, take-overs, completing once, giving up, signature claims, options checks."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import redis_server
from foundation.errors import UsageError
from fuzz.coordinator import ALL_DONE, NEW, TAKEN_OVER, WAIT, Coordinator

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (make deps)")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path, "--save", "", "--appendonly", "no") as u:
        yield u


CONFIG = {"run": {"fs": "ext4", "mount_opts": ""}, "engine": "exhaustive", "options": {"seq": 1}}


def joined(url: str, name: str = "t") -> Coordinator:
    c = Coordinator(url, name)
    c.join(CONFIG, jobs=1)
    return c


def test_positions_are_leased_once_and_a_dead_machines_lease_is_taken_over(url: str) -> None:
    a, b = joined(url), joined(url)
    first, second = a.claim(3), b.claim(3)
    assert (first.how, second.how) == (NEW, NEW) and first.position != second.position
    third = a.claim(3)
    assert third.how == NEW and {first.position, second.position, third.position} == {0, 1, 2}
    assert b.claim(3).how == WAIT  # all handed out, all leased by live machines
    a.r.delete(a.key("alive", a.machine))  # a's heartbeat ran out
    taken = {b.claim(3).position, b.claim(3).position}
    assert taken == {first.position, third.position}
    for pos in (0, 1, 2):
        assert b.complete(pos, {"index": pos, "states": 1})
    assert b.claim(3).how == ALL_DONE
    # a comes back and finishes its old position: recorded once, counted as a duplicate run
    assert not a.complete(first.position, {"index": first.position, "states": 1})
    snap = b.snapshot()
    assert (snap["done"], snap["leases"], snap["duplicates"]) == (3, 0, 1)


def test_a_position_the_harness_fails_on_is_retried_then_given_up(url: str) -> None:
    a = joined(url)
    pos = a.claim(1).position
    assert a.release(pos, "loop device busy", max_tries=2)
    again = a.claim(1)
    assert (again.how, again.position) == (TAKEN_OVER, pos)
    assert not a.release(pos, "loop device busy", max_tries=2)
    assert a.claim(1).how == ALL_DONE and a.snapshot()["failed"] == 1


def test_a_signature_is_shrunk_by_one_machine_and_free_again_when_it_dies(url: str) -> None:
    a, b = joined(url), joined(url)
    assert a.claim_signature("fsck|-|x") and not b.claim_signature("fsck|-|x")
    assert "fsck|-|x" in b.known_signatures()
    a.r.delete(a.key("alive", a.machine))
    assert "fsck|-|x" not in b.known_signatures() and b.claim_signature("fsck|-|x")
    n = b.next_finding_number()
    assert b.save_finding(n, {"dir": f"{n:03d}-fsck", "signatures": ["fsck|-|x"]}, ["fsck|-|x"], b"tar")
    assert not a.claim_signature("fsck|-|x")
    # the same signature saved again (by a machine taken for dead) is not recorded
    assert not a.save_finding(a.next_finding_number(), {"signatures": ["fsck|-|x"]}, ["fsck|-|x"], b"tar2")
    assert list(b.findings()) == [n] and b.finding_files(n) == b"tar"


def test_other_options_are_refused_naming_them(url: str) -> None:
    joined(url)
    other = Coordinator(url, "t")
    with pytest.raises(UsageError, match=r"run\.mount_opts"):
        other.join({**CONFIG, "run": {"fs": "ext4", "mount_opts": "nodelalloc"}}, jobs=1)

"""exchange_range: the generated vocabulary (xfs made with -i exchange=1 only) and the mkfs option.

Decoding the same random records with and without the feature: with it, about one
workload in three of six records has an exchange (the data ops' tier), some of
them TO_EOF at two different offsets (the shape of the exchange-range-to-eof
size bug, docs/time-to-find.md) and some with DSYNC; without it, none, and the
other file systems' tiers are unchanged (the same records decode to the same
ops as before wherever no exchange was drawn)."""

from __future__ import annotations

import random

from checkers.fsrules import Semantics
from workloads.opcodec import RECORD, decode
from workloads.vocab import EXCHANGE_KIND_TIERS, FILES, KIND_TIERS, OpListBuilder


def _exchanges(ops: list[dict]) -> list[dict]:
    return [o for o in ops if o["op"] == "exchange_range"]


def test_exchanges_are_drawn_only_where_the_file_system_has_them() -> None:
    rng = random.Random(7)
    inputs = [rng.randbytes(RECORD * 6) for _ in range(600)]
    with_feature = [_exchanges(decode(d, True, True)) for d in inputs]
    assert 100 < sum(map(bool, with_feature)) < 400
    every = [o for ex in with_feature for o in ex]
    assert any("TO_EOF" in o["flags"] and o["from_offset"] != o["offset"] for o in every)
    assert any("DSYNC" in o["flags"] for o in every) and any("TO_EOF" not in o["flags"] for o in every)
    assert all(o["from_offset"] % 4096 == 0 and o["offset"] % 4096 == 0 for o in every)
    assert not any(_exchanges(decode(d, True, False)) for d in inputs)
    assert EXCHANGE_KIND_TIERS[1:] == KIND_TIERS[1:] and EXCHANGE_KIND_TIERS[0][:-1] == KIND_TIERS[0]


def test_only_xfs_made_with_exchange_has_the_feature() -> None:
    assert Semantics(fs="xfs", mkfs_opts="-i exchange=1").exchange()
    assert Semantics(fs="xfs", mkfs_opts="-i sparse=1,exchange=1").exchange()
    assert not Semantics(fs="xfs").exchange() and not Semantics(fs="btrfs", mkfs_opts="-i exchange=1").exchange()


def test_the_mkfs_option_is_taken_out_for_an_older_mkfs() -> None:
    from foundation import xfs_exchange
    assert xfs_exchange.strip("-i exchange=1") == ""
    assert xfs_exchange.strip("-i sparse=1,exchange=1 -m reflink=0") == "-i sparse=1 -m reflink=0"
    assert xfs_exchange.wanted("-m crc=1 -i exchange=1") and not xfs_exchange.wanted("-i exchange=0")


def test_an_exchange_after_every_name_was_opened_and_closed_still_has_two_files() -> None:
    """Names of fds closed earlier do not use up the names its temporary file may take."""
    b = OpListBuilder(True, True)
    first = lambda tiers: tiers[0][0]  # noqa: E731: the simplest choice everywhere
    for path in FILES:
        b.ops.append({"op": "close", "fd": b.open(path, ["O_CREAT", "O_RDWR"])})
        b.fds.clear()
    b.add("exchange_range", first)
    (x,) = _exchanges(b.finish())
    assert x["fd"] != x["from_fd"]

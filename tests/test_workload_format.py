"""Workload format: schema + semantic checks, plan compilation, data pattern, marks."""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import UsageError
from workloads import pattern
from workloads.format import FORMAT, OP_KINDS, Device, Generator, Workload, load_workload, parse_workload, walk
from workloads.marks import MARK_MAX, Mark, format_mark, parse_mark
from workloads.plan import build_plan, compile_plan, file_ids, parse_plan

# The recorder design (seed experiment 1) with every op kind somewhere.
FULL: dict[str, Any] = {
    "format": "powercut-workload/1",
    "name": "everything",
    "description": "every op kind once",
    "seed": 42,
    "budgets": {"write": {"max_us": 1000, "p99_us": 500}, "fsync": {"p99_us": 20000}},
    "invariants": {"recorder": {"file": "rec/0.dat", "record_bytes": 16384}},
    "threads": [
        {"name": "writer", "sched": {"policy": "fifo", "priority": 50, "cpu": 0}, "ops": [
            {"op": "mkdir", "path": "rec", "mode": "0750"},
            {"op": "open", "id": "rec-open", "path": "rec/0.dat", "flags": ["O_CREAT", "O_RDWR"], "fd": "rec"},
            {"op": "fallocate", "fd": "rec", "mode": ["KEEP_SIZE"], "offset": 0, "length": 104857600},
            {"op": "barrier", "name": "go"},
            {"op": "repeat", "count": 8000, "period_us": 5000, "ops": [
                {"op": "write", "id": "rec-write", "fd": "rec", "length": 16384}]},
            {"op": "ftruncate", "fd": "rec", "length": 131072000},
            {"op": "fsync", "fd": "rec"},
            {"op": "pwrite", "fd": "rec", "offset": 100, "length": 1000, "stride": 512},
            {"op": "pread", "fd": "rec", "offset": 0, "length": 4096},
            {"op": "read", "fd": "rec", "length": 4096},
            {"op": "mmap_write", "fd": "rec", "offset": 8192, "length": 4096, "msync": True},
            {"op": "fdatasync", "fd": "rec"},
            {"op": "syncfs", "fd": "rec"},
            {"op": "close", "fd": "rec"},
            {"op": "creat", "path": "rec/1.dat", "fd": "next"},
            {"op": "close", "fd": "next"},
            {"op": "open", "path": "rec/d.dat", "flags": ["O_CREAT", "O_WRONLY", "O_DIRECT", "O_DSYNC", "O_EXCL"],
             "mode": 420, "fd": "direct"},
            {"op": "pwrite", "fd": "direct", "offset": 0, "length": 4096},
            {"op": "close", "fd": "direct"},
            {"op": "truncate", "path": "rec/1.dat", "length": 0},
            {"op": "rename", "from": "rec/1.dat", "to": "rec/2.dat", "flags": ["NOREPLACE"]},
            {"op": "link", "from": "rec/2.dat", "to": "rec/3.dat"},
            {"op": "symlink", "target": "2.dat", "path": "rec/4.dat"},
            {"op": "setxattr", "path": "rec/2.dat", "name": "user.pc", "length": 32},
            {"op": "removexattr", "path": "rec/2.dat", "name": "user.pc"},
            {"op": "unlink", "path": "rec/3.dat"},
            {"op": "mkdir", "path": "tmp"},
            {"op": "rmdir", "path": "tmp"},
            {"op": "sync"},
            {"op": "open", "path": "rec", "flags": ["O_TMPFILE", "O_RDWR"], "fd": "tmp"},
            {"op": "linkat", "fd": "tmp", "to": "rec/5.dat"},
            {"op": "open", "path": "rec/5.dat", "flags": ["O_RDWR"], "fd": "five"},
            {"op": "copy_file_range", "from_fd": "tmp", "from_offset": 0, "fd": "five", "offset": 4096,
             "length": 4096},
            {"op": "clone", "from_fd": "tmp", "fd": "five"},
            {"op": "exchange_range", "from_fd": "tmp", "fd": "five", "flags": ["TO_EOF", "DSYNC"]},
            {"op": "f2fs_atomic", "fd": "five", "action": "start"},
            {"op": "fsetxattr", "fd": "five", "name": "user.pc", "length": 16, "flags": ["CREATE"]},
            {"op": "close", "fd": "five"},
            {"op": "close", "fd": "tmp"},
        ]},
        {"name": "flusher", "sched": {"policy": "idle", "nice": 10}, "ops": [
            {"op": "open", "path": "rec/0.dat", "flags": ["O_RDWR", "O_SYNC", "O_APPEND", "O_TRUNC"], "fd": "rec"},
            {"op": "barrier", "name": "go"},
            {"op": "repeat", "count": 62, "ops": [
                {"op": "sleep", "us": 640000},
                {"op": "sync_file_range", "fd": "rec", "offset": 0, "length": 2097152, "stride": 2097152,
                 "flags": ["WAIT_BEFORE", "WRITE", "WAIT_AFTER"]}]},
            {"op": "fiemap", "fd": "rec", "sync": True},
            {"op": "statx", "path": "rec/0.dat"},
            {"op": "pwritev2", "fd": "rec", "iov": [4096, 4096], "offset": -1, "flags": ["RWF_DSYNC"]},
            {"op": "close", "fd": "rec"},
        ]},
    ],
}


def full() -> dict[str, Any]:
    return copy.deepcopy(FULL)


def ops0(d: dict[str, Any]) -> list[dict[str, Any]]:
    return d["threads"][0]["ops"]


def test_full_example_uses_every_op_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(FULL))
    w = load_workload(path)
    assert {op.kind for t in w.threads for op in walk(t.ops)} == set(OP_KINDS)
    assert w.wid == zlib.crc32(b"everything")
    assert w.threads[0].sched.policy == "fifo" and w.threads[0].sched.cpu == 0
    assert w.threads[1].sched.nice == 10 and w.threads[1].sched.priority == 0
    assert w.budgets["write"].max_us == 1000 and w.budgets["fsync"].max_us is None
    assert w.invariants == FULL["invariants"] and w.seed == 42
    ops = w.threads[0].ops
    assert ops[0].args["mode"] == 0o750 and ops[1].args["mode"] == 0o644  # octal string, default
    assert ops[1].id == "rec-open" and ops[4].body[0].id == "rec-write"
    assert ops[7].args["stride"] == 512 and ops[8].args["stride"] == 0


def test_minimal_workload_gets_defaults() -> None:
    w = parse_workload({"format": FORMAT, "name": "m", "threads": [{"name": "t", "ops": [{"op": "sync"}]}]})
    assert w.threads[0].sched.policy == "other" and w.threads[0].sched.cpu is None
    assert w.budgets == {} and w.description is None
    assert w.device == Device() and w.generator is None


def test_device_and_generator_sections() -> None:
    d = full()
    d["device"] = {"size_mib": 256, "queue": {"scheduler": "mq-deadline", "nr_requests": 4}, "bdi": {"strict_limit": 1}}
    d["generator"] = {"name": "recorder", "scale": 0.01, "params": {"writes": 80}}
    w = parse_workload(d)
    assert w.device == Device(256, {"scheduler": "mq-deadline", "nr_requests": 4}, {"strict_limit": 1})
    assert list(w.device.queue) == ["scheduler", "nr_requests"]  # written in this order
    assert w.generator == Generator("recorder", 0.01, {"writes": 80})
    fiemap = w.threads[1].ops[3]
    assert (fiemap.kind, fiemap.args) == ("fiemap", {"fd": "rec", "sync": True})
    assert "kind=fiemap fd=0 sync=1" in compile_plan(w)


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def f(d: dict[str, Any]) -> None:
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value
    return f


def _delete(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def f(d: dict[str, Any]) -> None:
        for p in path[:-1]:
            d = d[p]
        del d[path[-1]]
    return f


def _insert(at: int, op: dict[str, Any], thread: int = 0) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["threads"][thread]["ops"].insert(at, op)


def _nest(depth: int) -> dict[str, Any]:
    op: dict[str, Any] = {"op": "sync"}
    for _ in range(depth):
        op = {"op": "repeat", "count": 2, "ops": [op]}
    return op


W0 = ["threads", 0, "ops"]
BAD = [
    (_delete(["name"]), "name: required field missing"),
    (_set(["format"], "powercut-workload/2"), 'format: must be "powercut-workload/1"'),
    (_set(["extra"], 1), "extra: unknown field"),
    (_set([*W0, 1, "op"], "opne"), "threads[0].ops[1].op: must be one of: open, creat"),
    (_set([*W0, 1, "bogus"], 1), "threads[0].ops[1].bogus: unknown field"),
    (_delete([*W0, 4, "ops", 0, "fd"]), "threads[0].ops[4].ops[0].fd: required field missing"),
    (_set([*W0, 4, "ops", 0, "length"], -1), "threads[0].ops[4].ops[0].length: must be >= 0"),
    (_set([*W0, 4, "count"], "many"), "threads[0].ops[4].count: must be of type integer"),
    (_set([*W0, 2, "mode"], ["KEEP_SIZE", "FAST"]), "threads[0].ops[2].mode[1]: must be one of: KEEP_SIZE"),
    (_set([*W0, 1, "path"], "/etc/passwd"), "threads[0].ops[1].path: \"/etc/passwd\" is not valid: A relative path"),
    (_set([*W0, 20, "to"], "rec/../../x"), "threads[0].ops[20].to: must not contain a '..' component"),
    (_set([*W0, 23, "name"], "pc"), "threads[0].ops[23].name: \"pc\" is not valid"),
    (_set([*W0, 1, "flags"], ["O_RDWR", "O_WRONLY"]), "threads[0].ops[1].flags: at most one of O_RDONLY"),
    (_set(["threads", 0, "sched", "priority"], 0), "threads[0].sched.priority: must be 1-99 for policy fifo"),
    (_set(["threads", 1, "sched", "priority"], 5), "threads[1].sched.priority: must be 0 for policy idle"),
    (_set(["threads", 1, "sched", "policy"], "deadline"), "threads[1].sched.policy: must be one of"),
    (_set(["threads", 1, "name"], "writer"), "threads[1].name: duplicate thread name 'writer'"),
    (_set(["budgets", "wirte"], {"max_us": 1}), "budgets.wirte: must be one of"),
    (_set(["budgets", "write"], {}), "budgets.write: must not be empty"),
    (_set([*W0, 4, "ops"], []), "threads[0].ops[4].ops: must have at least 1 item"),
    (_set([*W0, 5, "id"], "rec-open"), "threads[0].ops[5].id: duplicate op id 'rec-open'"),
    (_insert(1, {"op": "fsync", "fd": "rec"}), "threads[0].ops[1].fd: fd 'rec' is used before it is opened"),
    (_insert(14, {"op": "fsync", "fd": "rec"}), "threads[0].ops[14].fd: fd 'rec' is used after it was closed"),
    (_insert(2, {"op": "open", "path": "x", "flags": [], "fd": "rec"}), "threads[0].ops[2].fd: fd 'rec' is already open"),
    (_insert(0, {"op": "repeat", "count": 2, "ops": [{"op": "creat", "path": "x", "fd": "x"}]}),
     "threads[0].ops[0].ops: fd 'x' opened in the body is still open at its end"),
    (_set([*W0, 4, "ops"], [{"op": "close", "fd": "rec"}]), "threads[0].ops[4].ops: fd 'rec' opened outside the body"),
    (_set([*W0, 3, "name"], "alone"), "threads[0].ops[3].name: barrier 'alone' is named by one thread only"),
    (_insert(0, {"op": "barrier", "name": "go"}), "threads[1].ops[1].name: barrier 'go' is reached 1 times by this thread but 2"),
    (_insert(0, _nest(5)), "threads[0].ops[0].ops[0].ops[0].ops[0].ops[0]: repeats nested deeper than 4"),
    (_insert(0, {"op": "repeat", "count": 100000, "ops": [{"op": "repeat", "count": 100000, "ops": [{"op": "sync"}]}]}),
     "threads[0].ops[0].ops[0].count: nested repeats would run an op more than 2^32 times"),
    (_set([*W0, 4, "count"], 5000000), "threads[0].ops: would record 10000038 ops, more than 4000000"),
    (_set(["device"], {"queue": {"../x": 1}}), "device.queue.../x: \"../x\" is not valid: A sysfs attribute name"),
    (_set(["device"], {"queue": {"nr_requests": "4; rm"}}), "device.queue.nr_requests: \"4; rm\" is not valid"),
    (_set(["device"], {"size_mib": 0}), "device.size_mib: must be >= 1"),
    (_set(["generator"], {"scale": 1}), "generator.name: required field missing"),
    (_set(["threads", 1, "ops", 2, "ops", 1, "stride"], 1 << 61),
     "threads[1].ops[2].ops[1].offset: offset + length (+ stride * iterations) passes 2^62 (62 iterations)"),
]


@pytest.mark.parametrize("mutate,message", BAD, ids=[m for _, m in BAD])
def test_malformed_workload_names_the_field(mutate: Callable[[dict[str, Any]], None], message: str) -> None:
    d = full()
    mutate(d)
    with pytest.raises(UsageError) as e:
        parse_workload(d)
    text = str(e.value)
    assert text.startswith(f"WORKLOAD: {message}"), text
    assert "\n" not in text


def test_unreadable_and_non_json_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": ')
    with pytest.raises(UsageError, match=r"^WORKLOAD: \$: not JSON \(.* line 1 column 12\)$"):
        load_workload(bad)
    with pytest.raises(UsageError, match=r"^WORKLOAD: \$: cannot read .*missing.json"):
        load_workload(tmp_path / "missing.json")
    with pytest.raises(UsageError, match=r"^WORKLOAD: \$: must be of type object$"):
        parse_workload([1])


def workload() -> Workload:
    return parse_workload(full())


def test_plan_round_trip_and_numbering() -> None:
    w = workload()
    plan = build_plan(w)
    text = compile_plan(w)
    assert parse_plan(text) == plan
    assert compile_plan(parse_workload(full())) == text  # deterministic
    seqs = [op.seq for _, op in plan.ops()]
    assert seqs == list(range(len(seqs))) == list(range(sum(1 for t in w.threads for _ in walk(t.ops))))
    # repeats are not expanded: one line per op, whatever the count
    assert len(text.splitlines()) < 60
    by_id = {op.id: op for _, op in plan.ops() if op.id}
    assert by_id["rec-write"].fields == {"fd": 0, "file": 1, "length": 16384}
    assert by_id["rec-open"].fields["flags"] == ("O_CREAT", "O_RDWR")
    assert file_ids(w) == {"rec/0.dat": 1, "rec/1.dat": 2, "rec/d.dat": 3, "rec/2.dat": 4,
                          "rec": 5, "rec/5.dat": 6}  # an O_TMPFILE open: its data is keyed by the directory it was made in
    assert [(b.name, b.parties) for b in plan.barriers] == [("go", 2)]
    assert [t.fds for t in plan.threads] == [5, 1]
    assert plan.threads[0].cpu == 0 and plan.threads[1].cpu is None
    assert "op seq=4 kind=repeat count=8000 period_us=5000" in text
    assert "cpu=-1" in text


def test_plan_encodes_strings_with_spaces() -> None:
    d = {"format": "powercut-workload/1", "name": "sp", "threads": [{"name": "t", "ops": [
        {"op": "mkdir", "id": "a b%c", "path": "dir with space/ü"}]}]}
    text = compile_plan(parse_workload(d))
    assert "path=dir%20with%20space/%C3%BC" in text and "id=a%20b%25c" in text
    op = parse_plan(text).threads[0].ops[0]
    assert op.fields["path"] == "dir with space/ü" and op.id == "a b%c"


@pytest.mark.parametrize("text,message", [
    ("hello\n", "not a powercut plan"),
    ("powercut-plan 1\nworkload wid=1 name=x\nthread index=0 name=t policy=other priority=0 nice=0 cpu=-1 fds=0\n",
     "ends early"),
    ("powercut-plan 1\nworkload wid=1 name=x\nthread index=0 name=t policy=other priority=0 nice=0 cpu=-1 fds=0\n"
     "op seq=0 kind=fsync\nendthread\nend\n", "plan line 4: bad op line"),
])
def test_parse_plan_rejects(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_plan(text)


def test_pattern_chunk_decodes_and_crc_catches_a_flip() -> None:
    data = pattern.generate(0xDEADBEEF, 7, 123, 4, 1024, 2048)
    info = pattern.decode_chunk(data[512:1024])
    assert info == pattern.ChunkInfo(0xDEADBEEF, 7, 123, 4, 1536)
    for i in (0, 5, 28, 31, 32, 300, 511):
        flipped = bytearray(data[512:1024])
        flipped[i] ^= 0x01
        assert pattern.decode_chunk(bytes(flipped)) is None, i
    assert pattern.decode_chunk(bytes(512)) is None
    assert pattern.decode_chunk(data[512:1000]) is None
    assert pattern.decode_chunk(data[100:612]) is None  # misaligned: not a chunk start


def test_pattern_is_a_function_of_the_offset() -> None:
    whole = pattern.generate(1, 2, 3, 4, 0, 4096)
    assert pattern.generate(1, 2, 3, 4, 700, 1000) == whole[700:1700]
    assert pattern.generate(1, 2, 3, 4, 0, 0) == b""
    assert pattern.chunk_matches(whole[1024:1536], 1, 2, 3, 4, 1024)
    assert pattern.chunk_matches(whole[1030:1100], 1, 2, 3, 4, 1030)  # partial chunk
    assert not pattern.chunk_matches(whole[1024:1536], 1, 2, 3, 5, 1024)  # other iteration
    assert not pattern.chunk_matches(whole[1024:1536], 1, 2, 3, 4, 1536)  # other place
    # every field changes the filler
    base = pattern.generate(1, 2, 3, 4, 512, 512)[32:]
    for args in ((9, 2, 3, 4), (1, 9, 3, 4), (1, 2, 9, 4), (1, 2, 3, 9)):
        assert pattern.generate(*args, 512, 512)[32:] != base


U32 = st.integers(0, 2**32 - 1)


@settings(max_examples=50, deadline=None)
@given(U32, U32, U32, U32, st.integers(0, 2**40), st.integers(0, 3000), st.integers(0, 3000))
def test_any_slice_of_the_pattern_is_the_same_bytes(wid: int, fid: int, seq: int, it: int,
                                                    offset: int, skip: int, length: int) -> None:
    whole = pattern.generate(wid, fid, seq, it, offset, skip + length)
    assert pattern.generate(wid, fid, seq, it, offset + skip, length) == whole[skip:]
    start = -offset % 512  # first chunk boundary inside
    if start + 512 <= len(whole):
        info = pattern.decode_chunk(whole[start:start + 512])
        assert info == pattern.ChunkInfo(wid, fid, seq, it, offset + start)


def test_marks_round_trip() -> None:
    for m in (Mark("start"), Mark("end"), Mark("op", 1, 12345, 7999)):
        text = format_mark(m, "run7:")
        assert text.endswith("\n") and text.count("\n") == 1
        assert parse_mark(text, "run7:") == m
        assert parse_mark(text.encode(), "run7:") == m
        assert parse_mark(text, "run8:") is None
    assert format_mark(Mark("op", 0, 3, 0)) == "op 0.3.0\n"
    assert parse_mark("op 1.x.2") is None and parse_mark("ops") is None
    assert len(format_mark(Mark("op", 65535, 2**32 - 1, 2**32 - 1), "p" * 400).encode()) <= MARK_MAX

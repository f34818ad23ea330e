"""Workload files, format `powercut-workload/1`: schema validation plus the
checks a schema cannot express, into typed objects.

Every error is one UsageError line `WORKLOAD: <json path>: <what is wrong>`,
the path in the form `threads[0].ops[3].fd` (`$` for the document).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from foundation.errors import UsageError

SCHEMA_PATH = Path(__file__).parent / "schema" / "workload.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
FORMAT: str = SCHEMA["properties"]["format"]["const"]  # for generators of workloads
OP_KINDS: tuple[str, ...] = tuple(SCHEMA["$defs"]["kind"]["enum"])
# Ops that use an fd bound earlier; open and creat bind theirs.
FD_USERS = frozenset(k for k in OP_KINDS if "fd" in SCHEMA["$defs"][f"op_{k}"]["properties"]) - {"open", "creat"}
PATH_FIELDS = ("path", "from", "to", "target")
ACCESS_MODES = ("O_RDONLY", "O_WRONLY", "O_RDWR")
MAX_REPEAT_DEPTH = 4
MAX_ITERATIONS = 1 << 32      # iteration numbers are 32-bit in records and data chunks
MAX_RECORDS = 4_000_000       # records live in locked memory during a run
MAX_OFFSET = 1 << 62

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
# Field defaults of each op kind, as the schema declares them.
_DEFAULTS: dict[str, dict[str, Any]] = {
    k: {n: p["default"] for n, p in SCHEMA["$defs"][f"op_{k}"]["properties"].items() if "default" in p}
    for k in OP_KINDS
}


@dataclass(frozen=True)
class Op:
    """One op. `args` holds its fields with defaults filled in (modes as ints);
    `body` is a repeat's ops."""

    kind: str
    args: Mapping[str, Any]
    id: str | None = None
    body: tuple[Op, ...] = ()


@dataclass(frozen=True)
class Sched:
    policy: str = "other"
    priority: int = 0
    nice: int = 0
    cpu: int | None = None


@dataclass(frozen=True)
class Thread:
    name: str
    sched: Sched
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Budget:
    max_us: float | None = None
    p99_us: float | None = None


@dataclass(frozen=True)
class Device:
    """What the workload asks of the recorded device (applied by the harness, not pc-exec)."""

    size_mib: int | None = None
    queue: Mapping[str, int | str] = field(default_factory=dict)  # /sys/block/DEV/queue/ATTR
    bdi: Mapping[str, int | str] = field(default_factory=dict)    # /sys/class/bdi/MAJ:MIN/ATTR


@dataclass(frozen=True)
class Generator:
    """The scenario that generated the workload, for reproduction and its report section."""

    name: str
    scale: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    name: str
    threads: tuple[Thread, ...]
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    invariants: Mapping[str, Any] = field(default_factory=dict)
    description: str | None = None
    seed: int | None = None
    device: Device = field(default_factory=Device)
    generator: Generator | None = None

    @property
    def wid(self) -> int:
        """Workload id carried by every data chunk: CRC32 of the name."""
        return zlib.crc32(self.name.encode())


def walk(ops: Sequence[Op]) -> Iterator[Op]:
    """Every op, depth first, a repeat before its body (the order of seq numbers)."""
    for op in ops:
        yield op
        yield from walk(op.body)


def _fail(path: Sequence[str | int], what: str) -> UsageError:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "$"
    return UsageError(f"WORKLOAD: {text}: {' '.join(what.split())}")


def _schema_error(err: jsonschema.ValidationError) -> UsageError:
    path: list[str | int] = list(err.absolute_path)
    v, value, inst = err.validator, err.validator_value, err.instance
    if "propertyNames" in err.absolute_schema_path:
        path.append(str(inst))
    if v == "required":
        path.append(next(k for k in value if k not in inst))
        return _fail(path, "required field missing")
    if v == "additionalProperties":
        path.append(sorted(k for k in inst if k not in err.schema.get("properties", {}))[0])
        return _fail(path, "unknown field")
    simple = {
        "enum": lambda: "must be one of: " + ", ".join(map(str, value)),
        "const": lambda: f"must be {json.dumps(value)}",
        "type": lambda: "must be of type " + (" or ".join(value) if isinstance(value, list) else value),
        "minimum": lambda: f"must be >= {value}",
        "maximum": lambda: f"must be <= {value}",
        "minItems": lambda: f"must have at least {value} item(s)",
        "maxItems": lambda: f"must have at most {value} items",
        "minLength": lambda: f"must have at least {value} character(s)",
        "maxLength": lambda: f"must have at most {value} characters",
        "uniqueItems": lambda: "has duplicate items",
        "minProperties": lambda: "must not be empty",
    }
    if v in simple:
        return _fail(path, simple[v]())
    if "description" in err.schema:  # pattern, oneOf: say what is expected
        return _fail(path, f"{json.dumps(inst)} is not valid: {err.schema['description']}")
    return _fail(path, err.message)


class _Checker:
    """The semantic checks, walking the document in program order."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        # barrier name -> thread index -> times reached; and where first named
        self.barriers: dict[str, dict[int, int]] = {}
        self.barrier_at: dict[tuple[str, int], list[str | int]] = {}

    def thread(self, ti: int, t: Mapping[str, Any]) -> None:
        sched = t.get("sched", {})
        policy, prio = sched.get("policy", "other"), sched.get("priority", 0)
        if policy in ("fifo", "rr") and not 1 <= prio <= 99:
            raise _fail(["threads", ti, "sched", "priority"], f"must be 1-99 for policy {policy}")
        if policy not in ("fifo", "rr") and prio != 0:
            raise _fail(["threads", ti, "sched", "priority"], f"must be 0 for policy {policy}")
        records = self.ops(ti, t["ops"], ["threads", ti, "ops"], set(), set(), 0, 1)
        if records > MAX_RECORDS:
            raise _fail(["threads", ti, "ops"], f"would record {records} ops, more than {MAX_RECORDS}")

    def ops(self, ti: int, ops: Sequence[Mapping[str, Any]], path: list[str | int],
            open_fds: set[str], closed: set[str], depth: int, iters: int) -> int:
        """Checks OPS, updating the fd sets; returns the records they produce."""
        records = 0
        for i, op in enumerate(ops):
            at = [*path, i]
            records += self.op(ti, op, at, open_fds, closed, depth, iters)
        return records

    def op(self, ti: int, op: Mapping[str, Any], at: list[str | int],
           open_fds: set[str], closed: set[str], depth: int, iters: int) -> int:
        kind = op["op"]
        if "id" in op:
            if op["id"] in self.ids:
                raise _fail([*at, "id"], f"duplicate op id {op['id']!r}")
            self.ids.add(op["id"])
        for f in PATH_FIELDS:
            if f in op and (".." in op[f].split("/") or "\0" in op[f]):
                raise _fail([*at, f], "must not contain a '..' component or NUL")
        if kind == "open" and sum(f in op["flags"] for f in ACCESS_MODES) > 1:
            raise _fail([*at, "flags"], "at most one of O_RDONLY, O_WRONLY, O_RDWR")
        if "offset" in op and op["offset"] + (iters - 1) * op.get("stride", 0) + op_length(op) > MAX_OFFSET:
            raise _fail([*at, "offset"], f"offset + length (+ stride * iterations) passes 2^62 ({iters} iterations)")
        if kind in ("open", "creat"):
            if op["fd"] in open_fds:
                raise _fail([*at, "fd"], f"fd {op['fd']!r} is already open (close it first)")
            open_fds.add(op["fd"])
        else:  # the fds it uses (from_fd: the source of copy_file_range and clone) must be open
            for f in [f for f in ("fd", "from_fd") if f in op and (f != "fd" or kind in FD_USERS)]:
                if op[f] not in open_fds:
                    when = "after it was closed" if op[f] in closed else "before it is opened"
                    raise _fail([*at, f], f"fd {op[f]!r} is used {when}")
        if kind == "close":
            open_fds.discard(op["fd"])
            closed.add(op["fd"])
        elif kind == "barrier":
            self.barriers.setdefault(op["name"], {}).setdefault(ti, 0)
            self.barriers[op["name"]][ti] += iters
            self.barrier_at.setdefault((op["name"], ti), [*at, "name"])
        elif kind == "repeat":
            return self.repeat(ti, op, at, open_fds, closed, depth, iters)
        return 1

    def repeat(self, ti: int, op: Mapping[str, Any], at: list[str | int],
               open_fds: set[str], closed: set[str], depth: int, iters: int) -> int:
        if depth == MAX_REPEAT_DEPTH:
            raise _fail(at, f"repeats nested deeper than {MAX_REPEAT_DEPTH}")
        if iters * op["count"] > MAX_ITERATIONS:
            raise _fail([*at, "count"], "nested repeats would run an op more than 2^32 times")
        before = set(open_fds)
        body = self.ops(ti, op["ops"], [*at, "ops"], open_fds, closed, depth + 1, iters * op["count"])
        if open_fds != before:
            fd = sorted(open_fds ^ before)[0]
            how = "opened in the body is still open at its end" if fd in open_fds else "opened outside the body is closed in it"
            raise _fail([*at, "ops"], f"fd {fd!r} {how}: every iteration must start with the same fds open")
        return op["count"] * (1 + body)

    def finish(self) -> None:
        for name, counts in self.barriers.items():
            first = min(counts)
            if len(counts) < 2:
                raise _fail(self.barrier_at[name, first], f"barrier {name!r} is named by one thread only; it needs two or more")
            for ti, n in counts.items():
                if n != counts[first]:
                    raise _fail(self.barrier_at[name, ti], f"barrier {name!r} is reached {n} times by this thread but "
                                f"{counts[first]} times by thread {first}: the threads would deadlock")


def op_length(op: Mapping[str, Any]) -> int:
    """Bytes an op moves: its length, or a pwritev2's iovec lengths together."""
    return int(op["length"]) if "length" in op else sum(op.get("iov", ()))


def _mode(v: int | str) -> int:
    return int(v, 8) if isinstance(v, str) else v


def _op(doc: Mapping[str, Any]) -> Op:
    kind = doc["op"]
    args = {**_DEFAULTS[kind], **{k: v for k, v in doc.items() if k not in ("op", "id", "ops")}}
    if "mode" in args and kind != "fallocate":  # fallocate's mode is its flag list
        args["mode"] = _mode(args["mode"])
    if kind == "pwritev2":
        args["length"] = op_length(args)
    return Op(kind, args, doc.get("id"), tuple(_op(o) for o in doc.get("ops", ())))


def parse_workload(doc: Any) -> Workload:
    """A Workload from a decoded JSON document; UsageError if it is not valid."""
    err = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(doc))
    if err is not None:
        raise _schema_error(err)
    checker = _Checker()
    for ti, t in enumerate(doc["threads"]):
        if any(u["name"] == t["name"] for u in doc["threads"][:ti]):
            raise _fail(["threads", ti, "name"], f"duplicate thread name {t['name']!r}")
        checker.thread(ti, t)
    checker.finish()
    threads = tuple(Thread(t["name"], Sched(**t.get("sched", {})), tuple(_op(o) for o in t["ops"])) for t in doc["threads"])
    budgets = {k: Budget(**b) for k, b in doc.get("budgets", {}).items()}
    generator = Generator(**doc["generator"]) if "generator" in doc else None
    return Workload(doc["name"], threads, budgets, doc.get("invariants", {}), doc.get("description"), doc.get("seed"),
                    Device(**doc.get("device", {})), generator)


def workload_doc(ops: list[dict[str, Any]], name: str = "random") -> dict[str, Any]:
    """A one-thread workload document around OPS (what generators produce)."""
    return {"format": FORMAT, "name": name, "threads": [{"name": "main", "ops": ops}]}


def load_workload(path: str | Path) -> Workload:
    """Reads and validates the workload file PATH."""
    return parse_workload(read_document(path))


def read_document(path: str | Path) -> Any:
    """The decoded JSON of the workload file PATH, not yet validated."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(f"WORKLOAD: $: cannot read {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"WORKLOAD: $: {path} is not UTF-8 text") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"WORKLOAD: $: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from e

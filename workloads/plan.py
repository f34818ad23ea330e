"""The plan: a workload compiled for the C executor (build/pc-exec).

Numbering done here, once, for everyone: every op gets a global sequence
number `seq` (threads in order, ops depth first, a repeat before its body),
each distinct path that is opened, created or given an xattr a pattern
`file` id (1, 2, ... in order of first appearance), each fd name a slot in
its thread's fd table, each barrier an index. Repeats stay loops: the
executor expands them, so 8000 iterations cost one line.

Plan format "powercut-plan 1" (parsed in C by workloads/executor/plan.c):
one record per line, space-separated key=value fields. String values are
percent-encoded (%XX for every byte but A-Z a-z 0-9 - . _ ~ /), so they hold
no spaces. Flag lists are names joined by '|', or '-' when empty.

  powercut-plan 1
  workload wid=<u32> name=<str>
  barrier index=<i> parties=<n> name=<str>       one line per barrier, index 0, 1, ...
  thread index=<i> name=<str> policy=<other|batch|idle|fifo|rr> priority=<n> nice=<n> cpu=<n|-1> fds=<n>
  op seq=<n> kind=<kind> [id=<str>] <the kind's fields: PLAN_FIELDS, the schema's x-plan>
  ...                                            a repeat's body follows its op line up to "endrepeat"
  endthread
  end

fd is a slot of the thread's fd table, file the pattern file id of the data
the op writes, barrier an index, period_us 0 for none; execution i of an op
works at offset + i*stride (a pwritev2 offset of -1: the fd's position). A
pwritev2's iov is its iovec lengths joined by ',', its length their sum;
a statx's flags are its mask. copy_file_range and clone read from the
from_fd slot at from_offset (a clone with from_offset, offset and length
all 0 is FICLONE, the whole file); exchange_range's file1 is the from_fd
slot, file2 the fd slot. Modes are octal, all other numbers decimal.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from foundation.errors import UsageError
from workloads.format import SCHEMA, Op, Workload, walk
from workloads.plan_schema import plan_specs

HEADER = "powercut-plan 1"

# Each op kind's line: its fields in order, and where its flag names come from; written
# once, in the schema (each op's x-plan), which also gives the C executor its tables.
PLAN_SPECS = plan_specs(SCHEMA)
PLAN_FIELDS: dict[str, tuple[str, ...]] = {k: s.fields for k, s in PLAN_SPECS.items()}
_STRINGS = frozenset(("path", "from", "to", "target", "name", "id"))
FILE_OPENERS = ("open", "creat", "setxattr")  # the ops whose path gets a file id

Value = int | str | tuple[str, ...]


def xattr_names(name: str, count: int) -> list[str]:
    """The names a setxattr of COUNT sets, in order: NAME, then NAME.1 .. NAME.(COUNT-1)
    (workloads/executor/ops.c set_xattrs)."""
    return [name] + [f"{name}.{i}" for i in range(1, count)]


@dataclass(frozen=True)
class PlanOp:
    """An op as the executor sees it: `fields` per PLAN_FIELDS (ints, strings,
    flag-name tuples)."""

    seq: int
    kind: str
    fields: Mapping[str, Value]
    id: str | None = None
    body: tuple[PlanOp, ...] = ()


@dataclass(frozen=True)
class PlanThread:
    index: int
    name: str
    policy: str
    priority: int
    nice: int
    cpu: int | None
    fds: int
    ops: tuple[PlanOp, ...]


@dataclass(frozen=True)
class PlanBarrier:
    index: int
    name: str
    parties: int


@dataclass(frozen=True)
class Plan:
    wid: int
    name: str
    barriers: tuple[PlanBarrier, ...]
    threads: tuple[PlanThread, ...]

    def ops(self) -> Iterator[tuple[PlanThread, PlanOp]]:
        """Every op with its thread, in seq order."""
        def rec(ops: Sequence[PlanOp]) -> Iterator[PlanOp]:
            for op in ops:
                yield op
                yield from rec(op.body)
        for t in self.threads:
            for op in rec(t.ops):
                yield t, op

    def by_seq(self) -> dict[int, tuple[PlanThread, PlanOp]]:
        return {op.seq: (t, op) for t, op in self.ops()}


def file_ids(workload: Workload) -> dict[str, int]:
    """Pattern file id of each path that is opened, created or given an xattr."""
    ids: dict[str, int] = {}
    for t in workload.threads:
        for op in walk(t.ops):
            if op.kind in FILE_OPENERS:
                ids.setdefault(op.args["path"], len(ids) + 1)
    return ids


class _Builder:
    def __init__(self, workload: Workload) -> None:
        self.files = file_ids(workload)
        self.barriers: dict[str, int] = {}
        self.parties: dict[str, set[int]] = {}
        self.seq = 0

    def thread(self, index: int, ops: Sequence[Op]) -> tuple[tuple[PlanOp, ...], int]:
        """The thread's plan ops and its number of fd slots."""
        slots: dict[str, int] = {}
        current: dict[str, int] = {}  # fd name -> file id of its latest open
        return self.ops(index, ops, slots, current), len(slots)

    def ops(self, ti: int, ops: Sequence[Op], slots: dict[str, int], current: dict[str, int]) -> tuple[PlanOp, ...]:
        out = []
        for op in ops:
            seq = self.seq
            self.seq += 1
            if "fd" in op.args:
                slots.setdefault(op.args["fd"], len(slots))
            if op.kind in ("open", "creat"):
                current[op.args["fd"]] = self.files[op.args["path"]]
            if op.kind == "barrier":
                self.barriers.setdefault(op.args["name"], len(self.barriers))
                self.parties.setdefault(op.args["name"], set()).add(ti)
            fields = {f: self.value(op, f, slots, current) for f in PLAN_FIELDS[op.kind]}
            body = self.ops(ti, op.body, slots, current)
            out.append(PlanOp(seq, op.kind, fields, op.id, body))
        return tuple(out)

    def value(self, op: Op, f: str, slots: dict[str, int], current: dict[str, int]) -> Value:
        a = op.args
        match f:
            case "fd" | "from_fd":
                return slots[a[f]]
            case "file":
                return self.files[a["path"]] if op.kind in FILE_OPENERS else current[a["fd"]]
            case "flags":
                v = a[PLAN_SPECS[op.kind].flags_from or "flags"]
                return (v,) if isinstance(v, str) else tuple(v)
            case "iov":
                return ",".join(map(str, a["iov"]))
            case "barrier":
                return self.barriers[a["name"]]
            case "msync" | "sync":
                return int(a[f])
            case "period_us":
                return a.get("period_us") or 0
            case "count" if op.kind == "setxattr":
                return a.get("count", 1)
        return a[f]


def build_plan(workload: Workload) -> Plan:
    b = _Builder(workload)
    threads = []
    for i, t in enumerate(workload.threads):
        ops, fds = b.thread(i, t.ops)
        s = t.sched
        threads.append(PlanThread(i, t.name, s.policy, s.priority, s.nice, s.cpu, fds, ops))
    barriers = tuple(PlanBarrier(i, n, len(b.parties[n])) for n, i in b.barriers.items())
    return Plan(workload.wid, workload.name, barriers, tuple(threads))


def _enc(v: Value, key: str) -> str:
    if isinstance(v, tuple):
        return "|".join(v) or "-"
    if key == "mode":
        return f"{v:04o}"
    if key == "iov":
        return str(v)
    return quote(v, safe="/") if isinstance(v, str) else str(v)


def _dec(s: str, key: str) -> Value:
    if key == "flags":
        return () if s == "-" else tuple(s.split("|"))
    if key == "mode":
        return int(s, 8)
    if key == "iov":
        return s
    return unquote(s, errors="strict") if key in _STRINGS else int(s)


def render_plan(plan: Plan) -> str:
    lines = [HEADER, f"workload wid={plan.wid} name={_enc(plan.name, 'name')}"]
    lines += [f"barrier index={b.index} parties={b.parties} name={_enc(b.name, 'name')}" for b in plan.barriers]

    def emit(ops: Sequence[PlanOp]) -> None:
        for op in ops:
            head = f"op seq={op.seq} kind={op.kind}" + (f" id={_enc(op.id, 'id')}" if op.id is not None else "")
            lines.append(" ".join([head, *(f"{k}={_enc(v, k)}" for k, v in op.fields.items())]))
            if op.kind == "repeat":
                emit(op.body)
                lines.append("endrepeat")

    for t in plan.threads:
        cpu = -1 if t.cpu is None else t.cpu
        lines.append(f"thread index={t.index} name={_enc(t.name, 'name')} policy={t.policy} "
                     f"priority={t.priority} nice={t.nice} cpu={cpu} fds={t.fds}")
        emit(t.ops)
        lines.append("endthread")
    lines.append("end")
    return "\n".join(lines) + "\n"


def compile_plan(workload: Workload) -> str:
    """The plan text pc-exec runs for WORKLOAD."""
    return render_plan(build_plan(workload))


def parse_plan(text: str) -> Plan:
    """Reads plan text back (the inverse of render_plan); UsageError if malformed."""
    numbered = [(no, ln.split()) for no, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not numbered or numbered[0][1] != HEADER.split():
        raise UsageError(f"plan: not a powercut plan (first line must be {HEADER!r})")
    lines = iter(numbered[1:])

    def nxt(expect: str) -> tuple[int, str, dict[str, str]]:
        for no, words in lines:
            try:
                return no, words[0], dict(w.split("=", 1) for w in words[1:])
            except ValueError:
                raise UsageError(f"plan line {no}: fields must be key=value") from None
        raise UsageError(f"plan ends early: {expect} expected")

    def ops(end: str) -> tuple[PlanOp, ...]:
        out = []
        while True:
            no, word, kv = nxt(f"'op' or '{end}'")
            if word == end:
                return tuple(out)
            try:
                kind = kv["kind"]
                fields = {k: _dec(kv[k], k) for k in PLAN_FIELDS[kind]}
                op_id = _dec(kv["id"], "id") if "id" in kv else None
                out.append(PlanOp(int(kv["seq"]), kind, fields, op_id, ops("endrepeat") if kind == "repeat" else ()))
            except (KeyError, ValueError) as e:
                raise UsageError(f"plan line {no}: bad op line ({e})") from None

    try:
        _, _, w = nxt("'workload'")
        barriers, threads = [], []
        while True:
            no, word, kv = nxt("'end'")
            if word == "end":
                break
            if word == "barrier":
                barriers.append(PlanBarrier(int(kv["index"]), str(_dec(kv["name"], "name")), int(kv["parties"])))
            elif word == "thread":
                cpu = int(kv["cpu"])
                threads.append(PlanThread(int(kv["index"]), str(_dec(kv["name"], "name")), kv["policy"],
                                          int(kv["priority"]), int(kv["nice"]), None if cpu < 0 else cpu,
                                          int(kv["fds"]), ops("endthread")))
            else:
                raise UsageError(f"plan line {no}: unexpected {word!r}")
        return Plan(int(w["wid"]), str(_dec(w["name"], "name")), tuple(barriers), tuple(threads))
    except (KeyError, ValueError) as e:
        raise UsageError(f"plan: missing or bad field {e}") from None

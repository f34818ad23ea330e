"""The pruned, ordered seq-2/seq-3 space of the exhaustive engine (ACE-style).

ACE (CrashMonkey's workload generator, OSDI'18) bounds its space and then
prunes it; this module does the same over powercut's set-up
(workloads/ace_setup.py SETUP: dirs A, A/C; foo and A/foo with data; sync):

- Core ops are op kinds applied to a small name set (files foo, bar, A/foo,
  A/bar, B/foo, A/C/foo; dirs A, B, A/C), not fixed calls: creat (also at a
  directory's name), tmplink (open O_TMPFILE in the directory, write 4 KiB,
  linkat to the name: the atomic create), mkdir, link, unlink, rmdir,
  rename (of a file, symlink or directory, to a new name or over one),
  renameat2 RENAME_EXCHANGE, symlink, five data ops (append, overwrite, punch a hole, shrink,
  truncate to 0) and two xattr ops on the set-up's foo, whose two xattr names share one packed
  item on btrfs (replace the first, remove the second; once, as either leaves no pair).
- Every core op must succeed in a model of the namespace after the ops
  before it. ACE adds the ops a core op depends on (a creat before a write);
  here the set-up makes the common ones exist and a call that would fail is
  dropped: a failed call changes nothing, so its workload is a shorter one.
- Related ops only (ACE applies this to seq-3; here to seq-2 too): each core
  op acts on what the op before acted on, or on a name in a directory it
  acted on or changed (the root aside), or the other way round (mkdir B,
  then link foo B/foo).
- Persistence points on used files only (ACE's "range of used files" for
  seq-2): fsync of a file or directory the workload's ops act on, or of a
  directory whose entries they change (or its ancestors), fdatasync after a
  data op, sync, and "none" except after the last op (ACE: the last op
  always has one, else the workload is a shorter one). seq-3 narrows this
  further (ACE's "strictly used files", and its metadata-only seq-3): the
  second and third ops are namespace ops, nothing is persisted after the
  first (it makes the state the other two work on), the second is followed
  by none or an fsync of what the third acts on (or of a directory holding a
  name it uses), the third by such an fsync.

Files keep an fd from their first use (created by creat, or opened right
after the set-up) to the end, as ACE's workloads do: fsync of a file goes
through it, so a file renamed or unlinked since is still reachable (an fd
whose file has no name left). Directories are opened by their current name
to be fsynced.

The order is by likelihood. Tier 0 (of 8): the last op is a namespace or xattr op (inode
metadata the log must carry: xfstests generic/066 and 489 fsync after xattr changes), the
last persistence point an fsync of what it touched (its object, a directory
holding a name it changed, or an ancestor) and the one before it an fsync of
what the last op touches or of what the op before acted on: a change to
something the file system has just logged, then an fsync that must carry it,
which is the shape of xfstests' power-failure tests. Each of these three
conditions that fails moves a workload back (the last persistence most,
then a data op last, then no fsync before). Within a tier, workloads are
dealt round-robin over shape classes (op kinds, what they act on, what each
persistence point persists), so the first workloads of a tier are all of
different shapes; inside a class, the same object persisted twice and the
nearest directory first, then a fixed hash. `Space.tiers` counts the tiers.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from workloads.ace_setup import SETUP, SIZE_OF, START, XATTR_FILE
from workloads.ace_setup import parent as _parent
from workloads.format import workload_doc
from workloads.vocab import XATTRS

FILE_NAMES = ["foo", "bar", "A/foo", "A/bar", "B/foo", "A/C/foo"]
DIR_NAMES = ["A", "B", "A/C"]
NAMES = FILE_NAMES + DIR_NAMES
DATA_OPS: dict[str, dict[str, Any]] = {
    "append": {"op": "pwrite", "offset": -1, "length": 4096},   # offset -1: at the current size
    "overwrite": {"op": "pwrite", "offset": 0, "length": 4096},
    "punch": {"op": "fallocate", "mode": ["PUNCH_HOLE", "KEEP_SIZE"], "offset": 0, "length": 4096},
    "shrink": {"op": "ftruncate", "length": 3000},
    "empty": {"op": "ftruncate", "length": 0},                  # the boundary: a file of size 0
}
ROOT_ID = 0                                    # "." is the first name of START
# A file given hundreds of xattrs (as Samba, Ceph and backup tools keep per file): on xfs a
# node-format attr tree of about 130 leaf blocks, on btrfs 400 items, ext4 fills its xattr
# block (ENOSPC after a few). One op (setxattr with a count), set by path.
MANY_XATTRS = {"op": "setxattr", "name": "user.many", "length": 1024, "count": 400}
# What an application goes on doing while the file system finishes a removed file in the
# background (xfs inodegc, btrfs delayed iputs): writing and fsyncing its own log.
TAIL_FILE, TAIL_FSYNCS = "wal", 8


@dataclass(frozen=True)
class State:
    """The namespace: name -> object id; object id -> kind ("file", "dir", "symlink") and size."""

    ns: tuple[tuple[str, int], ...]
    kinds: tuple[tuple[int, str], ...]
    sizes: tuple[tuple[int, int], ...]
    packed: tuple[int, ...] = ()     # the objects holding the set-up's second xattr (XATTRS[1])

    @functools.cached_property
    def names(self) -> dict[str, int]:
        return dict(self.ns)

    @functools.cached_property
    def kind(self) -> dict[int, str]:
        return dict(self.kinds)

    def path_of(self, obj: int) -> str | None:
        return next((p for p, o in self.ns if o == obj), None)

    def is_dir(self, path: str) -> bool:
        o = self.names.get(path)
        return o is not None and self.kind[o] == "dir"

    def empty(self, path: str) -> bool:
        return not any(p.startswith(path + "/") for p in self.names)


def start_state() -> State:
    ns = tuple((p, i) for i, p in enumerate(START))
    kinds = tuple((i, k) for i, k in enumerate(START.values()))
    sizes = tuple((i, SIZE_OF.get(p, 0)) for i, p in enumerate(START))
    return State(ns, kinds, sizes, (list(START).index(XATTR_FILE),))


@dataclass(frozen=True)
class Core:
    """One core op: its name, the call(s) (fd "F<id>" is object id's fd), the objects it
    acts on, the directories holding the names it uses and their ancestors, what it creates."""

    name: str
    ops: tuple[dict[str, Any], ...]
    objects: frozenset[int]
    dirs: frozenset[int]
    namespace: bool
    new: tuple[tuple[str, str], ...] = ()     # (kind, path) of what it creates
    data_on: int | None = None                # a data op's file
    meta: bool = False                        # an xattr op: inode metadata the log must carry


def apply(st: State, core: Core) -> State:
    """ST after CORE."""
    names, kinds, sizes = dict(st.names), dict(st.kind), dict(st.sizes)
    op = core.ops[-1]
    kind = op["op"]
    nxt = max(kinds) + 1
    if core.new:
        k, path = core.new[0]
        names[path], kinds[nxt], sizes[nxt] = nxt, k, 4096 if core.name.startswith("tmplink") else 0
    elif kind == "link":
        names[op["to"]] = names[op["from"]]
    elif kind in ("unlink", "rmdir"):
        del names[op["path"]]
    elif kind == "rename":
        src, dst = op["from"], op["to"]
        moved = {p: o for p, o in names.items() if p == src or p.startswith(src + "/")}
        if "EXCHANGE" in op.get("flags", []):
            other = {p: o for p, o in names.items() if p == dst or p.startswith(dst + "/")}
            for p in list(moved) + list(other):
                del names[p]
            names.update({dst + p[len(src):]: o for p, o in moved.items()})
            names.update({src + p[len(dst):]: o for p, o in other.items()})
        else:
            names.pop(dst, None)
            for p in moved:
                del names[p]
            names.update({dst + p[len(src):]: o for p, o in moved.items()})
    elif core.meta or core.name.startswith("xattrs("):   # the file no longer has the packed pair
        return State(st.ns, st.kinds, st.sizes, tuple(o for o in st.packed if o not in core.objects))
    elif core.data_on is not None:
        o = core.data_on
        sizes[o] = {"append": sizes[o] + 4096, "shrink": 3000, "empty": 0}.get(core.name.split("(")[0],
                                                                              max(sizes[o], 4096))
    return State(tuple(sorted(names.items())), tuple(sorted(kinds.items())), tuple(sorted(sizes.items())),
                 tuple(o for o in st.packed if o in kinds))


def cores(st: State) -> list[Core]:
    """Every core op that succeeds in ST, in a fixed order."""
    n, out = st.names, []
    nxt = max(st.kind) + 1

    def free(path: str) -> bool:
        return path not in n and st.is_dir(_parent(path))

    def dirs(*paths: str) -> frozenset[int]:
        """The directories whose entries a change of PATHS changes, and their ancestors."""
        out = set()
        for p in paths:
            while p != ".":
                p = _parent(p)
                if p in n:
                    out.add(n[p])
        return frozenset(out)

    for p in NAMES:
        if free(p):
            creat = {"op": "open", "path": p, "flags": ["O_CREAT", "O_RDWR"], "fd": f"F{nxt}"}
            out.append(Core(f"creat({p})", (creat,),
                            frozenset({nxt}), dirs(p), True, (("file", p),)))
    for p in FILE_NAMES:
        if free(p):  # the atomic create: a file made with no name, written, then named (open(2) O_TMPFILE)
            tmp = {"op": "open", "path": _parent(p), "flags": ["O_TMPFILE", "O_RDWR"], "fd": f"F{nxt}"}
            out.append(Core(f"tmplink({p})", (tmp, {"op": "pwrite", "fd": f"F{nxt}", "offset": 0, "length": 4096},
                                               {"op": "linkat", "fd": f"F{nxt}", "to": p}),
                            frozenset({nxt}), dirs(p), True, (("file", p),)))
    for p in DIR_NAMES:
        if free(p):
            out.append(Core(f"mkdir({p})", ({"op": "mkdir", "path": p},), frozenset({nxt}), dirs(p), True,
                            (("dir", p),)))
    for p in FILE_NAMES:
        if free(p):
            out.append(Core(f"symlink({p})", ({"op": "symlink", "target": "foo", "path": p},), frozenset({nxt}),
                            dirs(p), True, (("symlink", p),)))
    present = [p for p in NAMES if p in n]
    for s in present:
        o = n[s]
        if st.kind[o] == "file":
            for d in FILE_NAMES:
                if free(d):
                    out.append(Core(f"link({s},{d})", ({"op": "link", "from": s, "to": d},), frozenset({o}),
                                    dirs(d), True))
        if st.kind[o] == "dir":
            if st.empty(s):
                out.append(Core(f"rmdir({s})", ({"op": "rmdir", "path": s},), frozenset({o}), dirs(s), True))
        else:
            out.append(Core(f"unlink({s})", ({"op": "unlink", "path": s},), frozenset({o}), dirs(s), True))
        for d in NAMES:
            if d == s or d.startswith(s + "/") or s.startswith(d + "/") or not st.is_dir(_parent(d)):
                continue
            victim = n.get(d)
            if victim is not None and victim == o:
                continue
            isdir = st.kind[o] == "dir"
            if victim is None or (st.kind[victim] == "dir") == isdir and (not isdir or st.empty(d)):
                objs = frozenset({o} | ({victim} if victim is not None else set()))
                out.append(Core(f"rename({s},{d})", ({"op": "rename", "from": s, "to": d},), objs, dirs(s, d), True))
            if victim is not None and s < d:
                out.append(Core(f"exchange({s},{d})", ({"op": "rename", "from": s, "to": d, "flags": ["EXCHANGE"]},),
                                frozenset({o, victim}), dirs(s, d), True))
        if o in st.packed and s == st.path_of(o):   # the set-up's file with two xattrs: replace one, remove the other
            out.append(Core(f"xattr({s})", ({"op": "setxattr", "path": s, "name": XATTRS[0], "length": 100},),
                            frozenset({o}), frozenset(), False, meta=True))
            out.append(Core(f"rmxattr({s})", ({"op": "removexattr", "path": s, "name": XATTRS[1]},),
                            frozenset({o}), frozenset(), False, meta=True))
            # Hundreds of xattrs, once (it ends the packed pair too). Not `meta`: a change to
            # log like the two above, but what matters is what a later op does with the tree.
            out.append(Core(f"xattrs({s})", (dict(MANY_XATTRS, path=s),), frozenset({o}), frozenset(), False))
        if st.kind[o] == "file" and s == st.path_of(o):   # one data op per file, by its first name
            for name, op in DATA_OPS.items():
                call = dict(op, fd=f"F{o}")
                if call.get("offset") == -1:
                    call["offset"] = dict(st.sizes)[o]
                out.append(Core(f"{name}({s})", (call,), frozenset({o}), frozenset(), False, data_on=o))
    return out


def related(a: Core, b: Core) -> bool:
    """B acts on what A acted on, or on a name in a directory A acted on or changed (the root
    aside: everything is in it), or the other way round."""
    return bool(a.objects & (b.objects | b.dirs) or b.objects & a.dirs or (a.dirs & b.dirs) - {ROOT_ID})


def _strong(a: Core, b: Core) -> bool:
    """B acts on what A acted on, or inside what A acted on (not merely in the same directory)."""
    return bool(b.objects & a.objects or a.objects & b.dirs)


def _alive(st: State, o: int) -> bool:
    """O can be persisted in ST: a file (its fd is open), or a directory that has a name."""
    kind = st.kind.get(o)
    return kind == "file" or (kind == "dir" and st.path_of(o) is not None)


Persist = tuple[str, int] | None   # ("fsync"|"fdatasync", object), ("sync", -1), or none


def _near(core: Core, st: State) -> frozenset[int]:
    """What CORE acts on and the directories holding the names it uses (in ST, before it)."""
    parents = {st.names.get(_parent(op[k])) for op in core.ops for k in ("path", "from", "to") if k in op}
    return core.objects | frozenset(o for o in parents if o is not None)


def persist_options(seq: int, chain: list[Core], states: list[State], k: int) -> list[Persist]:
    """The persistence points after core op K (STATES[k + 1] is the state after it).
    seq-2, ACE's range of used files: fsync of any object the workload's ops act on or of a
    directory whose entries they change (or an ancestor's), fdatasync after a data op, sync,
    none (not last). seq-3, ACE's strictly used files, narrowed further: none after the first
    op (it makes the state the other two work on); then none or an fsync of what the last op
    acts on or of a directory holding a name it uses; last such an fsync."""
    st, core, last = states[k + 1], chain[k], k == len(chain) - 1
    if seq == 2:
        targets = set().union(*(c.objects | c.dirs for c in chain))
    elif k == 0:
        return [None]
    else:
        targets = set(_near(chain[-1], states[-2]))
    out: list[Persist] = [("fsync", o) for o in sorted(targets) if _alive(st, o)]
    if core.data_on is not None and (seq == 2 or last):
        out.append(("fdatasync", core.data_on))
    if seq == 2:
        out.append(("sync", -1))
    if not last:
        out.append(None)
    return out


def _tier(chain: list[Core], persists: tuple[Persist, ...]) -> int:
    """0 (likeliest) to 7, from the last op and the two persistence points around it."""
    last, prev = chain[-1], chain[-2]
    touched = last.objects | last.dirs
    p_last, p_before = persists[-1], persists[-2]
    closes = p_last is not None and (p_last[0] == "fdatasync" or p_last[0] == "fsync" and p_last[1] in touched)
    # Persisted right before the last op: what it then acts on, or what the op before acted on
    # (a file or directory the file system has just logged, then changed again).
    primed = p_before is not None and p_before[0] == "fsync" and p_before[1] in touched | prev.objects | prev.dirs
    return 4 * (not closes) + 2 * (not (last.namespace or last.meta)) + (not primed)


def _persist_class(p: Persist, ref: Core) -> str:
    if p is None or p[0] != "fsync":
        return p[0] if p else "none"
    return "obj" if p[1] in ref.objects else "dir" if p[1] in ref.dirs else "other"


def _receiving(core: Core, st: State) -> frozenset[int]:
    """The directories whose entries CORE changes (in ST, before it): the one that gets the
    new name (link, linkat, creat, mkdir, symlink), both of a rename, the one losing a
    name (unlink, rmdir). Empty for data ops."""
    op = core.ops[-1]
    keys = ("from", "to") if op["op"] == "rename" else ("to",) if "to" in op else ("path",)
    if not core.namespace:
        return frozenset()
    return frozenset(o for o in (st.names.get(_parent(op[k])) for k in keys if k in op) if o is not None)


def _closeness(chain: list[Core], states: list[State], persists: tuple[Persist, ...]) -> int:
    """Within a shape class, first: after a namespace op, an fsync of a directory whose
    entries it changed (the one that got the new name, both of a rename) before one of
    any other directory (what applications fsync to make a new name durable, and what
    the file system's log must then carry: generic/788's link into a directory, 779's
    rename out of one); then the last two persistence points on the same object, and
    the last on the object itself or on the directory holding its name (not a further
    ancestor)."""
    p_last, p_before = persists[-1], persists[-2]
    last = chain[-1]
    other_dir = p_last is not None and p_last[0] == "fsync" and p_last[1] in last.dirs \
        and p_last[1] not in last.objects and p_last[1] not in _receiving(last, states[-2])
    return 3 * other_dir + (p_before != p_last) + (p_last is None or p_last[1] not in _near(last, states[-2]))


def _core_class(core: Core, st: State) -> str:
    """The op kind with the kind of what it acts on (rename of a directory, of a symlink...)."""
    kind = core.name.split("(")[0]
    if kind in ("rename", "exchange", "link", "unlink"):
        op = core.ops[-1]
        kind += "-" + st.kind[st.names[op.get("from", op.get("path", ""))]]
    return kind


@dataclass(frozen=True)
class Space:
    """The ordered workloads of one sequence length: CHAINS of core ops with their states,
    and ORDER, the (chain, persistence points) of each workload index."""

    seq: int
    chains: tuple[tuple[tuple[Core, ...], tuple[State, ...]], ...]
    order: tuple[tuple[int, tuple[Persist, ...]], ...]
    tiers: dict[int, int] = field(default_factory=dict)

    def steps(self, index: int) -> tuple[list[Core], list[State], tuple[Persist, ...]]:
        c, persists = self.order[index]
        chain, states = self.chains[c]
        return list(chain), list(states), persists


def _chains(seq: int, states: list[State], chain: list[Core]) -> Iterator[tuple[list[Core], list[State]]]:
    """Chains of core ops that succeed, each related to the one before (seq-3: namespace ops after
    the first, no exchange: ACE's seq-3 metadata space)."""
    if len(chain) == seq:
        yield chain, states
        return
    for c in cores(states[-1]):
        if chain and not related(chain[-1], c):
            continue
        if seq >= 3 and chain and (not c.namespace or c.name.startswith("exchange")):
            continue
        yield from _chains(seq, states + [apply(states[-1], c)], chain + [c])


@functools.lru_cache(maxsize=2)
def space(seq: int) -> Space:
    """Every workload of the seq-SEQ space (2 or 3), likely shapes first: by tier, then
    round-robin over shape classes (op kinds, what they act on, what is persisted), so the
    first workloads of a tier are all of different shapes; within a class by a fixed hash."""
    chains = []
    keyed: list[tuple[int, str, int, int, int, tuple[Persist, ...]]] = []
    # Chains with the many-xattrs op are numbered after the others: a chain's number seeds
    # the hash that orders a shape class, so the older workloads keep their order.
    for chain, states in sorted(_chains(seq, [start_state()], []),
                                key=lambda cs: any(c.name.startswith("xattrs(") for c in cs[0])):
        c = len(chains)
        chains.append((tuple(chain), tuple(states)))
        options = [persist_options(seq, chain, states, k) for k in range(seq)]
        classes = [_core_class(core, states[k]) for k, core in enumerate(chain)]
        for persists in itertools.product(*options):
            refs = [chain[min(k + 1, seq - 1)] if k < seq - 1 else chain[k] for k in range(seq)]
            shape = "|".join(f"{classes[k]}.{_persist_class(p, refs[k])}" for k, p in enumerate(persists))
            h = zlib.crc32(f"{c}:{persists}".encode())
            keyed.append((_tier(chain, persists), shape, _closeness(chain, states, persists), h, c, persists))
    keyed.sort(key=lambda t: t[:4])
    ranked = []
    rank, prev = 0, None
    for tier, shape, _, _, c, persists in keyed:
        rank = rank + 1 if (tier, shape) == prev else 0
        prev = (tier, shape)
        weak = not _strong(chains[c][0][-2], chains[c][0][-1]) or "exchange" in shape
        ranked.append((tier, rank, weak, zlib.crc32(shape.encode()), c, persists))
    ranked.sort(key=lambda t: t[:4])
    tiers: dict[int, int] = {}
    for t in ranked:
        tiers[t[0]] = tiers.get(t[0], 0) + 1
    return Space(seq, tuple(chains), tuple((c, p) for *_, c, p in ranked), tiers)


def space_size(seq: int) -> int:
    return len(space(seq).order)


def describe(seq: int, index: int) -> str:
    chain, states, persists = space(seq).steps(index)
    return "; ".join(f"{c.name} {_persist_label(p, states[k + 1])}" for k, (c, p) in enumerate(zip(chain, persists)))


def _persist_label(p: Persist, st: State) -> str:
    if p is None or p[0] == "sync":
        return p[0] if p else "-"
    return f"{p[0]}({st.path_of(p[1]) or 'unlinked'})"


def workload(seq: int, index: int) -> dict[str, Any]:
    """Workload INDEX (0-based, likeliest first) of the seq-SEQ space."""
    chain, states, persists = space(seq).steps(index)
    created = {o for c in chain if c.new for o in c.objects}
    files = sorted({o for c in chain for o in c.objects} | {p[1] for p in persists if p and p[0] != "sync"})
    ops: list[dict[str, Any]] = list(SETUP)
    s0 = states[0]
    steps = [[dict(op) for op in core.ops] + _persist_ops(p, states[k + 1], k)
             for k, (core, p) in enumerate(zip(chain, persists))]
    # A file given many xattrs is set by path: it has an fd only while a step uses one, so
    # its last name going frees it (the file system's background work) during the workload.
    by_path = {o: [k for k, step in enumerate(steps) if any(op.get("fd") == f"F{o}" for op in step)]
               for c in chain if c.name.startswith("xattrs(") for o in c.objects}
    opened = [o for o in files if o not in created and s0.kind.get(o) == "file" and by_path.get(o) != []]
    ops += [{"op": "open", "path": s0.path_of(o), "flags": ["O_RDWR"], "fd": f"F{o}"} for o in opened]
    for k, step in enumerate(steps):
        ops += step
        ops += [{"op": "close", "fd": f"F{o}"} for o, uses in by_path.items() if uses and uses[-1] == k]
    fds = [o for o in opened if o not in by_path]
    fds += [o for o in sorted(created) if any(op.get("fd") == f"F{o}" for c in chain for op in c.ops)]
    ops += [{"op": "close", "fd": f"F{o}"} for o in fds]
    if any(states[-1].path_of(o) is None for o in by_path):
        ops += _tail()
    doc = workload_doc(ops, name=f"ace{seq}-{index}")
    doc["description"] = f"ACE-style seq-{seq} workload #{index} of {space_size(seq)}: {describe(seq, index)}"
    return doc


def _tail() -> list[dict[str, Any]]:
    """After a file the workload holds no fd on lost its last name: an application's log,
    written and fsynced TAIL_FSYNCS times while the file system frees that file in the
    background (xfs inactivates unlinked inodes in inodegc workers, a transaction per attr
    tree block: log forces between them are what a crash can then cut)."""
    return [{"op": "open", "path": TAIL_FILE, "flags": ["O_CREAT", "O_RDWR"], "fd": "W"},
            {"op": "repeat", "count": TAIL_FSYNCS, "ops": [{"op": "pwrite", "fd": "W", "offset": 0, "length": 4096},
                                                           {"op": "fsync", "fd": "W"}]},
            {"op": "close", "fd": "W"}]


def _persist_ops(p: Persist, st: State, k: int) -> list[dict[str, Any]]:
    if p is None:
        return []
    if p[0] == "sync":
        return [{"op": "sync"}]
    if st.kind[p[1]] == "file":
        return [{"op": p[0], "fd": f"F{p[1]}"}]
    d = f"d{k}"
    return [{"op": "open", "path": st.path_of(p[1]), "flags": ["O_RDONLY"], "fd": d},
            {"op": "fsync", "fd": d}, {"op": "close", "fd": d}]

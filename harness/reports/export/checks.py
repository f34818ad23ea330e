"""What both exports check after the power cut: the facts the oracle judged.

From a finding's evidence (the path, the rule, the op whose promise broke)
and the model of the exported ops (model.py), each check is a shell
command printing one fact about the recovered file system (a name's kind,
a size, a link count, the bytes of a range, xattr names) and the values a
correct kernel may show: the fact in one of the states from the op that
made it durable to the last op that returned. The fstests export prints
the fact (the golden .out holds the expected value); the shell export
compares it and says REPRODUCED when one differs.

Mount and fsck findings have no check of their own: the recovery mount
and fsck judge them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from harness.reports.export.finding import ExportInput
from harness.reports.export.model import State, states_of

SECTOR = 4096
MAX_BYTES = 1 << 20          # larger ranges: the sector the finding names only
_OP_SEQ = re.compile(r"\[op (\d+)[ ,]")   # the oracle's op description: "fsync(fd=0) [op 4, thread 0]"

# Shell helpers both exports define (bash and busybox sh alike): a name's kind,
# a byte range as runs ("4096x61 512x00": count x hex byte), the distinct bytes
# of a range checked against a list, the user xattr names.
_HELPERS = r"""file_kind() {
	if [ -L "$1" ]; then echo symlink; elif [ -d "$1" ]; then echo dir
	elif [ -f "$1" ]; then echo file; elif [ -e "$1" ]; then echo other; else echo absent; fi
}
byte_runs() {
	od -A n -v -t x1 "$@" 2>/dev/null | tr -s ' ' '\n' | grep -v '^$' | uniq -c | \
		awk '{ printf "%s%sx%s", sep, $1, $2; sep = " " } END { if (!NR) printf "(none)"; print "" }'
}
bytes_within() {
	local allowed="$1" bad=""
	shift
	for b in $(od -A n -v -t x1 "$@" 2>/dev/null | tr -s ' ' '\n' | grep -v '^$' | sort -u); do
		case " $allowed " in *" $b "*) ;; *) bad="$bad $b";; esac
	done
	if [ -z "$bad" ]; then echo yes; else echo "no:$bad"; fi
}
xattr_names() {
	${GETFATTR_PROG:-getfattr} --absolute-names -m '^user\.' "$1" 2>/dev/null | grep '^user\.' | sort | tr '\n' ' '
	echo
}
"""


def helpers(checks: list["Check"]) -> str:
    """The shell functions CHECKS call, defined once each."""
    out = []
    for block in _HELPERS.split("\n}\n"):
        name = block.strip().split("(")[0]
        if name and any(name in c.cmd for c in checks):
            out.append(block.strip("\n") + "\n}\n")
    return "".join(out)


@dataclass
class Check:
    label: str               # "foo: kind"
    cmd: str                 # shell printing the fact; paths under the mount variable given to build()
    allowed: list[str]       # what a correct kernel may print, most recent state first
    why: str                 # the promise, for the test's comment

    def golden(self) -> str:
        """The line a correct kernel's test prints (fstests' golden output)."""
        return f"{self.label}: {self.allowed[0]}" if len(self.allowed) == 1 else f"{self.label}: {self.summary()}"

    def summary(self) -> str:
        if all(len(v) <= 40 for v in self.allowed):
            return "one of " + ", ".join(repr(v) for v in self.allowed)
        return f"one of the {len(self.allowed)} states the ops allow"


def runs(data: bytes) -> str:
    """byte_runs' output for DATA."""
    out: list[str] = []
    i = 0
    while i < len(data):
        j = i
        while j < len(data) and data[j] == data[i]:
            j += 1
        out.append(f"{j - i}x{data[i]:02x}")
        i = j
    return " ".join(out) or "(none)"


def _seq(described: str | None) -> int | None:
    m = _OP_SEQ.search(described or "")
    return int(m[1]) if m else None


def _distinct(values: list[str]) -> list[str]:
    return list(dict.fromkeys(reversed(values)))


class _Builder:
    def __init__(self, x: ExportInput, mnt: str) -> None:
        self.x = x
        self.mnt = mnt
        self.states = states_of(x.ops)
        self.n = len(x.ops)
        ev = x.evidence
        self.path: str = str(ev.get("path") or "")
        seq = _seq(ev.get("op"))
        # the op whose promise broke, as an index into the exported ops (None: no such op here)
        self.op = x.seqs.index(seq) if seq is not None and seq in x.seqs else None

    def at(self, path: str) -> str:
        return f"{self.mnt}/{shlex.quote(path)}"

    def since(self, first: int) -> list[State]:
        return self.states[max(0, first):self.n + 1]

    def floor(self) -> int:
        """The first state a correct kernel may show: the one right after the promising op."""
        return self.op + 1 if self.op is not None else 0

    def kind(self, path: str, states: list[State], why: str) -> Check:
        return Check(path, f"file_kind {self.at(path)}", _distinct([s.kind(path) for s in states]), why)

    def kinds(self, paths: list[str], states: list[State], why: str) -> Check:
        cmd = "echo " + " ".join(f'"$(file_kind {self.at(p)})"' for p in paths)
        vals = [" ".join(s.kind(p) for p in paths) for s in states]
        return Check(" ".join(paths), cmd, _distinct(vals), why)

    def size(self, path: str, states: list[State], why: str) -> Check | None:
        if any(i is not None and not i.exact for s in states for i in [s.inode(path)]):
            return None
        vals = [str(len(i.data)) if (i := s.inode(path)) and i.kind == "file" else "" for s in states]
        return Check(f"{path} size", f"stat -c %s {self.at(path)} 2>/dev/null", _distinct(vals), why)

    def bytes_at(self, path: str, start: int, length: int, states: list[State], why: str) -> Check | None:
        vals = []
        for s in states:
            ino = s.inode(path)
            if ino is not None and (ino.kind != "file" or not ino.exact):
                return None  # the model cannot say which bytes a correct kernel shows there
            vals.append(runs(bytes(ino.data[start:start + length])) if ino else runs(b""))  # absent: od reads nothing
        cmd = f"byte_runs -j {start} -N {length} {self.at(path)}"
        return Check(f"{path} bytes {start}..{start + length}", cmd, _distinct(vals), why)

    def within(self, path: str, start: int, length: int | None, allowed: set[int], why: str) -> Check:
        vals = " ".join(f"{b:02x}" for b in sorted(allowed))
        n = f" -N {length}" if length is not None else ""
        end = f"{start + length}" if length is not None else "EOF"
        return Check(f"{path} bytes {start}..{end} hold only zeros or bytes written there",
                     f'bytes_within "{vals}" -j {start}{n} {self.at(path)}', ["yes"], why)

    def written(self, path: str) -> set[int]:
        return {0} | {b for s in self.states for i in [s.inode(path)] if i is not None for b in i.writers}


def build(x: ExportInput, mnt: str) -> tuple[list[Check], list[str]]:
    """The checks for X's finding with paths under the shell variable MNT, and
    what the export cannot check (for the test's comment)."""
    b = _Builder(x, mnt)
    ev = x.evidence
    rule, found, expected = str(ev.get("rule") or ""), str(ev.get("found") or ""), str(ev.get("expected") or "")
    op_text = re.sub(r" \[op .*\]$", "", str(ev.get("op") or ""))
    promise = f"{op_text} made it durable" if op_text else "the ops never made it so"
    path = b.path
    if x.kind in ("mount", "fsck", "kernel", "design", "latency", "semantics"):
        return [], []
    if x.kind == "corruption":
        return [Check("every file reads back", f"find {mnt} -type f -exec cat {{}} + >/dev/null 2>&1 && echo yes",
                      ["yes"], "a recovered file system reads without I/O errors")], []
    if not path:
        return [], [f"the finding names no path: nothing but the mount and fsck is checked ({x.detail})"]
    if rule == "rename-atomic" and b.op is not None:
        op = x.ops[b.op]
        return [b.kinds([op["from"], op["to"]], b.since(b.op),
                        f"{op_text} leaves the file at its old or its new name, never at neither")], []
    if rule == "ordered-metadata":
        m = re.fullmatch(r"(.*) (\S+), (.*) (\S+)", found)
        paths = [path] + ([m[3]] if m and m[3] != path else [])
        return [b.kinds(paths, b.since(0), "the names after a power cut are those after some prefix of the "
                        "namespace ops (ext4 and xfs journal them in order)")], []
    if rule == "untorn-write" and "range" in ev:
        s, e = ev["range"]
        c = b.bytes_at(path, s, e - s, b.since(0), f"{op_text} is all there or not at all (RWF_ATOMIC)")
        return ([c], []) if c else ([], [f"the bytes of {path} are shifted by collapse/insert: not checked"])
    if x.kind == "stale-data" and not ev.get("op"):
        if "offset" in ev:
            off = int(ev["offset"])
            return [b.within(path, off - off % SECTOR, SECTOR, b.written(path),
                             "a file never shows bytes no op wrote there")], []
        if expected.startswith("size <="):
            hi = int(expected.split()[-1])
            return [b.within(path, hi, None, {0}, f"{path} was never longer than {hi} bytes")], []
        if "symlink" in x.detail:
            targets = _distinct([i.target for s in b.since(0) if (i := s.inode(path)) and i.kind == "symlink"])
            return [Check(f"{path} target", f"readlink {b.at(path)}", targets or [""],
                          "a symlink points only where symlink(2) pointed it")], []
        return [b.kind(path, b.since(0), "no name appears that no op made")], []
    # durability, stale data under a guarantee and the remaining atomicity findings:
    # the state the promising op made, or a later one
    states = b.since(b.floor())
    if expected in ("present", "absent") or found == "missing" or found.startswith("a "):
        stays = f"after {op_text} returned, {path} is {expected or 'as it made it'} for good" if op_text else promise
        return [b.kind(path, states, stays)], []
    if found.startswith("size ") or "offset" in ev:
        off = int(ev.get("offset", 0))
        data = [b.size(path, states, promise)] + \
            ([b.bytes_at(path, off - off % SECTOR, SECTOR, states, promise)] if "offset" in ev else [])
        checks = [c for c in data if c is not None]
        return checks, [] if checks else [f"{path}: the model cannot follow its bytes (collapse/insert, "
                                          "unaligned O_DIRECT): only the mount and fsck judge"]
    if "link count" in x.detail:
        vals = _distinct([str(s.nlink(path)) if s.inode(path) else "" for s in states])
        return [Check(f"{path} link count", f"stat -c %h {b.at(path)} 2>/dev/null", vals, promise)], []
    if "xattr" in x.detail:
        vals = _distinct([" ".join(sorted(i.xattrs)) + " " if (i := s.inode(path)) and i.xattrs else ""
                          for s in states])
        return [Check(f"{path} user xattrs", f"xattr_names {b.at(path)}", vals, promise)], []
    if "allocated" in expected:
        want = int(expected.split()[2])
        cmd = (f"[ $(( $(stat -c %b {b.at(path)}) * 512 )) -ge {want} ] && echo yes || "
               f"echo \"no: $(( $(stat -c %b {b.at(path)}) * 512 ))\"")
        return [Check(f"{path} has at least {want} bytes allocated", cmd, ["yes"], promise)], []
    return [b.kind(path, states, promise)], [f"only the kind of {path} is checked ({x.detail})"]

"""The C executor and the Python plan agree on every op's line: the real pc-exec
parses each kind with exactly the fields and flag names Python writes.

Both take them from the schema's x-plan (workloads/plan_schema.py; `make`
generates the executor's tables from it): this runs the built program, so a
stale or hand-edited table, or a field plan.c decodes under another name,
fails here naming the kind.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common import EXEC, require_exec
from workloads.plan import PLAN_FIELDS, PLAN_SPECS

pytestmark = require_exec

HEAD = "powercut-plan 1\nworkload wid=1 name=x\nbarrier index=0 parties=2 name=b\n" \
       "thread index=0 name=t policy=other priority=0 nice=0 cpu=-1 fds=2\n"
# A value each field accepts (a pwritev2's iov adds up to its length).
VALUES = {"path": "a", "from": "a", "to": "b", "target": "a", "name": "user.a", "mode": "0644",
          "iov": "1", "length": "1", "count": "1", "fd": "1", "from_fd": "0", "file": "1"}
# The line the parser wants after a complete op (after a repeat: its body or endrepeat).
PARSED = ("'op' or 'endthread' expected, found 'bogus'", "'op' or 'endrepeat' expected, found 'bogus'")


def line(kind: str, fields: dict[str, str]) -> str:
    return " ".join([f"op seq=0 kind={kind}", *(f"{k}={v}" for k, v in fields.items())])


def fields_of(kind: str) -> dict[str, str]:
    spec = PLAN_SPECS[kind]
    return {f: "|".join(spec.flag_names) if f == "flags" and spec.flags_from else VALUES.get(f, "0")
            for f in PLAN_FIELDS[kind]}


def parse_error(tmp_path: Path, op_line: str) -> str:
    """The one line pc-exec says about HEAD + OP_LINE + a line 'bogus'."""
    (tmp_path / "plan").write_text(HEAD + op_line + "\nbogus\n")
    p = subprocess.run([str(EXEC), "--plan", str(tmp_path / "plan"), "--dir", str(tmp_path), "--out",
                        str(tmp_path / "rec")], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    return p.stderr.strip()


@pytest.mark.parametrize("kind", PLAN_FIELDS)
def test_the_executor_parses_the_line_python_writes(tmp_path: Path, kind: str) -> None:
    # Every flag name at once: an unknown one would stop the parse before 'bogus'.
    err = parse_error(tmp_path, line(kind, fields_of(kind)))
    assert err.endswith(PARSED), err


@pytest.mark.parametrize("kind", PLAN_FIELDS)
def test_the_executor_needs_every_field_and_refuses_others(tmp_path: Path, kind: str) -> None:
    full = fields_of(kind)
    for f in full:
        err = parse_error(tmp_path, line(kind, {k: v for k, v in full.items() if k != f}))
        assert err.endswith(f"field '{f}' missing"), (kind, f, err)
    err = parse_error(tmp_path, line(kind, {**full, "extra": "0"}))
    assert err.endswith(f"field 'extra' does not belong to a {kind} op"), err


def test_a_flag_name_python_lacks_is_refused(tmp_path: Path) -> None:
    # The flag tables are the schema's names, no more: one it does not list is an error.
    err = parse_error(tmp_path, line("rename", {**fields_of("rename"), "flags": "NOREPLACE|BOGUS"}))
    assert err.endswith("flags: unknown flag 'BOGUS'"), err

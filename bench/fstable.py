"""The oracle against fstests' own power-fail verdicts (docs/semantics.md).

Each row of bench/fstests_powerfail/ is one fstests power-fail test (dm-flakey
or dm-log-writes) written as a powercut workload, with the outcome its golden
output rules out, as edits made through the real file system on the
recovered image ("plant"). Per row and file system:

1. `powercut run WORKLOAD` on this host's kernel (fuse backend, every crash
   state of the default walk): a healthy kernel must give 0 findings;
2. `powercut crash-image` of the last state (the test's power cut: its
   workload ends where the test drops writes);
3. the image mounted, the planted edits applied, unmounted;
4. `powercut recheck RUN --state LAST --image IMG`: exit 1 is "flagged".

Rows whose ops powercut's workload format cannot express, or whose promise
is no content rule (only a clean recovery mount and fsck), carry no plant and
a written reason instead; they are listed, not run. The data is fstests'
sequences: it lives here, outside corpus/ and away from every generator
(tests/test_fstable.py checks that none of them reads it).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from foundation import kmount
from foundation.errors import PowercutError, UsageError
from foundation.jsondoc import write_json
from foundation.kmount import MountError
from foundation.loopdev import recorded_loop
from foundation.runstate import RunState
from foundation.sparse import punch_hole
from harness.backends.calibrate import mount_point
from workloads.format import parse_workload
from workloads.pattern import generate
from workloads.plan import build_plan

TABLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fstests_powerfail")
ROW_FORMAT = "powercut-fstests-row/1"
PLANT_OPS = {"rm": 1, "touch": 1, "mkdir": 1, "link": 2, "mv": 2, "truncate": 2, "zero": 3, "junk": 3,
             "punch": 3, "symlink": 2, "rmxattr": 2, "setxattr": 3, "old": 4}


@dataclass(frozen=True)
class Row:
    id: str                       # file name without .json, e.g. generic-322 or generic-322-b
    test: str                     # fstests test, e.g. generic/322
    fs: list[str]
    promise: str                  # what the golden output requires, our words
    outcome: str                  # the buggy outcome planted
    workload: dict[str, Any] | None
    plant: list[list[Any]] = field(default_factory=list)
    mkfs_opts: dict[str, str] = field(default_factory=dict)
    reason: str = ""              # why no plant is run (inexpressible ops, fsck-only promise)
    missed: dict[str, str] = field(default_factory=dict)  # fs -> why the oracle does not flag it there
    note: str = ""                # the rule that flags it, or why a miss is the fs's own exception

    @property
    def runnable(self) -> bool:
        """Has a workload: its healthy run counts (a row without a plant is only that)."""
        return self.workload is not None


def load_row(path: str) -> Row:
    with open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}: not JSON ({e})") from None
    if doc.get("format") != ROW_FORMAT:
        raise UsageError(f"{path}: format must be {ROW_FORMAT}")
    for key in ("test", "fs", "promise", "outcome"):
        if key not in doc:
            raise UsageError(f"{path}: missing {key!r}")
    for step in doc.get("plant", []):
        if not step or step[0] not in PLANT_OPS or len(step) != PLANT_OPS[step[0]] + 1:
            raise UsageError(f"{path}: bad plant step {step!r}")
    if (doc.get("workload") is None or not doc.get("plant")) and not doc.get("reason"):
        raise UsageError(f"{path}: a row without a workload or a plant needs a reason")
    if doc.get("workload") is not None:
        try:
            parse_workload(doc["workload"])
        except UsageError as e:
            raise UsageError(f"{path}: {e}") from None
    return Row(os.path.basename(path)[:-5], doc["test"], doc["fs"], doc["promise"], doc["outcome"],
               doc.get("workload"), doc.get("plant", []), doc.get("mkfs_opts", {}), doc.get("reason", ""),
               doc.get("missed", {}), doc.get("note", ""))


def load_table(root: str = TABLE_DIR, only: str = "") -> list[Row]:
    rows = [load_row(p) for p in sorted(glob.glob(os.path.join(root, "*.json")))]
    if only:
        pats = [p.strip() for p in only.split(",") if p.strip()]
        rows = [r for r in rows if any(fnmatch.fnmatchcase(r.id, p) for p in pats)]
        if not rows:
            raise UsageError(f"fstests table: no row matches {only!r}")
    return rows


def old_bytes(workload: dict[str, Any], op_id: str, offset: int, length: int) -> bytes:
    """What the write with id OP_ID put at OFFSET (its first iteration): an older write's data."""
    plan = build_plan(parse_workload(workload))
    for _, op in plan.ops():
        if op.id == op_id:
            return generate(plan.wid, int(op.fields["file"]), op.seq, 0, offset, length)
    raise UsageError(f"no write with id {op_id!r}")


def _plant(mnt: str, steps: list[list[Any]], workload: dict[str, Any]) -> None:
    """The buggy outcome, made through the mounted file system (the unmount writes it back)."""
    def p(rel: str) -> str:
        return os.path.join(mnt, rel)
    for op, *a in steps:
        if op == "rm":
            if os.path.isdir(p(a[0])) and not os.path.islink(p(a[0])):
                shutil.rmtree(p(a[0]))
            else:
                os.unlink(p(a[0]))
        elif op == "touch":
            open(p(a[0]), "a").close()
        elif op == "mkdir":
            os.mkdir(p(a[0]))
        elif op == "link":
            os.link(p(a[0]), p(a[1]))
        elif op == "mv":
            os.rename(p(a[0]), p(a[1]))
        elif op == "truncate":
            os.truncate(p(a[0]), a[1])
        elif op in ("zero", "junk", "old"):
            data = old_bytes(workload, a[1], a[2], a[3]) if op == "old" else \
                (b"\0" if op == "zero" else b"\x5a") * a[2]
            with open(p(a[0]), "r+b") as f:
                f.seek(a[2] if op == "old" else a[1])
                f.write(data)
        elif op == "punch":
            fd = os.open(p(a[0]), os.O_RDWR)
            try:
                punch_hole(fd, a[1], a[2])
            finally:
                os.close(fd)
        elif op == "symlink":  # replace the link at a[1] by one to a[0]
            os.unlink(p(a[1]))
            os.symlink(a[0], p(a[1]))
        elif op == "rmxattr":
            os.removexattr(p(a[0]), a[1])
        elif op == "setxattr":
            os.setxattr(p(a[0]), a[1], a[2].encode())


def _plant_image(img: str, fs: str, row: Row) -> None:
    """IMG on a loop device, mounted, planted, unmounted: each written into a run state's journal
    first, so a killed run leaves nothing `powercut cleanup` does not know of."""
    state = RunState.create("fstests table plant")
    try:
        with recorded_loop(state, img) as loop, mount_point(state, "mnt") as mnt:
            kmount.mount(loop.path, mnt, fs)
            _plant(mnt, row.plant, row.workload)
    finally:
        state.teardown_or_warn()


def _pc(*args: str, env: dict[str, str] | None = None, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _findings(text: str) -> list[str]:
    """The finding lines of a run's or a recheck's output (`[kind] ...`, at most 5, cut short)."""
    return [ln.strip()[:240] for ln in text.splitlines() if re.match(r"\s+\[[a-z-]+\] ", ln)][:5]


def run_row(row: Row, fs: str, work: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Healthy run, planted image, recheck: one row on one file system (ENV: powercut's environment)."""
    res: dict[str, Any] = {"row": row.id, "test": row.test, "fs": fs}
    os.makedirs(work, exist_ok=True)
    wl = os.path.join(work, "workload.json")
    with open(wl, "w") as f:
        json.dump(row.workload, f)
    run_dir = os.path.join(work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["run", wl, "--fs", fs, "--out", run_dir]
    if row.mkfs_opts.get(fs):
        args += ["--mkfs-opts", row.mkfs_opts[fs]]
    p = _pc(*args, env=env)
    res["healthy_rc"] = p.returncode
    res["healthy_findings"] = _findings(p.stdout) if p.returncode == 1 else []
    if p.returncode not in (0, 1):
        res["error"] = f"run: exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
        return res
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    res["states"] = report.get("crash_states_checked")
    if not row.plant:  # a mount-and-fsck promise: the healthy walk is the whole check
        res["flagged"] = None
        return res
    last = f"p{report['log_entries'] - 1}"
    img = os.path.join(work, "planted.img")
    p = _pc("crash-image", "--log", os.path.join(run_dir, "recording.log"), "--state", last,
            "--size", str(report["device_bytes"]), "--out", img, env=env)
    if p.returncode != 0:
        res["error"] = f"crash-image: exit {p.returncode}: {p.stderr.strip()[-200:]}"
        return res
    try:
        _plant_image(img, fs, row)
    except (OSError, PowercutError, MountError) as e:
        res["error"] = f"plant: {e}"
        return res
    p = _pc("recheck", run_dir, "--state", last, "--image", img, env=env)
    os.unlink(img)
    with open(os.path.join(work, "recheck.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    res["recheck_rc"] = p.returncode
    res["flagged"] = p.returncode == 1
    res["recheck_findings"] = _findings(p.stdout)
    if p.returncode not in (0, 1):
        res["error"] = f"recheck: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-200:]}"
    return res


def rules_named(findings: list[str]) -> list[str]:
    """The oracle rules a finding's message ends with (its promise text, cut short by the summary)."""
    from checkers.fsrules import RULES
    names = []
    for f in findings:
        for r in RULES.values():
            if r.promise[:30] in f and r.name not in names:
                names.append(r.name)
    kinds = [m.group(1) for f in findings if (m := re.match(r"\[([a-z-]+)\]", f))]
    return names or sorted(set(kinds))


def render_md(rows: list[Row], results: list[dict[str, Any]]) -> str:
    """The docs table: one line per row and file system."""
    by = {(r["row"], r["fs"]): r for r in results}
    out = ["| fstests test | fs | promise (golden output) | planted outcome | healthy run | flagged | rule / reason |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        for fs in row.fs:
            r = by.get((row.id, fs))
            if r is None:
                continue
            if "not_run" in r:
                out.append(f"| {row.test} | {fs} | {row.promise} | - | not run | - | {row.reason} |")
                continue
            if "error" in r:
                out.append(f"| {row.test} | {fs} | {row.promise} | {row.outcome} | error | - | {r['error']} |")
                continue
            healthy = "0 findings" if r["healthy_rc"] == 0 else "FINDINGS"
            if r["flagged"] is None:
                verdict, why = "fsck only", row.reason
            elif r["flagged"]:
                verdict, why = "yes", ", ".join(f"`{n}`" for n in rules_named(r["recheck_findings"]))
            else:
                verdict, why = "**no**", row.missed.get(fs, "(unexplained)")
            if row.note and r["flagged"]:
                why += f"; {row.note}"
            out.append(f"| {row.test} | {fs} | {row.promise} | {row.outcome} | {healthy} | {verdict} | {why} |")
    return "\n".join(out) + "\n"


def run_table(rows: list[Row], out: str, fs_only: str = "", resume: bool = False) -> dict[str, Any]:
    """Every row on each of its file systems; RESUME: keep a row's saved result (OUT/ROW-FS/result.json)."""
    results = []
    for row in rows:
        for fs in row.fs:
            if fs_only and fs not in fs_only.split(","):
                continue
            if not row.runnable:
                results.append({"row": row.id, "test": row.test, "fs": fs, "not_run": row.reason})
                continue
            work = os.path.join(out, f"{row.id}-{fs}")
            saved = os.path.join(work, "result.json")
            if resume and os.path.exists(saved):
                with open(saved) as f:
                    r = json.load(f)
            else:
                r = run_row(row, fs, work)
                write_json(saved, r)  # whole or absent: --resume trusts what it finds
                print(line(r), flush=True)
            r["expect"] = "missed" if fs in row.missed else "flagged"
            results.append(r)
    doc = {"rows": results, "summary": summary(results)}
    write_json(os.path.join(out, "results.json"), doc, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(render_md(rows, results))
    return doc


def line(r: dict[str, Any]) -> str:
    if "not_run" in r:
        return f"{r['row']:<22} {r['fs']:<6} not run: {r['not_run'][:60]}"
    if "error" in r:
        return f"{r['row']:<22} {r['fs']:<6} ERROR {r['error']}"
    verdict = {True: "flagged", False: "MISSED", None: "fsck-only"}[r["flagged"]]
    healthy = "clean" if r["healthy_rc"] == 0 else f"HEALTHY FINDINGS {r['healthy_findings'][:1]}"
    found = [f[:90] for f in r.get("recheck_findings", [])[:1]]
    return f"{r['row']:<22} {r['fs']:<6} {verdict:<8} {healthy} {found}"


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    run = [r for r in results if "not_run" not in r and "error" not in r]
    planted = [r for r in run if r["flagged"] is not None]
    return {"listed": len(results), "run": len(run), "planted": len(planted),
            "flagged": sum(r["flagged"] for r in planted),
            "missed": sum(not r["flagged"] for r in planted),
            "missed_unexplained": sum(not r["flagged"] and r["expect"] != "missed" for r in planted),
            "healthy_clean": sum(r["healthy_rc"] == 0 for r in run),
            "errors": sum("error" in r for r in results),
            "not_run": sum("not_run" in r for r in results)}


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bench.fstable", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="", help="row ids (glob), comma-separated; default all")
    ap.add_argument("--fs", default="", help="only these file systems, comma-separated")
    ap.add_argument("--out", default="out/fstests-table")
    ap.add_argument("--resume", action="store_true", help="keep the results saved in OUT by an earlier run")
    a = ap.parse_args(argv)
    try:
        rows = load_table(only=a.rows)
    except UsageError as e:
        print(f"powercut: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    doc = run_table(rows, a.out, a.fs, a.resume)
    s = doc["summary"]
    print(json.dumps(s))
    bad = s["missed_unexplained"] or s["errors"] or s["healthy_clean"] != s["run"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

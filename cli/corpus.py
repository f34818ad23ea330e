"""`powercut corpus run|list|promote`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from checkers.fsrules import TIERS
from foundation.jsondoc import write_json
from cli.options import add_backend_options, add_semantics_option, backend_values, recovery_values
from foundation import internal_error, ownership
from harness.corpus.entries import CORPUS_DIR, VERDICT_KINDS, Row, entry_doc, load_corpus, load_matrix
from harness.corpus.diff import diff, markdown as corpus_markdown_diff
from harness.corpus.report import junit, markdown
from harness.backends import configure
from cli.run import add_recovery_args
from harness.corpus.run import CorpusOptions, compare_baseline, host_cannot_run, load_results, results_doc, run_cases
from foundation.errors import UsageError

DEFAULT_MATRIX = CORPUS_DIR / "matrix.json"


def _rows(args: argparse.Namespace) -> list[Row]:
    rows = load_matrix(args.matrix)
    if args.fs:
        rows = [r for r in rows if r.fs in args.fs.split(",")]
    if args.rows:
        wanted = args.rows.split(",")
        rows = [r for r in rows if r.name in wanted]
    if args.runnable:
        why = {r.name: host_cannot_run(r) for r in rows}
        for name, reason in why.items():
            if reason:
                print(f"powercut corpus: skipping row {name}: {reason}", file=sys.stderr)
        rows = [r for r in rows if not why[r.name]]
    if not rows:
        raise UsageError("no matrix row left after --fs/--rows" + (" and --runnable" if args.runnable else ""))
    return rows


def cmd_run(args: argparse.Namespace) -> int:
    entries = load_corpus(args.corpus, args.entries)
    if not entries:
        raise UsageError(f"no corpus entry matches {args.entries!r} in {args.corpus}")
    rows = _rows(args)
    values = backend_values(args)
    tools = values.pop("tools", None)
    # auto is resolved once: every case, and results.json, name the backend that recorded.
    backend = configure(values.pop("backend"), {k: v or None for k, v in values.items()})
    if args.semantics not in TIERS:
        raise UsageError(f"--semantics {args.semantics}: choose {' or '.join(TIERS)}")
    options = CorpusOptions(backend, recovery_values(args), args.semantics, tools)
    backend.engine.require()
    baseline = load_results(args.baseline) if args.baseline else None
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be at least 1")
    out = ownership.make_dir(args.out or os.path.join("out", time.strftime("corpus-%Y%m%d-%H%M%S")))
    internal_error.note_output_dir(out)
    started = time.time()
    cases = []
    todo = [(e, r) for r in rows for e in entries if e.applies(r)]
    for i, case in enumerate(run_cases(todo, out, options, args.jobs), 1):
        cases.append(case)
        status = "error" if case.error else ("UNEXPECTED" if case.unexpected else "ok")
        print(f"[{i}/{len(todo)}] {case.key}: {status} ({', '.join(case.verdict or []) or case.error or 'clean'})",
              file=sys.stderr, flush=True)
    if baseline:
        compare_baseline(cases, baseline, args.latency_factor, args.latency_floor_us)
    doc = results_doc(cases, started, options)
    write_json(os.path.join(out, "results.json"), doc, indent=1)
    Path(out, "summary.md").write_text(markdown(cases, doc))
    if args.junit:
        Path(args.junit).write_bytes(junit(cases, doc))
    s = doc["summary"]
    print(f"powercut corpus: {s['cases']} cases, {s['unexpected']} unexpected, {s['regressions']} latency "
          f"regressions, {s['errors']} errors; results: {out}/results.json, summary: {out}/summary.md")
    return 1 if any(c.failed for c in cases) else 0


def cmd_diff(args: argparse.Namespace) -> int:
    """Verdict changes and latency of two corpus runs (e.g. old and new kernel); exit 1 on a verdict change."""
    a, b = load_results(args.a), load_results(args.b)
    diffs = diff(a, b)
    text = corpus_markdown_diff(a, b, diffs, (args.a, args.b))
    if args.out:
        Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 1 if any(d.changed for d in diffs) else 0


def cmd_list(args: argparse.Namespace) -> int:
    for e in load_corpus(args.corpus, args.entries):
        exp = ", ".join(f"{k}: {'/'.join(v) or 'clean'}" + (f" (may: {'/'.join(e.may[k])})" if k in e.may else "")
                        for k, v in sorted(e.expect.items()))
        print(f"{e.name:32} {e.why[:60]:60} {exp}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    """A run's output directory (report.json and its workload) becomes a corpus entry."""
    report_path = Path(args.run_dir, "report.json")
    try:
        report = json.loads(report_path.read_text())
        workload = json.loads(Path(report["workload"]["file"]).read_text())
    except (OSError, KeyError, json.JSONDecodeError) as e:
        raise UsageError(f"{args.run_dir}: not the output of `powercut run` on a JSON workload ({e})") from None
    kinds = sorted({f["kind"] for f in report["findings"]} & set(VERDICT_KINDS))
    row = args.row or next((r.name for r in load_matrix(args.matrix)
                            if (r.fs, r.mkfs_opts, r.mount_opts) ==
                            (report["fs"], report["mkfs_opts"], report["mount_opts"])), None)
    if row is None:
        raise UsageError(f"no row of {args.matrix} has this run's configuration: name one with --row")
    name = args.name or workload["name"]
    expect: dict = {row: kinds or "clean"}
    if kinds:
        expect["default"] = "clean"
    dest = Path(args.corpus, "promoted", f"{name}.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        raise UsageError(f"{dest} exists: choose another --name")
    write_json(str(dest), entry_doc(name, args.why, workload, expect, fs=[report["fs"]]), indent=1)
    print(f"promoted to {dest} (expect {row}: {', '.join(kinds) or 'clean'})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("corpus", help="the regression corpus: run it across a matrix, list, promote findings")
    csub = p.add_subparsers(dest="corpus_command", metavar="ACTION", required=True)

    # Each action takes only the options it reads (list reads no matrix, promote selects no entries).
    def common(q: argparse.ArgumentParser, entries: bool = True, matrix: bool = True) -> None:
        q.add_argument("--corpus", default=str(CORPUS_DIR), help="corpus directory (default: the repo's corpus/)")
        if entries:
            q.add_argument("--entries", default="*",
                           help="only entries whose name matches this glob (or comma-separated globs)")
        if matrix:
            q.add_argument("--matrix", default=str(DEFAULT_MATRIX), help="matrix file (default: corpus/matrix.json)")

    r = csub.add_parser("run", help="run every entry across the matrix; exit 1 on an unexpected verdict or regression")
    common(r)
    r.add_argument("--fs", default="", help="only rows of these file systems (comma-separated)")
    r.add_argument("--rows", default="", help="only these matrix rows (comma-separated names)")
    r.add_argument("--runnable", action="store_true",
                   help="skip (with a note) the rows this host cannot run: file system tools or kernel support missing")
    r.add_argument("--baseline", default="", help="results.json of an earlier run to compare verdicts and latency with")
    r.add_argument("--latency-factor", type=float, default=2.0,
                   help="a p99 or max worse than FACTOR x the baseline is a regression (default 2)")
    r.add_argument("--latency-floor-us", type=float, default=200.0,
                   help="ignore latency regressions below this many microseconds (default 200)")
    add_backend_options(r)
    add_recovery_args(r)
    r.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="cases run in parallel, each in its own process (default 1)")
    r.add_argument("--junit", default="", help="also write JUnit XML here")
    add_semantics_option(r)
    r.add_argument("--out", default="", help="output directory (default: out/corpus-TIME)")
    r.set_defaults(func=cmd_run)

    d = csub.add_parser("diff", help="verdict changes and latency of two corpus runs; exit 1 on a verdict change")
    d.add_argument("a", help="results.json of the first run (e.g. the current kernel)")
    d.add_argument("b", help="results.json of the second run (e.g. the new kernel)")
    d.add_argument("--out", default="", help="also write the Markdown diff here")
    d.set_defaults(func=cmd_diff)

    ls = csub.add_parser("list", help="list the entries and their expected verdicts")
    common(ls, matrix=False)
    ls.set_defaults(func=cmd_list)

    pr = csub.add_parser("promote", help="turn a `powercut run` output directory into a corpus entry")
    common(pr, entries=False)
    pr.add_argument("run_dir", help="output directory of `powercut run` (report.json)")
    pr.add_argument("--why", required=True, help="why the entry is in the corpus")
    pr.add_argument("--name", default="", help="entry name (default: the workload's)")
    pr.add_argument("--row", default="", help="matrix row the verdict is for (default: the row with the run's options)")
    pr.set_defaults(func=cmd_promote)

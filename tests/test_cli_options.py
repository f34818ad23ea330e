"""Every option of every subcommand is named in a test that runs that subcommand.

test_every_option_is_named_in_a_test walks the argparse tree (cli/main.py
build_parser) and reads every test function's strings (with the strings of its
module's constants and of the helpers and fixtures of its file it uses): an
option counts as tested when one test function names both the subcommand
and the option. The tests below run the options no other test ran, each
through the real command, and check what the option changed.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import build_parser
from conftest import WORKLOADS, PcEnv, needs_root_stack

TESTS = Path(__file__).resolve().parent


def subcommands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """(subcommand words, its option flags) for every subcommand under P."""
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from subcommands(sub, path + (name,))
    if path:
        yield path, [a.option_strings[0] for a in p._actions
                     if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _words(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for x in ast.walk(node):
        if isinstance(x, ast.Constant) and isinstance(x.value, str):
            out |= {x.value, *x.value.split()}
    return out


def words_of_tests(source: str) -> list[set[str]]:
    """Per test function of SOURCE: the strings it names, its module's constants' and those of
    the same file's functions it calls or takes as fixtures (one level)."""
    tree = ast.parse(source)
    module = set().union(*(_words(n) for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))))
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    found = []
    for name, fn in defs.items():
        if not name.startswith("test_"):
            continue
        words = _words(fn) | module
        used = {x.func.id for x in ast.walk(fn) if isinstance(x, ast.Call) and isinstance(x.func, ast.Name)}
        used |= {a.arg for a in fn.args.args}
        for helper in used & set(defs):
            words |= _words(defs[helper])
        found.append(words)
    return found


def untested(parser: argparse.ArgumentParser, tests: list[set[str]]) -> list[str]:
    return [" ".join(path) + " " + flag for path, flags in subcommands(parser) for flag in flags
            if not any(flag in words and all(w in words for w in path) for words in tests)]


def test_every_option_is_named_in_a_test() -> None:
    tests = [w for f in sorted(TESTS.glob("test_*.py")) for w in words_of_tests(f.read_text())]
    missing = untested(build_parser(), tests)
    assert not missing, "options no test runs (name the subcommand and the option in one test):\n" + "\n".join(missing)


def test_the_option_check_finds_an_option_no_test_names() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers().add_parser("frob")
    sub.add_argument("--named")
    sub.add_argument("--forgotten")
    source = 'def test_frob(pc):\n    pc.run("frob", "--named", "x")\n\ndef test_other():\n    f("--forgotten")\n'
    assert untested(p, words_of_tests(source)) == ["frob --forgotten"]


# -- the options no other test ran ------------------------------------------------------------

@pytest.mark.parametrize("args,says", [
    (("fuzz", "--fs", "ext4", "--kernel-modules", "/lib/modules/x"), "--kernel and --kernel-modules need --backend vm"),
    (("minimize", "WL", "--fs", "ext4", "--kernel", "debian:linux-image-6.12-amd64"),
     "--kernel and --kernel-modules need --backend vm"),
    (("minimize", "WL", "--fs", "ext4", "--kernel-modules", "/lib/modules/x"),
     "--kernel and --kernel-modules need --backend vm"),
    (("minimize", "WL", "--fs", "ext4", "--backend", "vm"), "--backend vm needs --kernel"),
    (("bench", "--only", "time-to-find", "--kernel", "debian:x", "--bugs", "no-such-bug"), "--bugs: unknown no-such-bug"),
    (("fuzz", "--fs", "ext4", "--tools", "debian:hamm"), "--tools debian:hamm: give debian:SUITE"),
    (("minimize", "WL", "--fs", "ext4", "--tools", "debian:hamm"), "--tools debian:hamm: give debian:SUITE"),
])
def test_an_option_given_where_it_cannot_apply_is_one_line(pc: PcEnv, args: tuple[str, ...], says: str) -> None:
    wl = str(WORKLOADS / "two_durability_bugs.json")
    p = pc.run(*(wl if a == "WL" else a for a in args))
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_corpus_run_with_a_suite_debian_lacks_runs_no_case(pc: PcEnv) -> None:
    # Each case ends in that one line (corpus run checks --tools per case, not up front: exit 1).
    p = pc.run("corpus", "run", "--entries", "append-fsync", "--rows", "ext4-ordered", "--tools", "debian:hamm",
               "--out", str(pc.tmp / "c"))
    assert p.returncode in (1, 2) and "--tools debian:hamm: give debian:SUITE" in p.stdout + p.stderr, p.stderr


def test_bisect_changed_against_bisects_only_changed_cases(pc: PcEnv) -> None:
    """Two results with the same verdicts: nothing to bisect, no kernel is fetched (exit 0);
    a results file that is not there: one line, exit 2."""
    results = pc.tmp / "results.json"
    results.write_text(json.dumps({"format": "powercut-corpus-results/1", "cases": {
        "append-fsync@ext4-ordered": {"verdict": [], "expected": [], "report": "append-fsync/report.json"}}}))
    p = pc.run("bisect", str(results), "--changed-against", str(results), "--kernels", "debian:a,debian:b",
               "--out", str(pc.tmp / "b"))
    assert p.returncode == 0 and p.stdout == "", p.stdout + p.stderr
    p = pc.run("bisect", str(results), "--changed-against", str(pc.tmp / "none.json"), "--kernels", "debian:a,debian:b",
               "--out", str(pc.tmp / "b2"))
    assert p.returncode == 2 and p.stderr.startswith("powercut: --changed-against:"), p.stderr


@pytest.mark.e2e
@needs_root_stack
def test_fuzz_run_options_reach_the_campaign(pc: PcEnv) -> None:
    """One workload with each run and generator option set away from its default: the
    campaign's saved configuration and its report carry them."""
    out = pc.tmp / "c"
    p = pc.run("fuzz", "--fs", "ext4", "--max-workloads", "1", "--duration", "10m", "--seed", "5", "--out", str(out),
               "--semantics", "posix", "--size", "96", "--states-per-point", "2", "--recovery", "ro",
               "--min-ops", "1", "--max-ops", "2", "--shrink-match", "kind", "--coverage-target", timeout=600)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    saved = json.loads((out / "campaign.json").read_text())
    run, options = saved["run"], saved["spec"]["options"]
    assert (run["semantics"], run["size_mib"], run["states_per_point"], run["recovery"]) == ("posix", 96, 2, "ro")
    assert (options["min_ops"], options["max_ops"], options["shrink_match"], options["coverage_target"]) == \
        (1, 2, "kind", True)
    report = json.loads((out / "report.json").read_text())
    assert report["workloads"] == 1 and report["recovery"] == "ro", report


@pytest.mark.e2e
@needs_root_stack
def test_minimize_run_options_reach_its_runs(pc: PcEnv) -> None:
    """minimize's own run options: the shrunk run's report says each one."""
    out = pc.tmp / "min"
    p = pc.run("minimize", str(WORKLOADS / "two_durability_bugs.json"), "--fs", "ext4", "--fault", "drop-flush",
               "--backend", "fuse", "--semantics", "linux", "--mount-opts", "noatime", "--size", "96",
               "--states-per-point", "1", "--max-states", "design+2", "--recovery", "rw", "--recovery-crash",
               "--recovery-crash-states", "1", "--recovery-crash-rate", "0.5", "--max-runs", "1", "--out", str(out),
               timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "best" / "report.json").read_text())
    assert (report["mount_opts"], report["device_bytes"], report["max_states"]) == ("noatime", 96 << 20, "design+2")
    assert (report["semantics"], report["backend"]) == ("linux", "fuse")
    crash = report["recovery_crash"]
    assert (crash["states_per_crash_state"], crash["rate"]) == (1, 0.5), crash
    # --states-per-point 1 with --reorder's default drop-one: the in-order prefix and at most one other per point
    assert report["crash_states_checked"] <= 2 * report["budget"]["crash_points_checked"], report["budget"]


@pytest.mark.e2e
@needs_root_stack
def test_recheck_recovery_mode_and_corpus_run_options(pc: PcEnv) -> None:
    """`recheck --recovery ro` recovers the state read-only; `corpus run --semantics posix
    --recovery-crash ...` runs its case with them (the case's own report says so)."""
    run = pc.tmp / "run"
    pc.run("run", str(WORKLOADS / "two_durability_bugs.json"), "--fs", "ext4", "--out", str(run), check_rc=0)
    last = f"p{json.loads((run / 'report.json').read_text())['log_entries'] - 1}"  # the workload's end
    p = pc.run("recheck", str(run), "--state", last, "--recovery", "ro", check_rc=0)
    assert "recoveries checked: ro 1" in p.stdout, p.stdout  # without --recovery: the saved run's rw
    out = pc.tmp / "corpus"
    pc.run("corpus", "run", "--entries", "append-fsync", "--rows", "ext4-ordered", "--semantics", "posix",
           "--recovery-crash", "--recovery-crash-states", "1", "--recovery-crash-rate", "0.5", "--out", str(out),
           check_rc=0)
    results = json.loads((out / "results.json").read_text())
    assert results["semantics"] == "posix"
    (case,) = results["cases"].values()
    report = json.loads((out / case["report"]).read_text())
    assert report["semantics"] == "posix"
    crash = report["recovery_crash"]
    assert (crash["states_per_crash_state"], crash["rate"]) == (1, 0.5), crash

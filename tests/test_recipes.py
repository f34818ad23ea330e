"""The fleet recipes of docs/scale-out.md, read out of the page and run as their jobs would.

A Kubernetes cluster and a GitHub runner are not here: the test plays
their part (docs/scale-out.md, "What the recipes' test runs"). It runs the
Job's command for two pod indices and the workflow's fuzz and report
scripts for the three shards of one matrix row, against a real
redis-server on loopback started with the Redis pod's arguments. A docs
edit that breaks a command (an option powercut refuses, shell that does
not parse, an exit status the job would take for a failure) fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import ROOT, journal, redis_server, report, require_root_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, require_root_stack,
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (make deps)")]

DOC = ROOT / "docs" / "scale-out.md"
SHORT = "60s"   # each pod's / job's DURATION here (a real one runs hours)


def blocks(lang: str) -> list[str]:
    """The ```LANG code blocks of the page, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), re.M | re.S)


def recipe(kind: str) -> list[dict[str, Any]]:
    """The YAML documents of the first yaml block that has a document of KIND (or a workflow: 'jobs')."""
    for text in blocks("yaml"):
        docs = [d for d in yaml.safe_load_all(text) if d]
        if any(d.get("kind") == kind or kind in d for d in docs):
            return docs
    raise AssertionError(f"docs/scale-out.md has no yaml block with {kind}")


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server on loopback with the arguments of the recipe's Redis pod."""
    pod = next(d for d in recipe("Job") if d.get("kind") == "Pod")
    with redis_server(tmp_path, *(str(a) for a in pod["spec"]["containers"][0]["args"])) as url:
        yield url


def machine_env(tmp: Path, who: str, **extra: str) -> dict[str, str]:
    """A machine's environment: its own powercut state and scratch (one pod, one runner)."""
    return dict(os.environ, POWERCUT_STATE_DIR=str(tmp / who / "state"), POWERCUT_SCRATCH=str(tmp / who / "scratch"),
                **extra)


def wait_all(procs: list[subprocess.Popen[str]], timeout: float = 1200) -> list[tuple[int, str]]:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def positions(campaign_dirs: list[Path]) -> list[int]:
    return [e["position"] for d in campaign_dirs for e in journal(d)
            if e.get("position") is not None and "error" not in e]


def test_kubernetes_indexed_job(tmp_path: Path, redis_url: str) -> None:
    job = next(d for d in recipe("Job") if d.get("kind") == "Job")
    assert job["spec"]["completionMode"] == "Indexed"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sh", "-c"]
    env = {e["name"]: str(e["value"]) for e in container["env"]}
    # The cluster's parts this machine plays: the Service's address, a short run, one worker, a scratch volume.
    env.update(COORDINATOR=redis_url, DURATION=SHORT, JOBS="1", OUT=str(tmp_path / "volume"))
    pods = [subprocess.Popen(["sh", "-c", *container["args"]], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=machine_env(tmp_path, f"pod{i}", **env,
                                                                       JOB_COMPLETION_INDEX=str(i)))
            for i in range(2)]
    for rc, out in wait_all(pods):
        assert rc == 0, out  # the Job counts the pod as done (findings or none)

    report_cmd = next(b for b in blocks("sh") if "campaign report" in b and "$COORDINATOR" in b)
    d = checkout(tmp_path, "user")
    p = subprocess.run(["sh", "-c", report_cmd], cwd=d, text=True, capture_output=True,
                       env=machine_env(tmp_path, "user", **env))
    merged = report(d / "merged")
    assert p.returncode == (1 if merged["saved_findings"] else 0), p.stdout + p.stderr
    assert merged["joined"]["campaign"] == env["CAMPAIGN"] and len(merged["machines"]) == 2, merged["joined"]
    assert merged["joined"]["duplicate_runs"] == 0 and merged["joined"]["leases_outstanding"] == 0
    ran = positions([tmp_path / "volume" / f"campaign-{i}" for i in range(2)])
    assert ran and len(ran) == len(set(ran)) == merged["exhaustive"]["done"], ran


def matrix_rows(matrix: dict[str, list[Any]]) -> list[dict[str, str]]:
    keys = list(matrix)
    return [dict(zip(keys, (str(v) for v in values))) for values in product(*(matrix[k] for k in keys))]


def step_env(step: dict[str, Any], row: dict[str, str]) -> dict[str, str]:
    """The step's env with ${{ matrix.X }} replaced by ROW's values, as GitHub expands them."""
    return {k: re.sub(r"\$\{\{ *matrix\.(\w+) *\}\}", lambda m: row[m.group(1)], str(v))
            for k, v in step.get("env", {}).items()}


def script(job: dict[str, Any]) -> tuple[dict[str, Any], str]:
    step = next(s for s in job["steps"] if "run" in s)
    assert "${{" not in step["run"], "the script takes its inputs from env, which the test can set"
    return step, step["run"]


def checkout(tmp: Path, name: str) -> Path:
    """A job's working directory: the checkout's entries, linked (each job its own out/ and merged/)."""
    d = tmp / name
    d.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("out", "merged", ".git"):
            (d / entry.name).symlink_to(entry)
    return d


def test_ci_matrix(tmp_path: Path, redis_url: str) -> None:
    flow = recipe("jobs")[0]
    fuzz, rep = flow["jobs"]["fuzz"], flow["jobs"]["report"]
    rows = matrix_rows(fuzz["strategy"]["matrix"])
    assert {(r["kernel"], r["config"]) for r in rows} == \
        {(r["kernel"], r["config"]) for r in matrix_rows(rep["strategy"]["matrix"])}, "a report per campaign"
    mine = [r for r in rows if r["kernel"] == "host" and r["config"] == "ext4-ordered"]
    assert len(mine) >= 2, "the row's campaign is joined by several runners"

    # `sudo` on a runner where the job may be root; the test is root already.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    workflow_env = {k: str(v) for k, v in flow["env"].items()}
    workflow_env.update(POWERCUT_REDIS=redis_url, DURATION=SHORT, RUN="4242",
                        PATH=f"{bin_dir}:{os.environ['PATH']}")

    step, run = script(fuzz)
    jobs, dirs = [], []
    for i, row in enumerate(mine):
        d = checkout(tmp_path, f"fuzz{i}")
        dirs.append(d / "out" / "campaign")
        jobs.append(subprocess.Popen(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", run], cwd=d, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=machine_env(tmp_path, f"runner{i}", **workflow_env, **step_env(step, row))))
    for rc, out in wait_all(jobs):
        assert rc == 0, out

    step, run = script(rep)
    d = checkout(tmp_path, "report")
    summary = tmp_path / "summary.md"
    p = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", run], cwd=d, text=True,
                       capture_output=True,
                       env=machine_env(tmp_path, "report", **workflow_env, GITHUB_STEP_SUMMARY=str(summary),
                                       **step_env(step, {"kernel": "host", "config": "ext4-ordered"})))
    merged = report(d / "merged")
    assert p.returncode == (1 if merged["saved_findings"] else 0), p.stdout + p.stderr  # findings fail the job
    assert merged["joined"]["campaign"] == "run4242-host-ext4-ordered" and len(merged["machines"]) == len(mine)
    assert merged["joined"]["duplicate_runs"] == 0
    ran = positions(dirs)
    assert ran and len(ran) == len(set(ran)) == merged["exhaustive"]["done"], ran
    assert summary.read_text().strip() == (d / "merged" / "report.md").read_text().strip()

"""First use of the vm backend with several workers: its host packages are installed once.

A real install needs a package this machine does not have. QEMU itself
cannot be removed for a test (other guests on the machine start from it), so
the tests add a small Debian package nobody else uses (`hello`) to what
`--backend vm` needs (POWERCUT_VM_EXTRA_PACKAGES): the install path is the
one QEMU takes on a fresh machine, apt and dpkg included. Each test removes
`hello` again; they skip where it was installed before (not theirs to remove).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, PcEnv

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("apt-get"), reason="needs root and apt-get"),
]

KERNEL = "debian:linux-image-6.12-amd64"
PROOF, PACKAGE = "/usr/bin/hello", "hello"
EXTRA = {"POWERCUT_VM_EXTRA_PACKAGES": f"{PROOF}={PACKAGE}"}


def _dpkg_installed(pkg: str) -> bool:
    p = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return p.returncode == 0 and "install ok installed" in p.stdout


@pytest.fixture
def without_hello() -> object:
    if _dpkg_installed(PACKAGE) or os.path.exists(PROOF):
        pytest.skip(f"{PACKAGE} was installed before the test: not ours to remove")
    yield
    subprocess.run(["apt-get", "remove", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", PACKAGE],
                   capture_output=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def test_two_processes_asking_at_once_install_once(without_hello: object) -> None:
    # Both start before either has installed anything: the lock makes the second wait and
    # find the package there (without it, one apt-get fails on dpkg's lock).
    code = ("import sys; from harness.backends.vm import packages; "
            f"packages.ensure({{{PROOF!r}: {PACKAGE!r}}}, 'the test')")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    errs = [p.communicate(timeout=900)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert sum(e.count(f"installing {PACKAGE}") for e in errs) == 1, errs
    assert os.path.exists(PROOF)


def test_campaign_installs_once_before_its_workers_and_runs_them_all(pc: PcEnv, without_hello: object) -> None:
    """Also the vm backend's default engine (no --engine): mixed, w0 walking the ordered seq-2
    space from its start, w1 running Hypothesis (tests/test_mixed.py has the engine on fuse)."""
    out = pc.tmp / "campaign"
    p = pc.run("fuzz", "--out", str(out), "--fs", "ext4", "--backend", "vm", "--kernel", KERNEL,
               "--jobs", "2", "--max-workloads", "2", "--duration", "10m", "--seed", "5",
               env=pc.env(**EXTRA), timeout=1500)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr.count(f"installing {PACKAGE}") == 1, p.stderr
    assert os.path.exists(PROOF)
    report = json.loads((out / "report.json").read_text())
    assert report["failed_workers"] == [] and report["worker_errors"] == {}
    # Both workers booted their guest and ran workloads: each claims its first of the two
    # workloads before its guest boots, so neither can run both.
    assert report["stop_reason"] == "max-workloads" and report["workloads"] == 2
    for w in ("w0", "w1"):
        assert json.loads((out / "guests" / f"{w}.json").read_text())["boots"] >= 1
    names = {w: [json.loads(ln)["name"] for ln in (out / "journal" / f"{w}.jsonl").read_text().splitlines()
                 if '"shrink": true' not in ln] for w in ("w0", "w1")}
    assert report["engine"] == "mixed" and report["exhaustive"]["seq"] == 2 and report["exhaustive"]["done"] == 1
    assert names["w0"] == ["ace2-0"] and len(names["w1"]) == 1 and names["w1"][0].startswith("hyp-w1-"), names
    assert pc.leftovers() == []


def test_a_failed_install_ends_the_campaign_before_any_worker(pc: PcEnv) -> None:
    out = pc.tmp / "campaign"
    env = pc.env(POWERCUT_VM_EXTRA_PACKAGES="/nonexistent/powercut-test=powercut-no-such-package")
    p = pc.run("fuzz", "--out", str(out), "--fs", "ext4", "--backend", "vm", "--kernel", KERNEL,
               "--engine", "exhaustive", "--seq", "1", "--jobs", "2", "--duration", "2m", env=env, timeout=900)
    assert p.returncode == 2, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("powercut:") and "install" in line]
    assert len(errors) == 2 and "could not install powercut-no-such-package for --backend vm" in errors[1], p.stderr
    assert "Traceback" not in p.stderr and "worker" not in p.stderr
    assert not (out / "journal").exists() or not any((out / "journal").iterdir())

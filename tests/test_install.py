"""`pip install .` (not editable) into a fresh venv gives a working `powercut`.

The checkout's tracked files are copied first, so the build writes nothing
into the source tree; the installed command then runs a real workload from a
directory outside the copy, with no PYTHONPATH and no POWERCUT_BUILD, so
only what the install put into the venv can serve it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, WORKLOADS, PcEnv, needs_root_stack

pytestmark = [pytest.mark.e2e, needs_root_stack]


def _copy_tracked_files(dest: Path) -> None:
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    names = [n for n in files.decode().split("\0") if n and (ROOT / n).is_file()]
    subprocess.run(["cp", "--parents", "-t", str(dest), *names], cwd=ROOT, check=True)


def test_pip_install_gives_a_working_powercut(pc: PcEnv) -> None:
    src, venv, work = pc.tmp / "src", pc.tmp / "venv", pc.tmp / "work"
    for d in (src, work):
        d.mkdir()
    _copy_tracked_files(src)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(src / "requirements.txt")], check=True, timeout=900)
    subprocess.run([*pip, "--no-deps", str(src)], check=True, timeout=900)

    env = {k: v for k, v in pc.env().items() if k not in ("PYTHONPATH", "POWERCUT_BUILD")}
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import foundation.paths as p; print(p.c_program('pc-exec'))"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), f"pc-exec found outside the install: {where}"

    out = work / "out"
    p = subprocess.run([str(venv / "bin" / "powercut"), "run", str(WORKLOADS / "rename_fsync.json"), "--fs", "ext4",
                        "--out", str(out)], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["crash_states_checked"] > 0 and report["findings"] == []
    assert pc.leftovers() == []

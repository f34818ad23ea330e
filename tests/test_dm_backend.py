"""The `dm` backend on a host: what it refuses, and what a host without device-mapper says.

The recording itself needs a kernel with dm-log-writes: tests/test_dm_guest.py
runs it inside a Debian kernel. These checks run on any host.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WORKLOADS, PcEnv, needs_root_stack
from harness.backends.dm import support

pytestmark = [pytest.mark.e2e, needs_root_stack]

no_dm = pytest.mark.skipif(support.missing() is None, reason="this host has device-mapper and dm-log-writes")


@pytest.fixture
def two_loops(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two loop devices the test made (so, to powercut, devices it did not create)."""
    devs = []
    try:
        for name in ("a.img", "b.img"):
            img = tmp_path / name
            img.write_bytes(b"")
            os.truncate(img, 64 << 20)
            devs.append(subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True,
                                       text=True, check=True).stdout.strip())
        yield devs[0], devs[1]
    finally:
        for dev in devs:
            subprocess.run(["losetup", "-d", dev], capture_output=True)


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("powercut: "), p.stderr
    return lines[0]


@no_dm
@pytest.mark.parametrize("command", [["run", str(WORKLOADS / "mixed.sh")], ["fuzz", "--duration", "5s"],
                                     ["corpus", "run", "--rows", "ext4-ordered"]])
def test_dm_without_device_mapper_is_one_line_exit_2(pc: PcEnv, command: list[str]) -> None:
    fs = [] if command[0] == "corpus" else ["--fs", "ext4"]
    p = pc.run(*command, *fs, "--backend", "dm", "--out", str(pc.tmp / "out"))
    assert "device-mapper is missing" in one_line_error(p)
    assert not (pc.tmp / "out").exists()


@no_dm
def test_auto_picks_fuse_without_device_mapper(pc: PcEnv, tmp_path: Path) -> None:
    script = tmp_path / "tiny.sh"
    script.write_text("echo x > f\nsync f\n")
    out = tmp_path / "out"
    pc.run("run", str(script), "--fs", "ext4", "--backend", "auto", "--crash-points", "mark", "--reorder", "none",
           "--out", str(out), check_rc=0)
    assert json.loads((out / "report.json").read_text())["backend"] == "fuse"


def test_device_not_created_by_powercut_needs_confirmation(pc: PcEnv, two_loops: tuple[str, str]) -> None:
    data, log = two_loops
    before = Path(data).read_bytes()[:1 << 20]
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--backend", "dm",
               "--data-dev", data, "--log-dev", log, "--i-know-this-erases", log, "--out", str(pc.tmp / "out"))
    assert f"refusing to erase {data} (--data-dev): powercut did not create it" in one_line_error(p)
    assert Path(data).read_bytes()[:1 << 20] == before
    assert not (pc.tmp / "out").exists()


def test_mounted_device_is_refused_even_when_confirmed(pc: PcEnv, two_loops: tuple[str, str], tmp_path: Path) -> None:
    data, log = two_loops
    subprocess.run(["mkfs.ext4", "-q", data], check=True, capture_output=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", data, str(mnt)], check=True)
    try:
        (mnt / "keep").write_text("user data")
        p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--backend", "dm", "--data-dev", data,
                   "--log-dev", log, "--i-know-this-erases", data, "--i-know-this-erases", log)
        assert f"refusing to use {data} (--data-dev): it (or a partition of it) is mounted" in one_line_error(p)
        assert (mnt / "keep").read_text() == "user data"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_device_options_need_the_dm_backend(pc: PcEnv, two_loops: tuple[str, str]) -> None:
    data, log = two_loops
    p = pc.run("run", str(WORKLOADS / "mixed.sh"), "--fs", "ext4", "--data-dev", data, "--log-dev", log)
    assert "need --backend dm" in one_line_error(p)


@no_dm
def test_corpus_run_auto_records_with_fuse_here(pc: PcEnv) -> None:
    out = pc.tmp / "corpus"
    pc.run("corpus", "run", "--entries", "create-pwrite-fsync", "--rows", "ext4-ordered", "--backend", "auto",
           "--out", str(out), check_rc=0)
    assert json.loads((out / "results.json").read_text())["backend"] == "fuse"

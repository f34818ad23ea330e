"""The exports' ops and checks against a real kernel with no power cut.

Without a crash, a correct kernel shows exactly the model's last state
(model.py). So the fstests export's op lines (ops.py: held fds, xfs_io on
/proc/self/fd/N, coreutils) run in bash on a real ext4 loop mount, then every
check checks.py can write (kind, size, bytes) for every path the workload
names must print the model's value: the translation of the ops and the model
agree with the kernel, op for op. The shell helpers are run by bash and by
busybox sh (the vm guest's shell) alike.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import WORKLOADS, needs_root_stack
from harness.reports.export.checks import _HELPERS, Check, _Builder, runs
from harness.reports.export.finding import ExportInput
from harness.reports.export.ops import xfs_io_script

WORKLOADS_USED = ["rename_fsync.json", "fsync_then_more.json", "stale_writeback.json", "unjournaled_dirs.json",
                  "btrfs_fsync_unlinked.json", "btrfs_truncate_fsync_link.json", "ext4_fast_commit_noisy.json",
                  "failed_direct_write.json", "copy_range_export.json", "ext4_fast_commit_tmpfile_linkat.json"]


def _input(ops: list[dict]) -> ExportInput:
    return ExportInput(directory=".", name="t", kind="durability", detail="", state_id="p1", in_order=True,
                       fs="ext4", mkfs_opts="", mount_opts="", device_bytes=64 << 20, ops=ops,
                       seqs=list(range(len(ops))), ops_after=0)


def _all_checks(ops: list[dict]) -> list[Check]:
    """Every fact about every path the ops name, as the last state has it."""
    b = _Builder(_input(ops), "$SCRATCH_MNT")
    last = b.since(len(ops))
    paths = sorted({op[k] for op in ops for k in ("path", "from", "to") if k in op})
    out = []
    for p in paths:
        out.append(b.kind(p, last, ""))
        ino = last[0].inode(p)
        if ino is not None and ino.kind == "file":
            size, data = b.size(p, last, ""), b.bytes_at(p, 0, max(len(ino.data), 1), last, "")
            out += [c for c in (size, data) if c is not None]
            assert ino.exact == (size is not None) == (data is not None)
    return out


def _run_on_ext4(tmp_path: Path, lines: list[str]) -> subprocess.CompletedProcess[str]:
    """LINES (the export's op lines, then what prints the facts) in bash on a fresh ext4 loop mount."""
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        env = {**os.environ, "SCRATCH_MNT": str(mnt), "XFS_IO_PROG": shutil.which("xfs_io") or "xfs_io",
               "seqres": str(tmp_path / "seq"), "here": str(tmp_path)}
        return subprocess.run(["bash", "-c", "\n".join(lines)], env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.e2e
@needs_root_stack
@pytest.mark.parametrize("name", WORKLOADS_USED)
def test_ops_run_by_the_kernel_leave_what_the_model_says(tmp_path: Path, name: str) -> None:
    doc = json.loads((WORKLOADS / name).read_text())
    ops = [op for op in doc["threads"][0]["ops"] if op["op"] not in ("statx", "sleep", "fiemap")]
    script = xfs_io_script(ops)
    checks = _all_checks(ops)
    p = _run_on_ext4(tmp_path, [_HELPERS, *script.lines, *[f'echo "{c.label}: $({c.cmd})"' for c in checks]])
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [c.golden() for c in checks], (tmp_path / "seq.full").read_text()


@pytest.mark.e2e
@needs_root_stack
def test_the_shell_holds_each_fd_with_the_access_mode_the_finding_opened_it_with(tmp_path: Path) -> None:
    """An existing file opened O_RDWR (or O_WRONLY) is held read-write (`exec N<>`), a read-only
    open and a directory read-only: the kernel's own fdinfo of the test's shell says which."""
    ops = [{"op": "creat", "path": "foo", "fd": "c"}, {"op": "close", "fd": "c"}, {"op": "mkdir", "path": "A"},
           {"op": "open", "path": "foo", "flags": ["O_RDWR"], "fd": "rw"},
           {"op": "open", "path": "foo", "flags": ["O_WRONLY"], "fd": "w"},
           {"op": "open", "path": "foo", "flags": ["O_RDONLY"], "fd": "r"},
           {"op": "open", "path": "A", "flags": ["O_RDONLY"], "fd": "d"}]
    script = xfs_io_script(ops)
    fds = {name: script.shell_fds[name] for name in ("rw", "w", "r", "d")}
    # fdinfo's flags are octal; the access mode is their low two bits (O_RDONLY 0, O_RDWR 2)
    p = _run_on_ext4(tmp_path, [*script.lines, *[f"awk '/^flags:/ {{print \"{n}\", substr($2, length($2)) % 4}}' "
                                                 f"/proc/$$/fdinfo/{fd}" for n, fd in fds.items()]])
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["rw 2", "w 2", "r 0", "d 0"], p.stdout


@pytest.mark.parametrize("shell", ["bash", "busybox"])
def test_shell_helpers_print_what_the_model_computes(tmp_path: Path, shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} not installed")
    data = b"a" * 5000 + bytes(3000) + b"bc" + b"\x7f" * 17
    f = tmp_path / "f"
    f.write_bytes(data)
    cmd = ["busybox", "sh"] if shell == "busybox" else ["bash"]
    script = _HELPERS + f"""
byte_runs {f}
byte_runs -j 4000 -N 2000 {f}
byte_runs -j 0 -N 10 /nonexistent
bytes_within "00 61 62 63 7f" {f}
bytes_within "00 61" -j 4000 {f}
"""
    p = subprocess.run([*cmd, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines() == [runs(data), runs(data[4000:6000]), "(none)", "yes", "no: 62 63 7f"], p.stdout


@pytest.mark.e2e
@needs_root_stack
def test_an_o_tmpfile_file_written_linked_and_written_again_by_its_name_is_what_the_model_says(tmp_path: Path) -> None:
    """An O_TMPFILE file's xfs_io -T run (a write, flink) ends at the first op on another path;
    the shell then holds it by its linked name, and a write through that fd lands in the same file.
    A link refused (the name taken) leaves the fd to xfs_io: the later write is a comment."""
    ops = [{"op": "mkdir", "path": "A"},
           {"op": "open", "path": "A", "flags": ["O_TMPFILE", "O_RDWR"], "fd": "t"},
           {"op": "pwrite", "fd": "t", "offset": 0, "length": 5000},
           {"op": "linkat", "fd": "t", "to": "A/bar"},
           {"op": "mkdir", "path": "B"},
           {"op": "pwrite", "fd": "t", "offset": 7000, "length": 100},
           {"op": "fsync", "fd": "t"},
           {"op": "creat", "path": "B/taken", "fd": "c"},
           {"op": "open", "path": "B", "flags": ["O_TMPFILE", "O_RDWR"], "fd": "u"},
           {"op": "linkat", "fd": "u", "to": "B/taken"},
           {"op": "mkdir", "path": "C"},
           {"op": "pwrite", "fd": "u", "offset": 0, "length": 10}]
    script = xfs_io_script(ops)
    assert any("-T" in ln and "flink" in ln for ln in script.lines), script.lines
    checks = _all_checks(ops)
    p = _run_on_ext4(tmp_path, [_HELPERS, *script.lines, *[f'echo "{c.label}: $({c.cmd})"' for c in checks]])
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [c.golden() for c in checks], (tmp_path / "seq.full").read_text()
    assert any("A/bar" in c.label and "bytes" in c.label for c in checks)

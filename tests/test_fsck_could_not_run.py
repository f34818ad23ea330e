"""fsck that could not look at the image (btrfs check's mount-status probe failing) is run
again, and is never taken as a verdict on the image."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkers.crashwalk.recovery import FSCK_TRIES, fsck
from foundation.errors import EnvError
from foundation.filesystems import FILESYSTEMS, FsType

MARKER = FILESYSTEMS["btrfs"].fsck_could_not_run[0]


def _checker(tmp_path: Path, fails: int) -> FsType:
    """A checker that says MARKER and exits 1 on its first FAILS runs, then exits 0 (counts in a file)."""
    count = tmp_path / "runs"
    script = (f'n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; '
              f'if [ $n -le {fails} ]; then echo "ERROR: {MARKER}: No such device or address" >&2; exit 1; fi')
    return FsType("probe", [], ["sh", "-c", script, "fsck"], "none", 1, 1, fsck_could_not_run=(MARKER,))


def test_a_failed_probe_is_run_again(tmp_path: Path) -> None:
    code, _ = fsck(str(tmp_path / "image"), _checker(tmp_path, fails=1))
    assert code == 0 and (tmp_path / "runs").read_text().strip() == "2"


def test_a_probe_that_keeps_failing_is_no_verdict(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match="could not check"):
        fsck(str(tmp_path / "image"), _checker(tmp_path, fails=FSCK_TRIES))


def test_damage_is_not_retried(tmp_path: Path) -> None:
    fs = FsType("probe", [], ["sh", "-c", f"echo 1 >> {tmp_path}/runs; echo 'root 5 errors'; exit 1", "f"],
                "none", 1, 1, fsck_could_not_run=(MARKER,))
    assert fsck(str(tmp_path / "image"), fs)[0] == 1
    assert (tmp_path / "runs").read_text().count("1") == 1

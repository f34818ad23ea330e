"""Release what a killed test session left behind, before this one starts.

Tests keep powercut's state directory inside pytest's temporary tree. When a
session dies without its teardown (SIGKILL, the machine's job limit), its runs'
mounts, loop devices and FUSE daemons stay, and the next session on the machine
pays for them: a loop device backed by a file on a FUSE mount whose daemon is
gone makes every later `mkfs.btrfs` fail ("cannot check mount status:
Transport endpoint is not connected"). pytest also deletes the oldest of its
numbered directories at start, and with them the journals `powercut cleanup`
needs, so the sweep has to run first, in `pytest_sessionstart`.

Only directories powercut tagged as a state root are considered, and within
them `powercut cleanup` releases only runs whose owning process is gone (live
sessions running beside this one are not touched).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from common import POWERCUT, ROOT
from foundation import ownership

# pytest-N/<test>/state, .../state/m2 (a joined machine), .../<who>/state (a recipe's pod);
# under pytest-xdist (`make test`) one level deeper: pytest-N/popen-gwK/<test>/...
MAX_DEPTH = 5


def is_state_root(path: Path) -> bool:
    """Tagged as a root, and holding runs (a scratch root is tagged the same way, but what it
    holds are scratch directories: `powercut cleanup` pointed at it would find no run)."""
    if ownership.tag_of(str(path)) != "root":
        return False
    try:
        return any(ownership.tag_of(str(path / name)) == "run" for name in os.listdir(path))
    except OSError:
        return False


def state_roots(top: Path, depth: int = MAX_DEPTH) -> list[Path]:
    """Directories under TOP that powercut tagged as its state root, nested ones too (a joined
    test's machines inside the test's own). Run directories are not entered: they hold the
    mount points, and a dead FUSE mount answers ENOTCONN."""
    found: list[Path] = []
    try:
        entries = list(os.scandir(top))
    except OSError:
        return found
    for e in entries:
        try:
            if not e.is_dir(follow_symlinks=False) or ownership.tag_of(e.path) == "run":
                continue
        except OSError:
            continue
        path = Path(e.path)
        if is_state_root(path):
            found.append(path)
        if depth > 1:
            found += state_roots(path, depth - 1)
    return found


def sweep(top: Path) -> list[str]:
    """`powercut cleanup` on every state root under TOP; returns what it reported releasing."""
    released = []
    for state in state_roots(top):
        env = dict(os.environ, POWERCUT_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
        p = subprocess.run([*POWERCUT, "cleanup"], capture_output=True, text=True, env=env, timeout=300)
        released += [line for line in p.stdout.splitlines() if line.startswith("run ")]
    return released

"""Where powercut's own files are: the repo root and the built C programs."""

from __future__ import annotations

import os

from foundation.errors import EnvError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("POWERCUT_BUILD", os.path.join(ROOT, "build"))
# Downloads and derived files kept across runs (the vm backend's kernels and initramfs archives).
CACHE = os.environ.get("POWERCUT_CACHE", "/var/cache/powercut")


def c_program(name: str) -> str:
    path = os.path.join(BUILD, name)
    if not os.access(path, os.X_OK):
        raise EnvError(f"{path} is missing: run `make deps` to build the C programs")
    return path

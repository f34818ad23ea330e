"""Where powercut's own files are: the repo root and the built C programs."""

from __future__ import annotations

import os
import shutil

from foundation.errors import EnvError

# The directory that holds powercut's packages: the checkout, or site-packages after `pip install .`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where `pip install .` puts the C programs it builds (setup.py).
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")


def _build_dir() -> str:
    if os.environ.get("POWERCUT_BUILD"):
        return os.environ["POWERCUT_BUILD"]
    checkout = os.path.join(ROOT, "build")  # `make deps` in a checkout
    return checkout if os.path.isdir(checkout) else PROGRAMS


BUILD = _build_dir()
# Downloads and derived files kept across runs (the vm backend's kernels and initramfs archives).
CACHE = os.environ.get("POWERCUT_CACHE", "/var/cache/powercut")


def c_program(name: str) -> str:
    path = os.path.join(BUILD, name)
    if os.access(path, os.X_OK):
        return path
    found = shutil.which(name)  # installed by hand or by a distribution package
    if found:
        return found
    raise EnvError(f"{path} is missing: run `make deps` to build the C programs "
                   f"(or `pip install .` with cc and libfuse3-dev present, or set POWERCUT_BUILD)")

"""Builds powercut's C programs into the installed package (`pip install .`).

Everything else is declared in pyproject.toml. The programs go to
foundation/programs/, where foundation/paths.py looks when there is no
checkout build/ directory. Without a C compiler or libfuse3's headers the
install still succeeds and `powercut` says which program is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithPrograms(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install uses the checkout's build/ (make deps)
        out = os.path.join(os.path.abspath(self.build_lib), "foundation", "programs")
        os.makedirs(out, exist_ok=True)
        if not (shutil.which("make") and shutil.which(os.environ.get("CC", "cc"))):
            print("powercut: no make or C compiler: the C programs are not built", file=sys.stderr)
            return
        p = subprocess.run(["make", "-C", HERE, "cbuild", f"BUILD={out}", "APT_DEP="], check=False)
        if p.returncode != 0:
            print("powercut: building the C programs failed (libfuse3-dev missing?); "
                  "set POWERCUT_BUILD to where they are", file=sys.stderr)


setup(cmdclass={"build_py": BuildWithPrograms})

"""`powercut export FINDING-DIR`: a finding in the forms a kernel developer uses.

fstests (fstests.py): a test in xfstests' tests/generic/ layout with its
golden output; shell (shell.py): one standalone root script with a bundled C
program (pc-repro.c); report (report.py): a markdown bug report with both.
Both reproducers check what the oracle checked (checks.py, from model.py). Both come from the saved finding alone (finding.py);
vmcheck.py runs the shell form on a kernel in the vm backend.
"""

from __future__ import annotations

import os

from foundation import ownership
from harness.reports.export import fstests, report, shell
from harness.reports.export.finding import ExportInput, add_bisect, load

FORMATS = ("fstests", "shell", "report")


def write(x: ExportInput, fmt: str, out_dir: str) -> list[str]:
    """Write the export of X in FMT into OUT_DIR; returns the files written."""
    ownership.make_dir(out_dir)
    if fmt == "fstests":
        test, golden = fstests.render(x)
        files = {f"generic-{fstests.NUMBER}": test, f"generic-{fstests.NUMBER}.out": golden}
    elif fmt == "report":
        script = f"{x.name}.sh"
        files = {f"{x.name}.md": report.render(x, script), script: shell.render(x)}
    else:
        files = {f"{x.name}.sh": shell.render(x)}
    written = []
    for name, text in files.items():
        path = os.path.join(out_dir, name)
        with open(path, "w") as f:
            f.write(text)
        if name.endswith(".sh") or not os.path.splitext(name)[1]:
            os.chmod(path, 0o755)
        written.append(path)
    return written


__all__ = ["FORMATS", "ExportInput", "add_bisect", "load", "write"]

"""`powercut export --format report`: a bug report to attach upstream (markdown).

The shrunk ops, the kernels it was seen on and not, the crash point in words
(which op had returned), expected vs found, the rule with its evidence, fsck's
output, and the two reproducers (the fstests test inline, the shell script
written beside the report: it bundles a C program too long to inline).
"""

from __future__ import annotations

from harness.reports.export import fstests
from harness.reports.export.checks import build
from harness.reports.export.finding import ExportInput
from harness.reports.export.ops import describe


def _block(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def crash_words(x: ExportInput) -> str:
    """The crash point in words: which op had returned when the power was cut."""
    last = describe(x.ops[-1]) if x.ops else "the mount"
    return (f"Power is cut right after op {len(x.ops)} (`{last}`) returned"
            + (f"; the workload's {x.ops_after} later ops never ran" if x.ops_after else "")
            + (f" (the crash point fell while `{x.in_flight}` was running: it runs to its end here)"
               if x.in_flight else "")
            + ("." if x.in_order else f". powercut's crash state {x.state_id} also dropped or tore some writes "
               "of the last flush epoch; the reproducers cut power between ops instead."))


def render(x: ExportInput, script_name: str) -> str:
    ev = x.evidence
    ops = "".join(f"{i + 1}. `{describe(op)}`\n" for i, op in enumerate(x.ops)) or "(none)\n"
    crash = crash_words(x)
    checks, unchecked = build(x, "$SCRATCH_MNT")
    want = "".join(f"- `{c.golden()}`: {c.why}\n" for c in checks) or (
        "- the kernel logs no WARNING or BUG running the ops or recovering\n" if x.kind == "kernel" else
        "- the recovery mount succeeds and fsck finds the file system consistent\n")
    test, golden = fstests.render(x)
    seen = ", ".join(x.kernels) or "unknown"
    parts = [
        f"# {x.fs}: {x.detail.splitlines()[0] if x.detail else x.kind}\n",
        f"Kind: **{x.kind}**. File system: {x.fs}, mkfs options `{x.mkfs_opts or '(none)'}`, "
        f"mount options `{x.mount_opts or '(none)'}`, device {x.device_bytes // (1 << 20)} MiB.\n",
        f"Seen on: {seen}." + (f" Not seen on: {', '.join(x.clean_on)}." if x.clean_on else "") + "\n",
        f"Triage: {x.triage}.\n",
        "## Ops\n", ops,
        "## Crash point\n", crash + "\n",
        "## Expected (what a correct kernel shows after recovery)\n", want,
        "".join(f"- not checked: {u}\n" for u in unchecked),
        "## Found\n", f"{x.detail or ev.get('found') or x.found}\n",
    ]
    if ev.get("rule"):
        parts += ["## Rule and evidence\n", f"`{ev['rule']}`" + (f": {ev['reference']}" if ev.get("reference") else "")
                  + "\n"]
    if x.fsck_output:
        parts += ["## fsck after the kernel's recovery mount\n", _block(x.fsck_output)]
    kernel_log = "\n".join(ev.get("kernel_log", []) or [])
    if kernel_log:
        parts += ["## Kernel log at the recovery mount\n", _block(kernel_log)]
    parts += ["## Reproducers\n",
              f"An fstests test (copy to tests/generic/NNN and NNN.out of an fstests checkout, then `./check generic/NNN`):\n",
              _block(test, "bash"), "Its golden output:\n", _block(golden),
              f"A standalone root script (dm-log-writes, no fstests needed): `{script_name}`, written beside this "
              "report by `powercut export --format report` (or `--format shell`); exit 1 and `RESULT: REPRODUCED` "
              "when the bug shows.\n"]
    return "\n".join(parts)

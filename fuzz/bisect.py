"""Kernel bisection: which kernel first changed a workload's verdict?

The workload (a .json/.sh file, or a saved finding's workload with that
finding's configuration) runs through the whole pipeline with `--backend vm`
on kernels chosen by binary search over an ordered list: every crash state
is checked, and the verdict is the set of finding kinds (corpus verdicts:
"clean" or e.g. "durability,fsck"), or "error: ..." if the run could not be
made on that kernel (say, a mount option it does not know). The first and
the last kernel are run first; if their verdicts differ, the search narrows
to the first kernel whose verdict differs from the first one's (assuming one
change in the range, as `git bisect` does). Each tested kernel's verdict is
reported.

Kernel lists (`--kernels`):
  debian:A..debian:B   every released Debian kernel package of A's flavour, in any
                       suite, whose version lies between A's and B's (inclusive),
                       in dpkg's version order (bookworm 6.12 .. trixie 6.12 .. sid 7.2)
  SPEC,SPEC,...        an explicit list (debian:PKG or paths), in that order
  DIR                  each subdirectory of DIR (sorted by name) holding a
                       vmlinux or bzImage and, optionally, lib/modules/VERSION
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from foundation.jsondoc import write_json
from harness.backends import debian
from harness.corpus.diff import diff as corpus_diff
from harness.corpus.entries import VERDICT_KINDS
from foundation import ownership
from foundation.errors import PowercutError, UsageError
from harness.pipeline.config import RunConfig
from harness.pipeline.run import run_checked
from replay.crashstates import DEFAULT_REORDER
from workloads.runner import load_runner

_DEBIAN = "debian:"


@dataclass(frozen=True)
class KernelChoice:
    spec: str                       # what --kernel takes
    modules: str | None = None      # --kernel-modules


@dataclass
class Tested:
    kernel: str
    verdict: str
    findings: int
    seconds: float
    out: str


def _natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# A released Debian kernel: an ABI number (6.1.0-56) or a +debN tag (6.12.117+deb12), then the
# flavour (amd64, rt-amd64, cloud-amd64; -dbg and -unsigned are other flavours, never mixed in).
_RELEASED = re.compile(r"linux-image-(\d+\.\d+\.\d+(?:-\d+|\+deb\d+))-([a-z0-9-]+)")


def _flavour(pkg: str) -> str:
    m = _RELEASED.fullmatch(pkg)
    if m is None:
        raise UsageError(f"--kernels {pkg}: not a versioned Debian kernel package (e.g. linux-image-6.12.117+deb12-amd64)")
    return m[2]


def debian_range(first: str, last: str) -> list[KernelChoice]:
    """Every released kernel package of FIRST's flavour, in any suite, whose Debian version lies
    between FIRST's and LAST's, in dpkg's version order (bookworm's 6.12.117-1~deb12u1 sorts
    before trixie's 6.12.117-1, both before sid's 7.2.13-1)."""
    flavour = _flavour(first)
    if _flavour(last) != flavour:
        raise UsageError(f"--kernels: {first} and {last} are not of the same flavour")
    names = debian.search(rf"^linux-image-[0-9]+\.[0-9]+\.[0-9]+(-[0-9]+|\+deb[0-9]+)-{re.escape(flavour)}$")
    versions = debian.newest_versions([n for n in names if _RELEASED.fullmatch(n) and _flavour(n) == flavour])
    for end in (first, last):
        if end not in versions:
            raise UsageError(f"--kernels: no suite has a package {end} (suites searched: {', '.join(debian.SUITE_NAMES)})")
    lo, hi = debian.version_key(versions[first]), debian.version_key(versions[last])
    if lo > hi:
        raise UsageError(f"--kernels {first}..{last}: {first} ({versions[first]}) is newer than {last} ({versions[last]})")
    chosen = sorted((n for n, v in versions.items() if lo <= debian.version_key(v) <= hi),
                    key=lambda n: debian.version_key(versions[n]))
    return [KernelChoice(_DEBIAN + n) for n in chosen]


def kernel_list(text: str) -> list[KernelChoice]:
    if ".." in text:
        a, b = text.split("..", 1)
        if not (a.startswith(_DEBIAN) and b.startswith(_DEBIAN)):
            raise UsageError("--kernels A..B: a range is over Debian packages, debian:PKG..debian:PKG")
        return debian_range(a[len(_DEBIAN):], b[len(_DEBIAN):])
    if os.path.isdir(text):
        out = []
        for name in sorted(os.listdir(text), key=_natural_key):
            d = os.path.join(text, name)
            image = next((os.path.join(d, f) for f in ("vmlinux", "bzImage") if os.path.isfile(os.path.join(d, f))), None)
            if image is None:
                continue
            mods = os.path.join(d, "lib", "modules")
            versions = os.listdir(mods) if os.path.isdir(mods) else []
            out.append(KernelChoice(image, os.path.join(mods, versions[0]) if len(versions) == 1 else None))
        if len(out) < 2:
            raise UsageError(f"--kernels {text}: fewer than two kernel directories (each with a vmlinux or bzImage)")
        return out
    specs = [s for s in text.split(",") if s]
    if len(specs) < 2:
        raise UsageError("--kernels: give at least two kernels (A..B, A,B,..., or a directory)")
    return [KernelChoice(s) for s in specs]


def verdict_of(findings: list[dict[str, Any]]) -> str:
    kinds = sorted({f["kind"] for f in findings} & set(VERDICT_KINDS))
    return ",".join(kinds) or "clean"


class Bisection:
    def __init__(self, workload: str, cfg: RunConfig, kernels: list[KernelChoice], out: str) -> None:
        self.workload, self.cfg, self.kernels, self.out = workload, cfg, kernels, out
        self.tested: dict[int, Tested] = {}

    def verdict(self, i: int) -> str:
        if i not in self.tested:
            k = self.kernels[i]
            cfg = RunConfig.parse({**self.cfg.to_json(), "backend": "vm", "kernel": k.spec,
                                   "kernel_modules": k.modules, "quiet": True})
            name = k.spec.replace("/", "_") if k.spec.startswith(_DEBIAN) else os.path.basename(k.spec)
            out = os.path.join(self.out, f"{i:02d}-{name.replace(':', '_')}")
            t0 = time.monotonic()
            try:
                result = run_checked(load_runner(self.workload), cfg, out)
                verdict, n = verdict_of([f.to_json() for f in result.findings]), len(result.findings)
            except PowercutError as e:
                if e.exit_code != 2:
                    raise
                # Without the console's last line: its timestamps differ from boot to boot.
                verdict, n = f"error: {str(e).split(' (last console line')[0][:160]}", 0
            self.tested[i] = Tested(k.spec, verdict, n, round(time.monotonic() - t0, 1), out)
            print(f"powercut bisect: {k.spec}: {verdict}", flush=True)
        return self.tested[i].verdict

    def run(self) -> dict[str, Any]:
        lo, hi = 0, len(self.kernels) - 1
        first = self.verdict(lo)
        changed = None
        if self.verdict(hi) != first:
            # Invariant: kernel lo has the first verdict, kernel hi does not.
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.verdict(mid) == first:
                    lo = mid
                else:
                    hi = mid
            changed = hi
        return {
            "powercut_bisect": 1, "workload": self.workload, "run": self.cfg.to_json(),
            "kernels": [k.spec for k in self.kernels],
            "first_changed": None if changed is None else {
                "kernel": self.kernels[changed].spec, "verdict": self.tested[changed].verdict,
                "previous": self.kernels[changed - 1].spec, "previous_verdict": self.tested[changed - 1].verdict},
            "tested": [asdict(self.tested[i]) | {"index": i} for i in sorted(self.tested)],
        }


def summary(report: dict[str, Any]) -> str:
    lines = [f"powercut bisect: {len(report['tested'])} of {len(report['kernels'])} kernels run"]
    for t in report["tested"]:
        lines.append(f"  {t['kernel']}: {t['verdict']} ({t['seconds']} s)")
    fc = report["first_changed"]
    if fc is None:
        lines.append("no verdict change between the first and the last kernel")
    else:
        lines.append(f"first kernel with a changed verdict: {fc['kernel']} ({fc['verdict']}); "
                     f"before it: {fc['previous']} ({fc['previous_verdict']})")
    return "\n".join(lines)


def write(out: str, report: dict[str, Any]) -> str:
    return write_json(os.path.join(out, "bisect.json"), report)


def from_finding(d: str) -> tuple[str, RunConfig]:
    """A saved finding's workload and the configuration it was found with."""
    try:
        with open(os.path.join(d, "finding.json")) as f:
            info = json.load(f)
        cfg = RunConfig.parse(info["config"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise UsageError(f"{d}: not a saved finding directory ({e})") from None
    return os.path.join(d, "workload.json"), cfg


def from_run_dir(d: str) -> tuple[str, RunConfig]:
    """A `powercut run` directory's workload (workload.json) and the options it ran with."""
    try:
        with open(os.path.join(d, "report.json")) as f:
            r = json.load(f)
        saved = r["workload"]["saved"]
        cfg = RunConfig.parse({"fs": r["fs"], "mkfs_opts": r["mkfs_opts"], "mount_opts": r["mount_opts"],
                               "crash_points": r.get("crash_point_kinds"), "reorder": r.get("reorder", DEFAULT_REORDER),
                               "known_damage_findings": r.get("known_damage_findings", False)})
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise UsageError(f"{d}: not a powercut run directory of a JSON workload ({e})") from None
    return os.path.join(d, saved), cfg


def changed_runs(results: str, against: str) -> list[tuple[str, str]]:
    """(case key, run directory in RESULTS) of every corpus case whose verdict differs from AGAINST's."""
    try:
        with open(results) as f:
            new = json.load(f)
        with open(against) as f:
            old = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"--changed-against: {e}") from None
    base = os.path.dirname(results)
    out = []
    for d in corpus_diff(old, new):
        case = new.get("cases", {}).get(d.key)
        if d.changed and case and case.get("report"):
            out.append((d.key, os.path.dirname(os.path.join(base, case["report"]))))
    return out


def ensure_out(out: str) -> str:
    return ownership.make_dir(out)

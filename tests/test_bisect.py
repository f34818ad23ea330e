"""`powercut bisect` without booting: kernel lists and the binary search over verdicts.
(The e2e bisection over real Debian kernels is in tests/test_vm_fuzz.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common import require_root

from fuzz.bisect import Bisection, KernelChoice, debian_range, kernel_list
from fuzz.bisect import Tested as KernelTried  # (a name starting with "Test" would be collected)
from foundation.errors import UsageError
from harness.backends import debian
from harness.pipeline.config import RunConfig


class Scripted(Bisection):
    """Verdicts from a list instead of runs; remembers which kernels were run."""

    def __init__(self, verdicts: list[str]) -> None:
        super().__init__("w.json", RunConfig(fs="ext4"), [KernelChoice(f"k{i}") for i in range(len(verdicts))], "/nonexistent")
        self.script, self.runs = verdicts, []

    def verdict(self, i: int) -> str:
        if i not in self.runs:
            self.runs.append(i)
        self.tested[i] = KernelTried(f"k{i}", self.script[i], 0, 0.0, "")
        return self.script[i]


@pytest.mark.parametrize("change_at", [1, 2, 5, 9])
def test_binary_search_finds_the_first_changed_kernel_in_log_steps(change_at: int) -> None:
    b = Scripted(["clean"] * change_at + ["durability"] * (10 - change_at))
    r = b.run()
    assert r["first_changed"]["kernel"] == f"k{change_at}" and r["first_changed"]["previous"] == f"k{change_at - 1}"
    assert r["first_changed"]["verdict"] == "durability" and r["first_changed"]["previous_verdict"] == "clean"
    assert b.runs[:2] == [0, 9] and len(b.runs) <= 2 + 4      # ends, then ceil(log2(9)) steps
    assert [t["kernel"] for t in r["tested"]] == [f"k{i}" for i in sorted(b.runs)]


def test_same_verdict_at_both_ends_runs_two_kernels() -> None:
    b = Scripted(["clean"] * 6)
    r = b.run()
    assert r["first_changed"] is None and b.runs == [0, 5]


def test_kernel_lists(tmp_path: Path) -> None:
    assert [k.spec for k in kernel_list("debian:a,/x/vmlinux")] == ["debian:a", "/x/vmlinux"]
    for name in ("k10", "k9"):
        (tmp_path / name / "lib/modules/6.99.0").mkdir(parents=True)
        (tmp_path / name / "vmlinux").write_bytes(b"")
    (tmp_path / "notes").mkdir()
    ks = kernel_list(str(tmp_path))
    assert [Path(k.spec).parent.name for k in ks] == ["k9", "k10"]   # natural order
    assert ks[0].modules == str(tmp_path / "k9/lib/modules/6.99.0")
    with pytest.raises(UsageError, match="at least two"):
        kernel_list("debian:a")
    with pytest.raises(UsageError, match="same flavour"):
        debian_range("linux-image-6.12.117+deb12-amd64", "linux-image-7.2.13+deb14-rt-amd64")
    with pytest.raises(UsageError, match="not a versioned Debian kernel package"):
        debian_range("linux-image-amd64", "linux-image-7.2.13+deb14-amd64")


def released(pattern: str) -> dict[str, str]:
    """Name -> version of every package of powercut's Debian lists whose name matches PATTERN."""
    return debian.newest_versions(debian.search(pattern))


@require_root
def test_debian_range_has_every_package_of_the_series_in_version_order() -> None:
    names = sorted(released(r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$"), key=lambda n: int(n.split(".")[2].split("+")[0]))
    if len(names) < 3:
        pytest.skip("the Debian lists have fewer than three bookworm 6.12 point releases")
    def bookworms(ks: list[KernelChoice]) -> list[str]:  # (trixie's 6.12 of versions between come along)
        return [k.spec for k in ks if k.spec.endswith("+deb12-amd64")]
    assert bookworms(debian_range(names[0], names[-1])) == ["debian:" + n for n in names]
    assert bookworms(debian_range(names[1], names[-2])) == ["debian:" + n for n in names[1:-1]]


@require_root
def test_a_range_across_suites_is_in_dpkgs_order() -> None:
    """bookworm's newest 6.12 .. sid's kernel: every trixie 6.12 between them, ordered as dpkg orders."""
    bookworm = released(r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$")
    trixie = released(r"^linux-image-6\.12\.[0-9]+\+deb13-amd64$")
    sid = released(r"^linux-image-[7-9]\.[0-9]+\.[0-9]+\+deb14-amd64$")
    if not (bookworm and trixie and sid):
        pytest.skip("the Debian lists lack bookworm 6.12, trixie 6.12 or a sid +deb14 kernel")
    versions = {**bookworm, **trixie, **sid}
    first = max(bookworm, key=lambda n: debian.version_key(bookworm[n]))
    last = max(sid, key=lambda n: debian.version_key(sid[n]))
    got = [k.spec.removeprefix("debian:") for k in debian_range(first, last)]
    assert got[0] == first and got[-1] == last
    for a, b in zip(got, got[1:]):   # dpkg itself is the judge of the order
        assert subprocess.run(["dpkg", "--compare-versions", versions[a], "lt", versions[b]]).returncode == 0, (a, b)
    newer_trixie = {n for n, v in trixie.items()
                    if subprocess.run(["dpkg", "--compare-versions", v, "gt", bookworm[first]]).returncode == 0}
    assert newer_trixie and newer_trixie <= set(got)
    assert not any(n.endswith(("-rt-amd64", "-dbg", "-unsigned")) for n in got)


def test_changed_corpus_cases_map_to_their_run_directories(tmp_path: Path) -> None:
    """make ci-kernel bisects the corpus cases whose verdict differs between host and kernel."""
    import json
    from fuzz.bisect import changed_runs
    host = {"cases": {"a@ext4": {"verdict": []}, "b@ext4": {"verdict": []}}}
    kernel = {"cases": {"a@ext4": {"verdict": [], "report": "ext4/a/report.json"},
                        "b@ext4": {"verdict": ["durability"], "report": "ext4/b/report.json"}}}
    (tmp_path / "host.json").write_text(json.dumps(host))
    (tmp_path / "k").mkdir()
    (tmp_path / "k/results.json").write_text(json.dumps(kernel))
    assert changed_runs(str(tmp_path / "k/results.json"), str(tmp_path / "host.json")) == [
        ("b@ext4", str(tmp_path / "k/ext4/b"))]


FAKE_POWERCUT = """#!/bin/sh
# powercut's steps, each exiting with the status the test gives it (the steps are tested elsewhere)
case "$1" in
corpus) [ "$2" = diff ] && exit "$DIFF"; exit 0 ;;
fuzz) exit "$FUZZ" ;;
bisect) echo bisected; exit "$BISECT" ;;
esac
exit 3
"""


@pytest.mark.parametrize("fuzz,diff,bisect,job", [
    (0, 0, 0, 0),   # nothing changed, nothing found
    (1, 0, 0, 1),   # the campaign on the new kernel found something
    (0, 1, 0, 1),   # a verdict changed; bisected, no change inside the range
    (0, 1, 1, 1),   # a verdict changed; bisected to a first kernel
    (0, 1, 2, 2),   # the bisection failed: an error, not a verdict change
    (2, 0, 0, 2),   # the campaign failed
])
def test_kernel_upgrade_job_status_folds_every_step(tmp_path: Path, fuzz: int, diff: int, bisect: int,
                                                    job: int) -> None:
    """ci/kernel-upgrade-job.sh through the real `make ci-kernel` recipe, powercut replaced (MAKEFLAGS)."""
    fake = tmp_path / "powercut"
    fake.write_text(FAKE_POWERCUT)
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "MAKEFLAGS": f"PC={fake}", "KERNEL": "debian:k2", "PREV_KERNEL": "debian:k1",
           "OUT": str(out), "FUZZ": str(fuzz), "DIFF": str(diff), "BISECT": str(bisect)}
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run(["bash", str(root / "ci/kernel-upgrade-job.sh")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == job, p.stdout + p.stderr
    assert ("bisected" in p.stdout) == (diff == 1 and fuzz < 2)
    if diff == 1 and fuzz < 2:
        assert (out / "bisect.rc").read_text().strip() == str(bisect) and "bisected" in (out / "bisect.txt").read_text()

"""The Debian archive as powercut sees it: its own apt configuration, every suite.

The host's apt sources name whatever the host runs (often one release); the
kernel a team ships next is in another suite (trixie, sid, experimental).
powercut therefore keeps its own apt state under CACHE/apt: a sources list
naming every suite in SUITES, its own package lists and package cache. The
host's sources, lists and preferences are never read or changed; the host's
apt.conf.d (proxies, say) still applies. `apt-get update` of powercut's
lists runs on first use and again when they are older than STALE_S; a
failed refresh with lists already there is no error (a cached kernel works
offline).

Versions: `compare_versions` is dpkg's ordering (deb-version(7)), so kernels
from different suites sort as Debian sorts them (6.12.117-1~deb12u1 before
6.12.117-1 before 7.2.13-1).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
from dataclasses import dataclass
from functools import cmp_to_key

from foundation import paths, sysres
from foundation.errors import EnvError

APT_DIR = os.path.join(paths.CACHE, "apt")
MIRROR = os.environ.get("POWERCUT_DEBIAN_MIRROR", "http://deb.debian.org")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Archive -> suites, oldest release first. Security and point-release suites
# carry the newest packages of a stable release (bookworm's 6.12 is in bookworm-security).
SUITES = {
    "debian": ["bookworm", "bookworm-updates", "bookworm-backports", "trixie", "trixie-updates", "sid", "experimental"],
    "debian-security": ["bookworm-security", "trixie-security"],
}
SUITE_NAMES = [s for suites in SUITES.values() for s in suites]
# sid changes every day; a day-old list may name a package the mirror has dropped.
STALE_S = 12 * 3600
_STAMP = "updated"


@dataclass(frozen=True)
class Candidate:
    name: str
    version: str
    suite: str


def _paths() -> dict[str, str]:
    return {k: os.path.join(APT_DIR, k) for k in ("sources.list", "sources.list.d", "preferences.d", "lists", "cache")}


def apt_options() -> list[str]:
    p = _paths()
    return ["-o", f"Dir::Etc::sourcelist={p['sources.list']}", "-o", f"Dir::Etc::sourceparts={p['sources.list.d']}",
            "-o", f"Dir::Etc::preferencesparts={p['preferences.d']}", "-o", f"Dir::State::Lists={p['lists']}",
            "-o", f"Dir::Cache={p['cache']}", "-o", "Acquire::Languages=none",
            # Only the Packages lists: the host's appstream configuration would fetch icons and metadata too.
            *(x for t in ("DEP-11", "DEP-11-icons", "DEP-11-icons-small", "DEP-11-icons-hidpi")
              for x in ("-o", f"Acquire::IndexTargets::deb::{t}::DefaultEnabled=false"))]


def sources_text() -> str:
    return "".join(f"deb [signed-by={KEYRING}] {MIRROR}/{archive} {suite} main\n"
                   for archive, suites in SUITES.items() for suite in suites)


def _write_config() -> None:
    p = _paths()
    for d in ("sources.list.d", "preferences.d", "lists", "cache"):
        os.makedirs(os.path.join(p[d], "partial") if d in ("lists",) else p[d], exist_ok=True)
    os.makedirs(os.path.join(p["cache"], "archives", "partial"), exist_ok=True)
    text = sources_text()
    try:
        with open(p["sources.list"]) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    tmp = f"{p['sources.list']}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, p["sources.list"])
    _forget_update()  # other suites or mirror: the lists are refetched


def _stamp() -> str:
    return os.path.join(APT_DIR, _STAMP)


def _forget_update() -> None:
    try:
        os.unlink(_stamp())
    except FileNotFoundError:
        pass


def _age() -> float | None:
    try:
        return time.time() - os.stat(_stamp()).st_mtime
    except FileNotFoundError:
        return None


def ensure_lists(force: bool = False) -> None:
    """powercut's package lists, fetched if missing, refreshed if stale (or FORCE)."""
    if not os.path.exists(KEYRING):
        raise EnvError(f"{KEYRING} is missing: install debian-archive-keyring")
    os.makedirs(APT_DIR, exist_ok=True)
    with open(os.path.join(APT_DIR, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one update at a time; whoever waited finds fresh lists
        _write_config()
        age = _age()
        if not force and age is not None and age < STALE_S:
            return
        if force and age is not None and age < 60:
            return  # refreshed a moment ago (by a concurrent run): nothing newer to find
        p = sysres.run(["apt-get", *apt_options(), "update", "-q"], check=False, timeout=900)
        failed = p.returncode != 0 or re.search(r"^(E:|W: Failed to fetch)", p.stderr, re.M)
        if failed:
            last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
            if age is None:
                raise EnvError(f"could not fetch the Debian package lists: {last[0]}")
            return  # offline, say: the lists there still name every cached kernel
        with open(_stamp(), "w"):
            pass


def _apt_cache(*args: str) -> str:
    return sysres.run(["apt-cache", *apt_options(), *args], check=False, timeout=300).stdout


def candidates(name: str) -> list[Candidate]:
    """Every version of package NAME the suites have (apt-cache madison), newest first."""
    out = []
    for line in _apt_cache("madison", name).splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[0] == name:
            m = re.search(r"\s(\S+?)/main\b", parts[2])
            out.append(Candidate(name, parts[1], m[1] if m else "?"))
    return sorted(out, key=cmp_to_key(lambda a, b: compare_versions(b.version, a.version)))


def find(name: str, suite: str | None = None, version: str | None = None) -> Candidate | None:
    """The version of NAME to use: VERSION if given, else SUITE's, else apt's candidate
    (the newest of every suite but experimental, which apt only picks when nothing else has it)."""
    ensure_lists()
    found = candidates(name)
    if not found:
        ensure_lists(force=True)  # a package newer than the lists
        found = candidates(name)
    if version is not None:
        found = [c for c in found if c.version == version]
    if suite is not None:
        found = [c for c in found if c.suite == suite]
    if not found:
        return None
    usual = [c for c in found if c.suite != "experimental"]
    return (usual or found)[0]


def newest_versions(names: list[str]) -> dict[str, str]:
    """Package name -> its newest version in any suite, for every one of NAMES some suite has."""
    ensure_lists()
    out: dict[str, str] = {}
    for i in range(0, len(names), 200):  # one apt-cache call per 200 names
        for line in _apt_cache("madison", *names[i:i + 200]).splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and (parts[0] not in out or compare_versions(parts[1], out[parts[0]]) > 0):
                out[parts[0]] = parts[1]
    return out


def show(pkg: Candidate) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in _apt_cache("show", f"{pkg.name}={pkg.version}").split("\n\n")[0].splitlines():
        if ":" in line and not line.startswith(" "):
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def download(pkgs: list[Candidate], into: str) -> list[str]:
    """Fetch the .debs of PKGS into INTO (never installed); their paths."""
    ensure_lists()
    os.chmod(into, 0o755)  # apt's _apt user downloads into it
    sysres.run(["apt-get", *apt_options(), "download", "-q", *(f"{p.name}={p.version}" for p in pkgs)],
               timeout=1800, cwd=into)
    return sorted(os.path.join(into, f) for f in os.listdir(into) if f.endswith(".deb"))


def unpack(pkgs: list[Candidate], dest: str) -> None:
    """PKGS' files under DEST (`dpkg-deb -x`: fetched, never installed); the .debs are not kept."""
    debs = os.path.join(dest, ".debs")
    os.mkdir(debs)
    for deb in download(pkgs, debs):
        sysres.run(["dpkg-deb", "-x", deb, dest], timeout=600)
    shutil.rmtree(debs)


def search(pattern: str) -> list[str]:
    """Names of every package (any suite) whose name matches the regular expression PATTERN."""
    ensure_lists()
    return sorted({line.split(" ", 1)[0] for line in _apt_cache("search", "--names-only", pattern).splitlines()
                   if line.strip()})


# -- deb-version(7) ordering ------------------------------------------------------
def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternating non-digit runs (letters before other characters, ~ first) and numbers."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split(v: str) -> tuple[int, str, str]:
    epoch, _, rest = v.partition(":") if ":" in v else ("0", "", v)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch or 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """<0, 0, >0 as Debian version A sorts before, with or after B."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def version_key(v: str):  # type: ignore[no-untyped-def]
    return cmp_to_key(compare_versions)(v)

"""Campaigns joined by several machines through a real Redis server (fuzz --coordinator).

The "machines" are campaign processes each in its own network namespace,
reaching a redis-server in a namespace of its own over a veth pair: the
addresses exist only inside the namespaces the test creates, which it
deletes afterwards (with the veth pairs). The space is small (9 seq-1
workloads on ext4 through fuse, each with findings: --fault drop-flush).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import common
from test_campaign_report import check_page
from conftest import POWERCUT, PcEnv, needs_root_stack
from fuzz.trial import digest
from netlab import MOUNT_MARK, NETNS_DIR, PORT, Lab, lab, lab_namespaces, mounted, sweep_dead_labs

# One lab at a time: two labs side by side race on the /run/netns mount the last one takes away.
pytestmark = [pytest.mark.e2e, needs_root_stack, pytest.mark.xdist_group("netlab"),
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (make deps)")]

LEASE_S = "10"  # a killed machine's positions go to the others after this long (beats every third of it)
SPACE = ["--fs", "ext4", "--engine", "exhaustive", "--seq", "1", "--core-ops", "creat,unlink,rename",
         "--fault", "drop-flush", "--shrink-seconds", "8", "--duration", "10m", "--jobs", "1"]
SPACE_SIZE = 9


def machine_env(pc: PcEnv, who: str) -> dict[str, str]:
    """Each machine its own state and scratch directories (inside the test's, for the leak check)."""
    env = pc.env(POWERCUT_LEASE_S=LEASE_S)
    env.update(POWERCUT_STATE_DIR=str(pc.state / who), POWERCUT_SCRATCH=str(pc.scratch / who))
    return env


def start(pc: PcEnv, n: Lab, j: int, campaign: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*n.enter(j), *POWERCUT, "fuzz", "--coordinator", n.url(j), "--campaign", campaign,
                             "--out", str(pc.tmp / f"m{j}"), *args], cwd=pc.tmp, env=machine_env(pc, f"m{j}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def in_ns(pc: PcEnv, n: Lab, j: int, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*n.enter(j), *POWERCUT, *args], cwd=pc.tmp, env=machine_env(pc, f"m{j}"),
                          capture_output=True, text=True, timeout=timeout)


def redis_cli(n: Lab, *args: str) -> str:
    return subprocess.run([*n.enter(0), "redis-cli", "-h", n.redis_addr(0), "-p", str(PORT), *args],
                          capture_output=True, text=True, errors="replace", check=True).stdout


def journal(out: Path, worker: str = "*") -> list[dict]:
    """The generated workloads (not shrink runs, not errors) of one machine's campaign directory
    (all its workers, or WORKER's, in the order it ran them)."""
    return [e for e in common.journal(out, worker) if "error" not in e and not e.get("shrink")]


def wait_for(what: str, cond, proc: subprocess.Popen[str] | None = None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert proc is None or proc.poll() is None, f"exited ({proc.returncode}) before {what}: {proc.stdout.read()}"
        time.sleep(0.2)


def finished(p: subprocess.Popen[str], timeout: float = 900) -> tuple[int, str]:
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out


def check_saved_once(merged: Path, machines: list[Path]) -> None:
    """No finding saved twice: each merged finding is the first for one of its signatures,
    and every complete finding directory on any machine is one of them, files and all."""
    findings = sorted((merged / "findings").iterdir())
    report = json.loads((merged / "report.json").read_text())
    assert findings and [d.name for d in findings] == [s["dir"] for s in report["saved_findings"]]
    first_for: set[str] = set()
    for d in findings:
        info = json.loads((d / "finding.json").read_text())
        assert set(info["signatures"]) - first_for, f"{d.name} saved again: {info['signatures']}"
        first_for |= set(info["signatures"])
        assert (d / "reproduce.sh").is_file() and (d / "workload.json").is_file()
        assert (d / "crash.img.tar.gz").is_file() or info["state_id"] is None  # semantics: no crash state
    local = [d.name for m in machines for d in (m / "findings").glob("[0-9]*") if (d / "finding.json").is_file()]
    assert sorted(local) == [d.name for d in findings], (local, findings)


def stable(signatures: list[str]) -> list[str]:
    """SIGNATURES with fsck's messages folded into one: fsck damage (see the three-machine test)."""
    return sorted({"fsck" if s.startswith("fsck|") else s for s in signatures})


def test_three_machines_cover_the_space_once_and_finish_a_killed_ones_share(pc: PcEnv) -> None:
    with lab(pc.tmp, 3) as n:
        procs = [start(pc, n, j, "three", *SPACE) for j in range(3)]
        killed = procs[2]
        # Kill machine 2 once it has run a workload and holds a lease (shrinking or running one).
        prefix = f"-{killed.pid}-"
        def holds_lease() -> list[str]:
            flat = redis_cli(n, "--raw", "hgetall", "powercut:three:leases").split()
            return [flat[i] for i in range(0, len(flat) - 1, 2) if prefix in flat[i + 1]]
        wait_for("machine 2's first workload and a lease", lambda: journal(pc.tmp / "m2") and holds_lease(), killed)
        leased = holds_lease()
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        results = [finished(p) for p in procs[:2]]
        for rc, out in results:
            assert rc in (0, 1), out
        p = in_ns(pc, n, 0, "campaign", "report", n.url(0), "three", "--out", str(pc.tmp / "merged"))
        assert p.returncode == 1, p.stdout + p.stderr
        merged = json.loads((pc.tmp / "merged" / "report.json").read_text())
        status = in_ns(pc, n, 1, "campaign", "status", n.url(1), "three")
    assert status.returncode == 0 and "gone" in status.stdout and "leases outstanding: 0" in status.stdout, status.stdout

    # Every position once: recorded in Redis, and run by exactly one survivor or by the killed machine.
    assert merged["exhaustive"] == {"seq": 1, "space": SPACE_SIZE, "done": SPACE_SIZE}, merged
    assert merged["joined"]["leases_outstanding"] == 0 and merged["joined"]["duplicate_runs"] == 0, merged["joined"]
    assert merged["workloads"] == SPACE_SIZE
    ran = [[e["index"] for e in journal(pc.tmp / f"m{j}")] for j in range(3)]
    a, b, c = (set(r) for r in ran)
    assert all(len(r) == len(set(r)) for r in ran), ran
    assert not a & b and a | b | c == set(range(SPACE_SIZE)), ran
    # The killed machine's unfinished position was run again by a survivor, and only that one.
    assert (a | b) & c <= {ran[2][-1]}, ran
    assert leased and all(int(pos) in a | b for pos in leased), (leased, ran)

    check_saved_once(pc.tmp / "merged", [pc.tmp / f"m{j}" for j in range(3)])

    # The same space on one machine shows the same signatures. fsck's wording of the damage a
    # dropped flush leaves depends on what writeback had issued by the crash point, which varies
    # from run to run (one run's "unused inodes area" is another's "deleted/unused inode"): those
    # count as one signature, fsck damage; every other signature (kind, op, rule) must match.
    single = pc.run("fuzz", "--out", str(pc.tmp / "single"), *SPACE, timeout=900)
    assert single.returncode == 1, single.stdout + single.stderr
    alone = json.loads((pc.tmp / "single" / "report.json").read_text())
    assert stable(merged["signatures_found"]) == stable(alone["signatures_found"])
    assert alone["exhaustive"]["done"] == SPACE_SIZE


def test_unreachable_coordinator_is_one_line_and_exit_2(pc: PcEnv) -> None:
    p = pc.run("fuzz", *SPACE, "--coordinator", "redis://127.0.0.1:1/0", "--campaign", "x",
               "--out", str(pc.tmp / "c"), timeout=120)
    assert p.returncode == 2 and "unreachable" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (pc.tmp / "c").exists()


def test_a_machine_cut_off_keeps_its_work_and_rejoins(pc: PcEnv) -> None:
    with lab(pc.tmp, 1) as n:
        p = start(pc, n, 0, "cut", *SPACE)
        wait_for("the first workload", lambda: journal(pc.tmp / "m0"), p)
        n.link(0, up=False)
        rc, out = finished(p)
        assert rc == 2 and "rejoins the campaign" in out, out
        kept = journal(pc.tmp / "m0")
        assert kept and json.loads((pc.tmp / "m0" / "report.json").read_text())["stop_reason"] == "coordinator-lost"
        n.link(0, up=True)
        again = in_ns(pc, n, 0, "fuzz", "--resume", str(pc.tmp / "m0"))
        assert again.returncode in (0, 1), again.stdout + again.stderr
        report = in_ns(pc, n, 0, "campaign", "report", n.url(0), "cut", "--out", str(pc.tmp / "merged"))
        merged = json.loads((pc.tmp / "merged" / "report.json").read_text())
    assert merged["exhaustive"]["done"] == SPACE_SIZE, report.stdout + report.stderr
    # What ran while cut off counts (recorded at the rejoin), and nothing ran twice.
    indices = [e["index"] for e in journal(pc.tmp / "m0")]
    assert sorted(indices) == list(range(SPACE_SIZE)), indices
    assert merged["workloads"] == SPACE_SIZE


def test_mismatched_options_are_refused(pc: PcEnv) -> None:
    with lab(pc.tmp, 1) as n:
        p = start(pc, n, 0, "mm", *SPACE, "--max-workloads", "1")
        assert finished(p)[0] in (0, 1)
        other = in_ns(pc, n, 0, "fuzz", "--coordinator", n.url(0), "--campaign", "mm", *SPACE,
                      "--mount-opts", "nodelalloc", "--out", str(pc.tmp / "other"))
    assert other.returncode == 2 and "run.mount_opts" in other.stderr, other.stderr
    assert len(other.stderr.strip().splitlines()) == 1 and not (pc.tmp / "other").exists()


# fsck damage is unjournaled ext4's known behaviour, asked for as findings here (without
# --known-damage-findings it is counted, never saved, and machine 0 runs its whole 10 minutes).
# Shrinking plays no part in what is checked: 2 s of it.
UNJOURNALED = ["--fs", "ext4", "--mkfs-opts", "-O ^has_journal", "--known-damage-findings", "--crash-points", "write",
               "--shrink-seconds", "2", "--duration", "10m", "--jobs", "1"]


def test_hypothesis_machines_share_examples_and_one_set_of_findings(pc: PcEnv) -> None:
    """Machine 0 saves a finding; machine 1, joining later, replays that failing example first
    (Hypothesis' example database in the coordinator's Redis) and saves nothing of its own."""
    with lab(pc.tmp, 2) as n:
        rc, out = finished(start(pc, n, 0, "hyp", *UNJOURNALED, "--seed", "1", "--max-findings", "1"))
        assert rc == 1, out
        assert redis_cli(n, "--raw", "keys", "powercut:hyp:hyp:*").split(), "no example in the shared database"
        rc, out = finished(start(pc, n, 1, "hyp", *UNJOURNALED, "--seed", "2", "--max-workloads", "1"))
        assert rc in (0, 1), out
        p = in_ns(pc, n, 0, "campaign", "report", n.url(0), "hyp", "--out", str(pc.tmp / "merged"))
        assert p.returncode == 1, p.stdout + p.stderr
    # Machine 0 saved one finding (the worker that saves the --max-findings-th stops the campaign
    # before its next workload), so the database holds one failing example: machine 1 ran it first.
    found = [json.loads(p.read_text()) for p in (pc.tmp / "m0" / "findings").glob("*/finding.json")]
    assert len(found) == 1, found
    first = journal(pc.tmp / "m1")[0]
    assert first["digest"] == digest(found[0]["original_workload"]), (first, found)
    # ... and what it saved, if anything, is a signature nobody had saved: one set of findings.
    check_saved_once(pc.tmp / "merged", [pc.tmp / "m0", pc.tmp / "m1"])
    merged = json.loads((pc.tmp / "merged" / "report.json").read_text())
    assert merged["workloads"] == len(journal(pc.tmp / "m0")) + 1
    check_page(pc.tmp / "merged", merged)  # its report.md: one row per saved finding, its figure drawn


@pytest.mark.skipif(shutil.which("afl-fuzz") is None, reason="afl++ not installed (`make afl`)")
def test_afl_instances_have_unique_names_and_share_queues_through_redis(pc: PcEnv) -> None:
    with lab(pc.tmp, 2) as n:
        procs = [start(pc, n, j, "afl", "--fs", "ext4", "--engine", "afl", "--duration", "40s", "--seed", str(j))
                 for j in range(2)]
        for p in procs:
            rc, out = finished(p)
            assert rc == 0, out
    own = [sorted(r for r in json.loads((pc.tmp / f"m{j}" / "report.json").read_text())["afl"]) for j in range(2)]
    assert len(own[0]) == len(own[1]) == 1 and own[0] != own[1], own
    mains = [" -M " in (pc.tmp / f"m{j}" / "afl" / own[j][0] / "fuzzer_stats").read_text() for j in range(2)]
    assert sorted(mains) == [False, True], mains  # one -M for the whole campaign
    for j in range(2):
        theirs, mine = own[1 - j][0], pc.tmp / f"m{j}" / "afl"
        queue = pc.tmp / f"m{1 - j}" / "afl" / theirs / "queue"
        sent = {f.name: f.read_bytes() for f in queue.iterdir() if f.name.startswith("id:")}
        got = {f.name: f.read_bytes() for f in (mine / theirs / "queue").iterdir()}
        assert sent and set(got) <= set(sent) and all(got[k] == sent[k] for k in got), (sorted(got), sorted(sent))
        assert len(got) >= len([k for k in sent if "orig:" in k])  # at least the seeds' entries arrived


KILLED_LAB = """
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from netlab import lab
with lab(Path(sys.argv[2]), 1) as n:
    print(n.name, flush=True)
    time.sleep(600)
"""


def test_a_killed_lab_is_swept_by_the_next_one(pc: PcEnv) -> None:
    """A lab whose process is killed (-9: no finally runs) leaves its namespaces, its
    redis-server and the /run/netns mount; the next lab takes them all away."""
    sweep_dead_labs()  # a dead lab's mount is the sweep's to take, not part of `before`
    before = mounted(NETNS_DIR)
    child = subprocess.Popen([sys.executable, "-c", KILLED_LAB, str(Path(__file__).parent), str(pc.tmp)],
                             stdout=subprocess.PIPE, text=True)
    name = child.stdout.readline().strip() if child.stdout else ""
    assert name, "the killed lab did not come up"
    left = subprocess.run(["ip", "netns", "pids", f"{name}-r"], capture_output=True, text=True).stdout.split()
    assert left, "no redis-server in the lab's namespace"
    child.kill()
    child.wait()
    assert any(ns.startswith(name + "-") for ns, _ in lab_namespaces())  # the kill left them behind
    with lab(pc.tmp, 1) as n:
        assert not any(ns.startswith(name + "-") for ns, _ in lab_namespaces())
        assert os.path.exists(os.path.join(NETNS_DIR, n.ns(0)))
    assert not [p for p in left if common.running(p)], "the dead lab's redis-server still runs"
    assert mounted(NETNS_DIR) == before and not MOUNT_MARK.exists()


def test_the_lab_leaves_no_namespace_and_no_netns_mount(pc: PcEnv) -> None:
    # `ip netns add` bind-mounts /run/netns the first time; a lab that caused it must undo it.
    sweep_dead_labs()  # a dead lab's mount is the sweep's to take, not part of `before`
    before = mounted(NETNS_DIR)
    with lab(pc.tmp, 1) as n:
        assert mounted(NETNS_DIR) and os.path.exists(os.path.join(NETNS_DIR, n.ns(0)))
    assert mounted(NETNS_DIR) == before
    assert not os.path.exists(os.path.join(NETNS_DIR, n.ns(0)))


def test_mixed_machines_claim_the_space_and_share_hypothesis_examples(pc: PcEnv) -> None:
    """--engine mixed, two machines of two workers: the even workers claim the ordered space's
    positions through the coordinator (together once each), the odd ones run Hypothesis on the
    campaign's example database in Redis: machine 1, started once machine 0's Hypothesis half
    saved a finding, replays that failing example first."""
    mixed = ["--fs", "ext4", "--engine", "mixed", "--seq", "1", "--core-ops", "creat,unlink,rename",
             "--fault", "drop-flush", "--shrink-seconds", "8", "--duration", "30m", "--jobs", "2"]
    with lab(pc.tmp, 2) as n:
        m0 = start(pc, n, 0, "mx", *mixed, "--seed", "1")
        wait_for("a failing example of machine 0's Hypothesis half in Redis",
                 lambda: redis_cli(n, "--raw", "keys", "powercut:mx:hyp:*").split(), m0)
        m1 = start(pc, n, 1, "mx", *mixed, "--seed", "2")
        wait_for("the whole space done and a Hypothesis workload of machine 1",
                 lambda: int(redis_cli(n, "hlen", "powercut:mx:done")) == SPACE_SIZE
                 and journal(pc.tmp / "m1", "w1"), m1)
        for p in (m0, m1):  # mixed generates on after the space: the user stops it
            p.send_signal(signal.SIGINT)
        for p in (m0, m1):
            rc, out = finished(p)
            assert rc == 130, out
        p = in_ns(pc, n, 0, "campaign", "report", n.url(0), "mx", "--out", str(pc.tmp / "merged"))
        assert p.returncode == 1, p.stdout + p.stderr
    merged = json.loads((pc.tmp / "merged" / "report.json").read_text())
    assert merged["engine"] == "mixed" and merged["exhaustive"]["done"] == SPACE_SIZE, merged
    assert merged["joined"]["leases_outstanding"] == 0 and merged["joined"]["duplicate_runs"] == 0, merged["joined"]

    # The space: each position run by one machine's even worker, once.
    walked = [[e["index"] for e in journal(pc.tmp / f"m{j}", "w0") if e["engine"] == "exhaustive"]
              for j in range(2)]
    assert sorted(walked[0] + walked[1]) == list(range(SPACE_SIZE)), walked
    assert all(e["engine"] == "hypothesis" for j in range(2) for e in journal(pc.tmp / f"m{j}", "w1"))

    # Machine 1's Hypothesis half began with a failing example machine 0's Hypothesis half saved.
    found = {digest(f["original_workload"]) for f in
             (json.loads(p.read_text()) for p in (pc.tmp / "m0" / "findings").glob("*/finding.json"))
             if f["original_workload"]["name"].startswith("hyp-")}
    first = journal(pc.tmp / "m1", "w1")[0]
    assert first["digest"] in found, (first, sorted(found))
    check_saved_once(pc.tmp / "merged", [pc.tmp / "m0", pc.tmp / "m1"])

"""A campaign several machines join, coordinated through one Redis server.

Every machine runs the same `powercut fuzz ... --coordinator redis://HOST:PORT/N
--campaign NAME`. Keys live under powercut:NAME: (a plain Redis server, not
a Cluster: the scripts below touch keys they compute):

    config          the campaign's options, written by the first machine (SET NX)
    machines        machine id -> who it is (host, pid, jobs, when it joined)
    alive:M         machine M's heartbeat (a key that expires: LEASE_S)
    stats           machine id -> its latest totals (workloads, crash states, rate)
    next            exhaustive: positions handed out so far (INCR)
    leases          exhaustive: position -> machine running it
    done            exhaustive: position -> the journal entry of its one recorded run
    tries, failed   exhaustive: harness failures per position; positions given up on
    duplicates      runs whose position another machine had recorded first
    journal         journal entries that are not positions (hypothesis, afl, shrink runs, errors)
    claims          signature key -> machine shrinking it
    saved           signature key -> finding number
    findings        finding number -> finding.json (with the machine and directory name)
    files:N         finding N's directory as tar.gz (up to --coordinator-file-limit)
    seq             finding numbers handed out (INCR)
    hyp:            Hypothesis' example database (hypothesis.extra.redis)

A lease belongs to a machine and lives as long as its heartbeat key: a
machine that stops renewing it (killed, powered off, cut off) loses all its
leases at once and the next claim hands them to a live machine. Whether a
position is done is decided in Redis, atomically (Lua), so each position is
recorded once however many machines ran it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlparse

import redis

from foundation.errors import EnvError, UsageError

LEASE_S = float(os.environ.get("POWERCUT_LEASE_S", "30"))   # a machine silent this long is gone
TIMEOUT_S = 5.0                                             # one Redis call, connecting included
# A finding's files are stored in Redis up to this many bytes (bigger: recorded without them).
FILE_LIMIT = int(float(os.environ.get("POWERCUT_FILE_LIMIT_MIB", "64")) * (1 << 20))

# What every machine must agree on: the run configuration and the engine's options
# (per-machine and per-session options are left out: duration, jobs, seed, limits, AFL names).
PER_MACHINE_OPTIONS = ("shard", "hypothesis_db", "afl_sync_dir", "afl_prefix", "afl_secondary", "shrink_seconds",
                       "shrink_match", "joined")

# claim(prefix, machine, space) -> {how, position}: how 0 new, 1 taken over from a dead
# machine, 2 wait (all handed out, some still leased by live machines), 3 all done.
_CLAIM = """
local p, me, space = ARGV[1], ARGV[2], tonumber(ARGV[3])
local leases = redis.call('HGETALL', p .. 'leases')
local busy = false
for i = 1, #leases, 2 do
  if redis.call('EXISTS', p .. 'alive:' .. leases[i + 1]) == 0 then
    redis.call('HSET', p .. 'leases', leases[i], me)
    return {1, tonumber(leases[i])}
  end
  busy = true
end
local retry = redis.call('LPOP', p .. 'retry')
if retry then
  redis.call('HSET', p .. 'leases', retry, me)
  return {1, tonumber(retry)}
end
if tonumber(redis.call('GET', p .. 'next') or '0') < space then
  local k = redis.call('INCR', p .. 'next') - 1
  redis.call('HSET', p .. 'leases', k, me)
  return {0, k}
end
if busy then return {2, -1} end
return {3, -1}
"""

# complete(prefix, machine, position, entry) -> 1 recorded, 0 someone recorded it first
_COMPLETE = """
local p, me, pos = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HGET', p .. 'leases', pos) == me then redis.call('HDEL', p .. 'leases', pos) end
if redis.call('HEXISTS', p .. 'done', pos) == 1 then
  redis.call('INCR', p .. 'duplicates')
  return 0
end
redis.call('HSET', p .. 'done', pos, ARGV[4])
redis.call('HDEL', p .. 'leases', pos)
return 1
"""

# release(prefix, machine, position, error, max_tries): a harness failure; the position goes
# back to the queue until it has failed max_tries times, then it is given up (failed).
_RELEASE = """
local p, me, pos = ARGV[1], ARGV[2], ARGV[3]
redis.call('HDEL', p .. 'leases', pos)
if redis.call('HEXISTS', p .. 'done', pos) == 1 then return 0 end
if redis.call('HINCRBY', p .. 'tries', pos, 1) >= tonumber(ARGV[5]) then
  redis.call('HSET', p .. 'failed', pos, ARGV[4])
  return 0
end
redis.call('RPUSH', p .. 'retry', pos)
return 1
"""

# claim_signature(prefix, machine, key) -> 1 if this machine is now the one to shrink KEY
_CLAIM_SIG = """
local p, me, key = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HEXISTS', p .. 'saved', key) == 1 then return 0 end
local owner = redis.call('HGET', p .. 'claims', key)
if owner and owner ~= me and redis.call('EXISTS', p .. 'alive:' .. owner) == 1 then return 0 end
redis.call('HSET', p .. 'claims', key, me)
return 1
"""

# save_finding(prefix, machine, number, finding_json, keys...) -> 1; 0 if all KEYS were saved already
_SAVE = """
local p, me, n = ARGV[1], ARGV[2], ARGV[3]
local new = 0
for i = 5, #ARGV do
  if redis.call('HSETNX', p .. 'saved', ARGV[i], n) == 1 then new = 1 end
  redis.call('HDEL', p .. 'claims', ARGV[i])
end
if new == 0 then return 0 end
redis.call('HSET', p .. 'findings', n, ARGV[4])
return 1
"""


def identity(run: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """What machines joining one campaign must agree on, as JSON would give it back."""
    options = {k: v for k, v in spec["options"].items() if k not in PER_MACHINE_OPTIONS}
    return dict(json.loads(json.dumps({"run": run, "engine": spec["engine"], "options": options}, sort_keys=True)))


def differences(a: dict[str, Any], b: dict[str, Any], where: str = "") -> list[str]:
    """The (dotted) keys whose values differ between A and B."""
    out = []
    for k in sorted({*a, *b}):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += differences(x, y, f"{where}{k}.")
        elif x != y:
            out.append(f"{where}{k}")
    return out


class CoordinatorLost(EnvError):
    """Redis stopped answering mid-campaign."""


@dataclass
class Claim:
    how: int          # NEW, TAKEN_OVER, WAIT, ALL_DONE
    position: int


NEW, TAKEN_OVER, WAIT, ALL_DONE = 0, 1, 2, 3


def check_url(url: str) -> str:
    u = urlparse(url)
    if u.scheme not in ("redis", "rediss") or not u.hostname:
        raise UsageError(f"--coordinator {url}: expected redis://[:PASSWORD@]HOST:PORT/N (rediss:// for TLS)")
    return url


class Coordinator:
    """One machine's connection to the campaign NAME on the Redis server at URL."""

    def __init__(self, url: str, name: str, machine: str | None = None) -> None:
        if not name or any(c in name for c in " :\n{}"):
            raise UsageError(f"--campaign {name!r}: a name without spaces, colons or braces")
        self.url, self.name = check_url(url), name
        self.prefix = f"powercut:{name}:"
        self.machine = machine or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        try:
            self.r = redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
        except ValueError as e:  # a port or database that is not a number
            raise UsageError(f"--coordinator {url}: {e}") from e
        self._scripts = {n: self.r.register_script(s) for n, s in
                         (("claim", _CLAIM), ("complete", _COMPLETE), ("release", _RELEASE),
                          ("claim_sig", _CLAIM_SIG), ("save", _SAVE))}

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        """FN's Redis calls, with a lost connection said in one line."""
        try:
            return fn()
        except redis.RedisError as e:
            raise CoordinatorLost(f"coordinator {self.url} {what}: {e}") from e

    def _script(self, name: str, *args: Any) -> Any:
        return self.call(name, lambda: self._scripts[name](args=[self.prefix, self.machine, *args]))

    # -- joining ---------------------------------------------------------------
    def ping(self) -> None:
        try:
            self.r.ping()
        except redis.RedisError as e:
            raise EnvError(f"coordinator {self.url} unreachable: {e}") from e

    def join(self, config: dict[str, Any], jobs: int) -> dict[str, Any]:
        """Record CONFIG as the campaign's, or check it against the one recorded; register this machine."""
        self.ping()
        config = dict(json.loads(json.dumps(config)))
        text = json.dumps(config, sort_keys=True)
        self.call("join", lambda: self.r.set(self.key("config"), text, nx=True))
        recorded = json.loads(self.call("join", lambda: self.r.get(self.key("config"))))
        diff = differences(recorded, config)
        if diff:
            raise UsageError(f"campaign {self.name} on {self.url} was started with other options "
                             f"({', '.join(diff)}): use the same ones, or another --campaign name")
        self.heartbeat()
        info = {"host": socket.gethostname(), "pid": os.getpid(), "jobs": jobs, "joined": time.time()}
        self.call("join", lambda: self.r.hset(self.key("machines"), self.machine, json.dumps(info)))
        return recorded

    def config(self) -> dict[str, Any] | None:
        text = self.call("read", lambda: self.r.get(self.key("config")))
        return None if text is None else dict(json.loads(text))

    def heartbeat(self) -> None:
        self.call("heartbeat", lambda: self.r.set(self.key("alive", self.machine), "1", px=int(LEASE_S * 1000)))

    def leave(self) -> None:
        """A machine that stops cleanly gives its leases back at once."""
        self.call("leave", lambda: self.r.delete(self.key("alive", self.machine)))

    def publish(self, totals: dict[str, Any]) -> None:
        self.call("publish", lambda: self.r.hset(self.key("stats"), self.machine,
                                                 json.dumps({**totals, "t": time.time()})))

    # -- exhaustive positions --------------------------------------------------
    def claim(self, space: int) -> Claim:
        how, pos = self._script("claim", space)
        return Claim(int(how), int(pos))

    def complete(self, position: int, entry: dict[str, Any]) -> bool:
        return bool(self._script("complete", position, json.dumps({**entry, "machine": self.machine})))

    def release(self, position: int, error: str, max_tries: int) -> bool:
        return bool(self._script("release", position, error, max_tries))

    def done_entries(self) -> list[dict[str, Any]]:
        return [json.loads(v) for v in self.call("read", lambda: self.r.hvals(self.key("done")))]

    def done_positions(self) -> set[int]:
        return {int(k) for k in self.call("read", lambda: self.r.hkeys(self.key("done")))}

    # -- other journal entries -----------------------------------------------
    def append(self, entry: dict[str, Any]) -> None:
        self.call("journal", lambda: self.r.rpush(self.key("journal"), json.dumps({**entry, "machine": self.machine})))

    def journal(self) -> list[dict[str, Any]]:
        return [json.loads(v) for v in self.call("read", lambda: self.r.lrange(self.key("journal"), 0, -1))]

    # -- findings ----------------------------------------------------------------
    def claim_signature(self, key: str) -> bool:
        return bool(self._script("claim_sig", key))

    def known_signatures(self) -> set[str]:
        """Signature keys saved, or claimed by a live machine (being shrunk)."""
        def read() -> set[str]:
            claims = self.r.hgetall(self.key("claims"))
            alive = {m for m in set(claims.values()) if self.r.exists(self.key("alive", m.decode()))}
            return {k.decode() for k in self.r.hkeys(self.key("saved"))} | \
                {k.decode() for k, m in claims.items() if m in alive}
        return set(self.call("read", read))

    def next_finding_number(self) -> int:
        return int(self.call("save", lambda: self.r.incr(self.key("seq"))))

    def save_finding(self, number: int, info: dict[str, Any], keys: list[str], tarball: bytes | None) -> bool:
        """Record finding NUMBER (its finding.json INFO, its files as TARBALL) unless every one
        of its signature KEYS was saved already (then False: it is another machine's)."""
        if tarball is not None:
            self.call("save", lambda: self.r.set(self.key("files", str(number)), tarball))
        ok = bool(self._script("save", number, json.dumps(info), *keys))
        if not ok and tarball is not None:
            self.call("save", lambda: self.r.delete(self.key("files", str(number))))
        return ok

    def findings(self) -> dict[int, dict[str, Any]]:
        raw = self.call("read", lambda: self.r.hgetall(self.key("findings")))
        return {int(k): json.loads(v) for k, v in sorted(raw.items(), key=lambda kv: int(kv[0]))}

    def finding_files(self, number: int) -> bytes | None:
        data = self.call("read", lambda: self.r.get(self.key("files", str(number))))
        return bytes(data) if data is not None else None

    # -- the whole, for `powercut campaign` ------------------------------------
    def snapshot(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            machines = {k.decode(): json.loads(v) for k, v in self.r.hgetall(self.key("machines")).items()}
            stats = {k.decode(): json.loads(v) for k, v in self.r.hgetall(self.key("stats")).items()}
            alive = {m for m in machines if self.r.exists(self.key("alive", m))}
            return {"machines": machines, "stats": stats, "alive": alive,
                    "leases": self.r.hlen(self.key("leases")), "done": self.r.hlen(self.key("done")),
                    "failed": self.r.hlen(self.key("failed")), "duplicates": int(self.r.get(self.key("duplicates")) or 0),
                    "findings": self.r.hlen(self.key("findings"))}
        return dict(self.call("read", read))


class Heartbeat:
    """Renews this machine's heartbeat every LEASE_S/3 from a thread, and publishes the
    totals TOTALS() gives; the first Redis failure is kept in .lost (the campaign stops)."""

    def __init__(self, coord: Coordinator, totals: Callable[[], dict[str, Any]]) -> None:
        self.coord, self.totals = coord, totals
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="powercut-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(LEASE_S / 3):
            try:
                self.coord.heartbeat()
            except CoordinatorLost as e:
                self.lost = str(e)
                return
            try:  # the totals are for `campaign status` only: a failure here must not stop the heartbeat
                self.coord.publish(self.totals())
            except Exception:  # the next beat tries again
                continue

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

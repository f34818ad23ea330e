"""AFL++ queues shared through the coordinator's Redis (a joined campaign, --engine afl).

AFL++ instances sync by reading every other instance's queue/ in their
common sync directory. In a joined campaign the machines have no common
directory: each worker uploads the new inputs of its own instance's queue
to Redis (one hash per instance), and writes the other machines'
instances' inputs into its sync directory under their names, where its
afl-fuzz imports them as if they ran next door. Instance names carry the
machine's tag, so they are unique across machines.
"""

from __future__ import annotations

import os

from foundation import ownership
from fuzz.coordinator import Coordinator


def machine_tag(coord: Coordinator) -> str:
    """A short, name-safe tag of this machine for AFL++ instance names."""
    return coord.machine.rsplit("-", 1)[-1]


def claim_main(coord: Coordinator, instance: str) -> bool:
    """True for the one instance of the campaign that runs as AFL++'s main (-M)."""
    return bool(coord.call("afl", lambda: coord.r.set(coord.key("afl", "main"), instance, nx=True))) or \
        coord.call("afl", lambda: coord.r.get(coord.key("afl", "main"))) == instance.encode()


class QueueSync:
    def __init__(self, coord: Coordinator, sync_dir: str, instance: str) -> None:
        self.coord, self.sync_dir, self.instance = coord, sync_dir, instance
        self.tag = machine_tag(coord)
        self.sent: set[str] = set()
        self.got: dict[str, set[str]] = {}
        coord.call("afl", lambda: coord.r.sadd(coord.key("afl", "instances"), instance))

    def __call__(self) -> None:
        self.upload()
        self.download()

    def upload(self) -> None:
        queue = os.path.join(self.sync_dir, self.instance, "queue")
        new = sorted(n for n in os.listdir(queue) if n.startswith("id:") and n not in self.sent) \
            if os.path.isdir(queue) else []
        for name in new:
            with open(os.path.join(queue, name), "rb") as f:
                data = f.read()
            self.coord.call("afl", lambda: self.coord.r.hset(self.coord.key("afl", "queue", self.instance), name, data))
            self.sent.add(name)

    def download(self) -> None:
        r, key = self.coord.r, self.coord.key
        others = [m.decode() for m in self.coord.call("afl", lambda: r.smembers(key("afl", "instances")))]
        for other in sorted(others):
            if self.tag in other:  # this machine's instances share the directory already
                continue
            got = self.got.setdefault(other, set())
            names = [n.decode() for n in self.coord.call("afl", lambda: r.hkeys(key("afl", "queue", other)))]
            queue = os.path.join(self.sync_dir, other, "queue")
            for name in sorted(set(names) - got):
                data = self.coord.call("afl", lambda: r.hget(key("afl", "queue", other), name))
                if not os.path.isdir(queue):
                    ownership.make_dir(os.path.dirname(queue))
                    ownership.make_dir(queue)
                tmp = os.path.join(self.sync_dir, other, f".{name}.tmp")
                with open(tmp, "wb") as f:
                    f.write(data or b"")
                os.replace(tmp, os.path.join(queue, name))  # afl-fuzz never reads half a file
                got.add(name)

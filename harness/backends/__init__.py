"""Backends, by name: how a run's recording is made and who recovers crash images.

Each backend is an engine in one registry (engine.py): `fuse` and `dm` are
RecordedDevices the host makes the file system on (harness/backends/session.py):
pc-recorder's FUSE stand-in, or the host kernel's own dm-log-writes
(harness/backends/dm/). `vm` runs the whole recording in a QEMU guest with the
guest kernel's dm-log-writes and lets that kernel recover the crash images
(harness/backends/vm/). `auto` chooses dm where the host has it, fuse elsewhere.
Importing this package registers them, in the order `--backend` lists them.
"""

from __future__ import annotations

from harness.backends.engine import (ENGINES, Backend, BackendConfig, BackendOpener, Engine,  # noqa: F401
                                     KeptGuest, configure, engine)
# Registration, in this order:
from harness.backends.fuse import engine as _fuse  # noqa: F401,E402
from harness.backends.dm import engine as _dm  # noqa: F401,E402
from harness.backends.vm import engine as _vm  # noqa: F401,E402
from harness.backends import auto as _auto  # noqa: F401,E402

BACKENDS = tuple(ENGINES)

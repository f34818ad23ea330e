"""mount and umount as system calls: no mount(8) process per crash state.

Uses the new mount API (fsopen/fsconfig/fsmount/move_mount, glibc >= 2.36)
because, unlike mount(2), it hands back the file system's own error message
("ext4: ..."), which is the evidence a `mount` finding needs.

Mount options are split the way mount(8) splits them: per-mount attributes
(noatime, nosuid, ...) become fsmount() attribute flags, everything else
(barrier=0, data=writeback, ro, ...) is passed to the file system.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time

from foundation.errors import EnvError

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fsopen.argtypes = (ctypes.c_char_p, ctypes.c_uint)
_libc.fsconfig.argtypes = (ctypes.c_int, ctypes.c_uint, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int)
_libc.fsmount.argtypes = (ctypes.c_int, ctypes.c_uint, ctypes.c_uint)
_libc.move_mount.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)

FSOPEN_CLOEXEC = 1
FSMOUNT_CLOEXEC = 1
FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
MOVE_MOUNT_F_EMPTY_PATH = 4
AT_FDCWD = -100
UMOUNT_BUSY_S = 0.5

# Per-mount attributes (MOUNT_ATTR_*): not file-system options.
MOUNT_ATTRS = {
    "nosuid": 0x2, "nodev": 0x4, "noexec": 0x8, "noatime": 0x10, "strictatime": 0x20,
    "relatime": 0x0, "nodiratime": 0x80,
}
_IGNORED = {"defaults", "suid", "dev", "exec", "atime", "diratime", "auto", "noauto"}


class MountError(Exception):
    """The kernel refused the mount; str() is the file system's own message, errno its errno."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _kernel_messages(fsfd: int) -> list[str]:
    """Messages the file system logged into the fs context ("e ext4: ...")."""
    out = []
    while True:
        try:
            msg = os.read(fsfd, 4096)
        except OSError:  # ENODATA: no more messages
            return out
        out.append(msg.decode(errors="replace").strip()[2:])


def split_options(opts: str) -> tuple[list[str], int]:
    """File-system options and the fsmount() attribute flags of a -o string."""
    fs_opts, attrs = [], 0
    for opt in (o.strip() for o in opts.split(",")):
        if not opt or opt in _IGNORED:
            continue
        if opt in MOUNT_ATTRS:
            attrs |= MOUNT_ATTRS[opt]
        else:
            fs_opts.append(opt)
    return fs_opts, attrs


def mount(source: str, target: str, fstype: str, opts: str = "") -> None:
    """Mount SOURCE on TARGET; raise MountError with the kernel's reason."""
    fs_opts, attrs = split_options(opts)
    fsfd = _libc.fsopen(fstype.encode(), FSOPEN_CLOEXEC)
    if fsfd < 0:
        raise EnvError(str(_err(f"fsopen({fstype})")))
    try:
        _config(fsfd, "source", source)
        for opt in fs_opts:
            key, eq, value = opt.partition("=")
            _config(fsfd, key, value if eq else None)
        if _libc.fsconfig(fsfd, FSCONFIG_CMD_CREATE, None, None, 0) < 0:
            raise _mount_error(fsfd, "mount")
        mfd = _libc.fsmount(fsfd, FSMOUNT_CLOEXEC, attrs)
        if mfd < 0:
            raise _mount_error(fsfd, "fsmount")
        try:
            if _libc.move_mount(mfd, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH) < 0:
                raise EnvError(str(_err(f"move_mount to {target}")))
        finally:
            os.close(mfd)
    finally:
        os.close(fsfd)


def _config(fsfd: int, key: str, value: str | None) -> None:
    cmd = FSCONFIG_SET_FLAG if value is None else FSCONFIG_SET_STRING
    if _libc.fsconfig(fsfd, cmd, key.encode(), None if value is None else value.encode(), 0) < 0:
        raise _mount_error(fsfd, f"option {key}{'' if value is None else '=' + value}")


def _mount_error(fsfd: int, what: str) -> MountError:
    e = ctypes.get_errno()
    msgs = _kernel_messages(fsfd)
    return MountError("; ".join(msgs + [f"{what}: {os.strerror(e)}"]), e)


def umount(target: str) -> None:
    """Unmount TARGET (not lazily: a mount that stays busy is an error the caller sees).

    A child forked by another thread while our fsmount() fd was open holds a
    copy of it until it execs or exits, which keeps the mount busy for a
    moment: EBUSY is retried for up to about a second before it counts.
    """
    delay = 0.001
    while _libc.umount2(target.encode(), 0) < 0:
        e = ctypes.get_errno()
        if e == errno.EINVAL:  # not mounted
            return
        if e != errno.EBUSY or delay > UMOUNT_BUSY_S:
            raise EnvError(str(_err(f"umount {target}")))
        time.sleep(delay)
        delay *= 2

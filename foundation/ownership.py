"""What powercut created, and the refusal of everything else.

Every file or directory powercut creates for the user (replay targets, output
directories, scratch images) is tagged with an extended attribute. A later
command that would overwrite or delete something checks the tag first and
refuses a path without it: powercut never touches what it did not create.
"""

from __future__ import annotations

import errno
import os

from foundation.errors import EnvError, RefusedError

TAG = "user.powercut.created"


def tag(path: str, what: str = "powercut") -> None:
    """Mark PATH as created by powercut."""
    try:
        os.setxattr(path, TAG, what.encode())
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise EnvError(f"{path}: file system has no user xattrs; powercut cannot mark what it creates there") from e
        raise


def is_owned(path: str) -> bool:
    return tag_of(path) is not None


def tag_of(path: str) -> str | None:
    """What powercut tagged PATH as ("run", "root", "scratch", ...), or None: not its own."""
    try:
        return os.getxattr(path, TAG, follow_symlinks=False).decode(errors="replace")
    except OSError:
        return None


def require_owned(path: str, purpose: str) -> None:
    """Raise RefusedError unless PATH was created by powercut."""
    if not is_owned(path):
        raise RefusedError(f"refusing to {purpose} {path}: not created by powercut (choose a new path or remove it yourself)")


def create_file(path: str, size: int = 0, *, replace_owned: bool = True) -> int:
    """Create PATH as a new powercut-owned file (sparse, SIZE bytes); return an fd.

    An existing file is reused only if powercut created it; anything else,
    and any block/char device, is refused.
    """
    if os.path.lexists(path):
        if not os.path.isfile(path) or os.path.islink(path):
            raise RefusedError(f"refusing to write {path}: not a regular file created by powercut")
        if not replace_owned:
            raise RefusedError(f"refusing to overwrite {path}: it exists")
        require_owned(path, "overwrite")
        fd = os.open(path, os.O_RDWR | os.O_TRUNC | os.O_NOFOLLOW)
    else:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            tag(path)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
    if size:
        os.ftruncate(fd, size)
    return fd


def make_dir(path: str) -> str:
    """Create directory PATH for powercut output, or reuse one powercut made.

    An existing empty directory is adopted (users often mkdir first); a
    non-empty one is used only if it carries the tag.
    """
    if os.path.lexists(path):
        if not os.path.isdir(path) or os.path.islink(path):
            raise RefusedError(f"refusing to use {path}: not a directory")
        if os.listdir(path) and not is_owned(path):
            raise RefusedError(f"refusing to write into {path}: not empty and not created by powercut")
        if not is_owned(path):
            tag(path)
        return path
    os.makedirs(path)
    tag(path)
    return path

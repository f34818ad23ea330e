"""The model of f2fs atomic writes (the op f2fs_atomic): a batch's writes
become the file's content at its commit, all of them or none.

F2FS_IOC_START_ATOMIC_WRITE puts the inode in atomic mode: its dirty pages
are written to a COW inode (an orphan, deleted by recovery) and its on-disk
size stays the one at the start (fs/f2fs/file.c f2fs_ioc_start_atomic_write,
original_i_size; fs/f2fs/inode.c f2fs_update_inode writes i_size of an
atomic file only once committed). F2FS_IOC_COMMIT_ATOMIC_WRITE moves the COW
blocks into the file under the checkpoint lock and writes the file's node
blocks as one fsync chain without waiting for them or flushing the cache
(fs/f2fs/segment.c f2fs_commit_atomic_write; fs/f2fs/file.c
f2fs_do_sync_file with atomic set: roll-forward recovery takes the whole
chain or none of it). ABORT, a failed commit, and the last close of a
writable fd (f2fs_release_file) drop the batch. START_ATOMIC_REPLACE
(Linux 6.3+) starts the batch from an empty file: the commit truncates
every block the batch did not write.

So the model keeps a batch's writes aside and applies them at the COMMIT's
position, marked with the batch (DataEvent.batch): none of them is allowed
at a crash point before the commit began, the image check classifies their
ranges at every later one (checkers/untorn.py) and a batch with some pieces
new and some old is an `atomicity` finding (rule f2fs-atomic-write), and a
later sync/syncfs makes them durable as any data (sync-all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from checkers.timeline import Exec, Inode
from foundation.intervals import Src


@dataclass
class Batch:
    start: Exec
    replace: bool
    size: int  # the file's size at the start (REPLACE: 0): what an O_APPEND write in the batch appends to
    writes: list[tuple[int, int, Src]] = field(default_factory=list)  # (start, end, src) in issue order


class F2fsBatches:
    """HistoryBuilder's part for f2fs_atomic (mixed in: it uses the builder's state)."""

    batches: dict[int, Batch]  # inode -> its open batch
    if TYPE_CHECKING:  # the builder's, which this part uses
        fds: dict[tuple[int, int], tuple[int, bool, bool]]
        access: dict[tuple[int, int], tuple[bool, bool, bool]]

        def fd_inode(self, ex: Exec) -> tuple[Inode | None, bool, bool]: ...
        def op_fsync_as(self, ex: Exec, rule: str) -> None: ...
        def resize(self, ex: Exec, ino: Inode, size: int) -> None: ...
        def data(self, ex: Exec, ino: Inode, start: int, end: int, src: Src | None, untorn: bool = False,
                 batch: int | None = None) -> None: ...

    def batched(self, ino: Inode, start: int, end: int, src: Src) -> bool:
        """Whether a write to INO goes into its open batch (kept aside until the commit)."""
        b = self.batches.get(ino.ino)
        if b is None:
            return False
        b.writes.append((start, end, src))
        return True

    def batch_size(self, ino: Inode) -> int:
        """INO's size as the kernel sees it in memory: with a batch open, the size the batch's
        writes give it (the on-disk size stays the one at the start until the commit)."""
        b = self.batches.get(ino.ino)
        return ino.size if b is None else max([b.size, *(end for _, end, _ in b.writes)])

    def op_f2fs_atomic(self, ex: Exec) -> None:
        ino, _, _ = self.fd_inode(ex)
        if ino is None or ino.kind != "file":
            return
        action = (ex.f("flags") or ("",))[0]
        if action in ("start", "replace"):
            # a second start on an atomic file returns 0 and keeps the batch
            if ex.ok and ino.ino not in self.batches:
                self.batches[ino.ino] = Batch(ex, action == "replace", 0 if action == "replace" else ino.size)
            return
        b = self.batches.pop(ino.ino, None)
        if action != "commit" or not ex.ok:
            return  # aborted, or a failed commit (revoked: f2fs_abort_atomic_write)
        if b is None:
            # a commit of a file not in atomic mode is an fdatasync (f2fs_do_sync_file, datasync)
            self.op_fsync_as(ex, "fdatasync-data")
            return
        if b.replace:
            self.resize(ex, ino, 0)
        for start, end, src in b.writes:
            self.data(ex, ino, start, end, src, batch=b.start.pos)

    def close_batch(self, ex: Exec, ino_no: int, writable: bool) -> None:
        """The last close of a writable fd of a file in atomic mode aborts its batch."""
        if not writable or ino_no not in self.batches:
            return
        others = [k for k, (i, _, _) in self.fds.items()
                  if i == ino_no and k != (ex.rec.thread, ex.f("fd")) and self.access[k][1]]
        if not others:
            del self.batches[ino_no]

"""The persistence guarantees the content oracle enforces, in one table.

Only documented Linux behaviour is encoded, and no more: a finding must be a
real violation. Each rule names the file systems it holds on and where it
is documented. A guarantee exists only once the op that gives it has
*returned* (its completion mark is in the log before the crash point).
Mount options that disable a guarantee (barrier=0/nobarrier) do not remove
the rule: the findings are then the price of that option, which is what a
user running the mount-option matrix wants to see.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = frozenset({"ext4", "xfs", "btrfs"})


@dataclass(frozen=True)
class Rule:
    name: str
    promise: str
    fs: frozenset[str]
    reference: str


RULES: dict[str, Rule] = {r.name: r for r in [
    Rule("fsync-data",
         "after fsync(fd) returns, the file's data and size as of the call are durable",
         ALL, "fsync(2): 'transfers all modified in-core data of the file ... so that all changed "
              "information can be retrieved even if the system crashes'"),
    Rule("fsync-new-name",
         "after fsync(fd) of a file created in this run (not renamed, linked or unlinked since), "
         "its name and any new parent directories are durable",
         ALL, "ext4: fsync waits for the jbd2 transaction holding the create, and jbd2 commits "
              "transactions in order (fs/ext4/fsync.c); xfs: fsync forces the log up to the "
              "inode's last change, past the create (fs/xfs/xfs_file.c); btrfs: fsync logs new "
              "names and new ancestors (fs/btrfs/tree-log.c, log_new_ancestors). CrashMonkey "
              "(OSDI'18) treats a violation as a bug on all three"),
    Rule("fdatasync-data",
         "after fdatasync(fd) returns, the file's data and the size needed to read it are durable",
         ALL, "fdatasync(2): 'similar to fsync(), but does not flush modified metadata unless "
              "that metadata is needed in order to allow a subsequent data retrieval'"),
    Rule("osync-write",
         "a write on an O_SYNC (O_DSYNC) fd is durable when it returns, as if followed by fsync (fdatasync)",
         ALL, "open(2): O_SYNC/O_DSYNC"),
    Rule("msync-data",
         "after an mmap write with msync(MS_SYNC) returns, the range's data is durable (as fdatasync)",
         ALL, "mm/msync.c: MS_SYNC calls vfs_fsync_range(file, start, end, 1)"),
    Rule("sync-all",
         "after sync() or syncfs() returns, every change made before the call is durable",
         ALL, "sync(2): 'sync() causes all pending modifications to file system metadata and cached "
              "file data to be written to the underlying filesystems'; syncfs(2)"),
    Rule("rename-atomic",
         "rename(old, new) over an existing durable new leaves new as the old or the renamed file, "
         "never missing, and the renamed file at old or new, never neither",
         ALL, "rename(2): 'newpath ... will be atomically replaced'; the three file systems "
              "journal/log the rename as one transaction"),
    Rule("no-stale-data",
         "a file never shows data that was not written to it at that offset (another file's, "
         "a deleted file's, or garbage); unwritten parts read as zeros",
         ALL, "ext4(5): data=ordered 'forces all data to be written out before its metadata is "
              "committed' (data=writeback documents that stale data may appear: findings there "
              "are expected); xfs and btrfs never expose unwritten extents"),
    Rule("no-resurrection",
         "a name removed (unlink, rmdir, rename away) before a completed sync() stays removed",
         ALL, "sync(2), as sync-all"),
]}


# Untorn writes (pwritev2 RWF_ATOMIC, Linux 6.11+; ext4 and xfs 6.13+, xfs in
# software by copy-on-write on reflink file systems 6.16+). Where the file
# system cannot do them it refuses the write (EOPNOTSUPP/EINVAL), so a write
# that returned is one it promised; the rows hold wherever such a write succeeds.
UNTORN_RULES = [
    Rule("untorn-write",
         "an RWF_ATOMIC write's range holds all of its data or none of it at every crash state, "
         "whether it had returned or was in flight; later writers' bytes aside",
         ALL, "kernel commit c34fc6f26ab8 'fs: Initial atomic write support' (torn-write protection: "
              "'all or none of the data from the write will be stored, but never a mix of old and new "
              "data'); Documentation/filesystems/ext4/atomic_writes.rst; Documentation/admin-guide/xfs.rst "
              "(max_atomic_write); xfstests common/atomicwrites, generic/765-778 (778: shutdown during "
              "atomic writes, every unit-sized block old or new)"),
    Rule("rwf-sync-write",
         "a pwritev2 with RWF_DSYNC (RWF_SYNC) is durable for the range it wrote when it returns, "
         "as a write on an O_DSYNC (O_SYNC) fd",
         ALL, "pwritev2(2): RWF_DSYNC/RWF_SYNC 'provide a per-write equivalent of the O_DSYNC/O_SYNC "
              "open(2) flag ... applies only to the data range written by the system call'"),
]
RULES.update({r.name: r for r in UNTORN_RULES})


def rule(name: str) -> Rule:
    return RULES[name]

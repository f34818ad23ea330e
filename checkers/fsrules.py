"""The persistence guarantees the content oracle enforces, in one table.

Only documented Linux behaviour is encoded, and no more: a finding must be a
real violation. Each rule names the file systems it holds on and where it
is documented. Rules come in two tiers (`--semantics`):

- `posix`: what the man pages and kernel docs promise;
- `linux`: the posix rules plus what the file systems' own developers test
  after a power cut (xfstests generic power-failure tests and their golden
  .out files, fs documentation, maintainers' public statements). A rule of
  this tier names the tests that assert it; `unless` lists the mkfs/mount
  options under which it does not hold (ext4 without a journal).
See docs/semantics.md for the evidence table. A guarantee exists only once the op that gives it has
*returned* (its completion mark is in the log before the crash point).
Mount options that disable a guarantee (barrier=0/nobarrier) do not remove
the rule: the findings are then the price of that option, which is what a
user running the mount-option matrix wants to see.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundation import xfs_exchange

ALL = frozenset({"ext4", "xfs", "btrfs", "f2fs"})
JOURNALED = frozenset({"ext4", "xfs", "btrfs"})  # a linux-tier rule not (yet) shown to hold on f2fs
ORDERED = frozenset({"ext4", "xfs"})   # strictly ordered metadata (btrfs is not: generic/335; f2fs neither)
TIERS = ("posix", "linux")
DEFAULT_TIER = "linux"
NO_JOURNAL = ("^has_journal",)         # ext4 without a journal: no ordering, no fsync-names
# f2fs has no transaction per namespace op (xfstests generic/066 and 690 say so): an fsync
# of a file persists its own node and, through roll-forward recovery, its dentry; that the
# other names it touched are durable holds with fsync_mode=strict (generic/342, 502, 526 and
# 527 mount f2fs with it) or fastboot (every fsync writes a checkpoint: fs/f2fs/file.c,
# need_do_checkpoint, CP_FASTBOOT_MODE; generic/066 and 690 mount f2fs with it).
F2FS_STRICT = (("f2fs", ("fsync_mode=strict", "fastboot")),)
F2FS_CHECKPOINTED = (("f2fs", ("fastboot",)),)


@dataclass(frozen=True)
class Rule:
    name: str
    promise: str
    fs: frozenset[str]
    reference: str
    tier: str = "posix"
    unless: tuple[str, ...] = ()       # mkfs/mount option tokens under which the rule does not hold
    # (fs, option tokens): on that file system the rule holds only with one of the tokens
    needs: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Semantics:
    """Which rules a check applies: the tier, and the configuration they depend on."""

    tier: str = DEFAULT_TIER
    fs: str = "ext4"
    mkfs_opts: str = ""
    mount_opts: str = ""

    def reflink(self) -> bool:
        """Whether the file system clones (FICLONE): btrfs always, xfs unless made with
        reflink=0 (mkfs.xfs has made reflink file systems by default since xfsprogs 5.1),
        ext4 never (it has no remap_file_range: EOPNOTSUPP)."""
        return self.fs == "btrfs" or (self.fs == "xfs" and "reflink=0" not in self.mkfs_opts.replace(" ", ""))

    def exchange(self) -> bool:
        """Whether the file system exchanges ranges (XFS_IOC_EXCHANGE_RANGE): xfs made with
        `-i exchange=1` (foundation/xfs_exchange.py); ext4 and btrfs have no such ioctl."""
        return self.fs == "xfs" and xfs_exchange.wanted(self.mkfs_opts)

    def f2fs_atomic(self) -> bool:
        """Whether the file system has the f2fs atomic-write ioctls (F2FS_IOC_START_ATOMIC_WRITE
        and the rest): f2fs only; every other answers ENOTTY."""
        return self.fs == "f2fs"

    def holds(self, name: str) -> bool:
        r = RULES[name]
        if r.tier == "linux" and self.tier != "linux":
            return False
        if self.fs not in r.fs:
            return False
        tokens = set(self.mkfs_opts.replace(",", " ").split()) | set(self.mount_opts.replace(",", " ").split())
        if any(fs == self.fs and not tokens & set(need) for fs, need in r.needs):
            return False
        return not any(t in tokens for t in r.unless)


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
              "names and new ancestors (fs/btrfs/tree-log.c, log_new_ancestors); f2fs: an fsync whose "
              "parent directory is not in a checkpoint writes one (fs/f2fs/file.c, need_do_checkpoint, "
              "CP_NODE_NEED_CP), else roll-forward recovery restores the fsynced inode's dentry "
              "(fs/f2fs/recovery.c, recover_dentry). CrashMonkey (OSDI'18) treats a violation as a bug "
              "on ext4, xfs and btrfs"),
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
         ALL, "rename(2): 'newpath ... will be atomically replaced'; ext4, xfs and btrfs "
              "journal/log the rename as one transaction, f2fs makes it durable in one checkpoint"),
    Rule("no-stale-data",
         "a file never shows data that was not written to it at that offset (another file's, "
         "a deleted file's, or garbage); unwritten parts read as zeros",
         ALL, "ext4(5): data=ordered 'forces all data to be written out before its metadata is "
              "committed' (data=writeback documents that stale data may appear: findings there "
              "are expected); xfs and btrfs never expose unwritten extents; f2fs writes out of place and "
              "its block maps change only in a checkpoint or in fsynced node blocks roll-forward recovery "
              "replays (Jaegeuk Kim, commits 127e670abfa7 'f2fs: add checkpoint operations' and d624c96fb324 "
              "'f2fs: add recovery routines for roll-forward')"),
    Rule("no-resurrection",
         "a name removed (unlink, rmdir, rename away) before a completed sync() stays removed",
         ALL, "sync(2), as sync-all"),
    # -- the linux tier: what the file systems' developers test after a power cut --
    Rule("fsync-names",
         "after fsync(fd) returns, every name the file (or directory) gained or lost by its own ops "
         "before the call (create, link, rename to or from, unlink of a link) shows its state as of "
         "the call: new names present, old names gone; its new parent directories exist; so do the "
         "names of every inode whose committed name (held at the last sync) it took, and in turn",
         ALL, "xfstests generic/322 (fsync after rename: the new name holds the data), 376 (rename in "
              "the same dir, fsync the renamed file: new name present), 343 (new hard link fsynced: both "
              "links present), 336 (a link unlinked, the file fsynced: the link stays gone), 534 (truncate, "
              "rename, fsync: new name at the new size, old name gone), 498 (fsync of a new directory: it "
              "exists), 341/342 (a dir or file renamed, a new one under its old name fsynced: the renamed one "
              "exists), 502/526/527 (renames, links and reused names, fsync: every name maps to its inode; "
              "btrfs logs the inode whose name was taken, tree-log.c's conflicting inodes); "
              "all run on ext4, xfs and btrfs (btrfs fixes named by _fixed_by_kernel_commit); on f2fs "
              "342, 502, 526 and 527 mount with fsync_mode=strict (Documentation/filesystems/f2fs.rst: "
              "strict 'behaves in line with xfs, ext4 and btrfs, where xfstest generic/342 will pass')",
         tier="linux", unless=NO_JOURNAL, needs=F2FS_STRICT),
    Rule("fsync-dir-entries",
         "after fsync(dir) returns, the directory's entries as of the call are durable: names created, "
         "linked, renamed in, symlinks (with their targets) and subdirectories present; names unlinked, "
         "removed or renamed away absent; this holds for the root directory too",
         ALL, "xfstests generic/348 (symlinks in an old and a new dir, fsync the dir: present with their "
              "targets), 690 and 779 (symlink renamed, dir fsynced: the new name with the target), 782 "
              "(fsync of the root after mkdir: the new dir is there), 335 (fsync a: the new entry a/bar); "
              "fsync(2) NOTES (an fsync of the directory is needed for its entries); on f2fs 690 mounts "
              "with fastboot (without it the renamed symlink is missing after the directory's fsync)",
         tier="linux", unless=NO_JOURNAL, needs=F2FS_CHECKPOINTED),
    Rule("fsync-unlinked",
         "after fsync(fd) of a file whose last name was removed returns, the removal is durable: "
         "none of its former names shows it again",
         ALL, "xfstests generic/764 (fsync of an fd whose file has no links: the file is gone after "
              "replay; btrfs fix 5e85262e542d), 771 (same with data, then another file fsynced: only "
              "the other file is listed; btrfs fix 0a32e4f0025a); both run on f2fs with no exception",
         tier="linux", unless=NO_JOURNAL),
    Rule("fallocate-fsync",
         "after fallocate past EOF and fsync(fd), the size is durable (the new size without KEEP_SIZE, "
         "the old one with it) and the blocks reserved past EOF stay allocated",
         JOURNALED, "xfstests generic/483 (falloc -k past EOF, fsync: size unchanged, the fiemap in the .out "
              "shows the prealloc extent kept), 512 (falloc past EOF without -k on a tiny file, fsync: "
              "the data and the grown size, zeros after the data, as the .out's od dump shows); "
              "both run on f2fs too, but f2fs is left out until a healthy f2fs campaign has shown the rule "
              "clean there (its content is read in the guest, where mapped ranges come through FIEMAP)",
         tier="linux", unless=NO_JOURNAL),
    Rule("btrfs-commit",
         "an fsync (fdatasync, O_SYNC write, msync) during which btrfs committed its transaction (the "
         "log shows the super block written with no log tree, in a run with no commit btrfs ran on its "
         "own) made the names left by every op that had returned before the call durable (not other "
         "files' data: a commit writes no dirty pages)",
         frozenset({"btrfs"}),
         "fs/btrfs/tree-log.c: an fsync that cannot use the log tree falls back to a full transaction "
         "commit (BTRFS_LOG_FORCE_COMMIT), and a commit writes every change of the running transaction "
         "before its super block (generation bumped, log_root 0; a log sync keeps the generation and "
         "names the log root). xfstests generic/336, 343, 510 and btrfs/239 (moves and renames done before "
         "an fsync of another inode are durable on btrfs): on 6.18 btrfs keeps them by such a commit",
         tier="linux"),
    Rule("btrfs-log-dirs",
         "after fsync(fd) of an inode older than the running transaction returns on btrfs, the directories "
         "its log tree carried show their entries as of the call: for a directory, those of its "
         "subdirectories made in the same transaction (never renamed), and theirs in turn; for a file that "
         "gained or lost a name (link, rename, unlink of a link) in the same transaction, the entries of "
         "files and symlinks in each directory holding one of its names. Not entries a RENAME_EXCHANGE or "
         "WHITEOUT changed. The transaction is the one the log shows",
         frozenset({"btrfs"}),
         "fs/btrfs/tree-log.c: link, rename and unlink set the inode's last_unlink_trans, and an fsync then "
         "logs all its parent directories (btrfs_log_all_parents); logging a directory logs the new "
         "dentries of its new subdirectories (log_new_dir_dentries). xfstests generic/104 (links added to "
         "two files in one dir, one fsynced: both links, link counts 2), 376 (renamed in place, a new file "
         "under the old name: both), 065 (fsync of a dir: its new subtree, mydir/x/y/z/qwerty), 785 (fsync "
         "of the root: the new dir with its new entry; btrfs fix 'btrfs: do not skip logging new dentries "
         "when logging a new name')",
         tier="linux"),
    Rule("btrfs-relog",
         "on btrfs, a file older than the transaction fsynced (its log synced), then linked or renamed with "
         "no data change in between, "
         "in the same transaction: after a later fsync that syncs the log returns, the file's xattrs as of "
         "the link or rename are durable",
         frozenset({"btrfs"}),
         "fs/btrfs/tree-log.c, btrfs_log_new_name: a link or rename of an inode logged in the running "
         "transaction logs it again, and the next log sync writes that copy. xfstests generic/066's second "
         "power cut (an xattr removed from a file fsynced before, a link added, another new file fsynced: "
         "the xattr stays removed); btrfs/239 (a move of a logged dir persisted by an fsync of any other file)",
         tier="linux"),
    Rule("ordered-metadata",
         "namespace operations (create, mkdir, link, symlink, unlink, rmdir, rename) become durable "
         "in the order they completed: the recovered names are those after some prefix of them, and "
         "an fsync that makes a file's or directory's last name change durable makes every "
         "namespace op completed before that change durable too; xattr changes (setxattr, "
         "removexattr) are ordered with them: the same floor makes them durable",
         ORDERED, "Dave Chinner on LKML 2018-09-14 ('Re: metadata operation reordering regards to crash': "
                  "rename(A,B); rename(C,D): a crash never leaves D renamed but B not, on XFS, ext4, btrfs "
                  "or f2fs); the linux-fsdevel draft Documentation/filesystems/crash-recovery-guarantees.txt "
                  "(2019, strictly ordered metadata consistency, provided by xfs); xfstests generic/335 "
                  "(fsync of a: the earlier move of foo into c is durable on ext4 and xfs; btrfs is excused "
                  "and fsyncs foo itself), 336 and 343 (moves done before an fsync of another file are "
                  "durable). ext4 -O fast_commit: fs/ext4/fast_commit.c keeps directory-entry updates in "
                  "issue order and falls back to a full commit where it cannot replay (an xattr change makes "
                  "the inode ineligible: a full commit). xattrs: generic/066's second power cut (an xattr "
                  "removed, a link added, another file fsynced: the xattr stays removed); ext4 and xfs journal "
                  "xattr changes in transactions like namespace ops (ext4_xattr_set_handle, xfs_attr_set)",
         tier="linux", unless=NO_JOURNAL),
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

# f2fs atomic writes (the op f2fs_atomic; checkers/f2fs_batches.py). The ioctls exist on f2fs
# only (ENOTTY elsewhere); a file that cannot leave compression refuses START (EINVAL).
F2FS_ATOMIC_RULES = [
    Rule("f2fs-atomic-write",
         "the writes of an f2fs atomic batch (START or REPLACE, writes, COMMIT) are all in the file or "
         "none of them at every crash state, and none before its COMMIT began or after an ABORT; the "
         "file's size moves with them (REPLACE: the blocks the batch did not write go with it); a commit "
         "is durable once a later sync()/syncfs() returns (sync-all), not when COMMIT returns",
         frozenset({"f2fs"}),
         "fs/f2fs/file.c: f2fs_ioc_start_atomic_write sends the file's writes to a COW inode and keeps its "
         "on-disk size (original_i_size; fs/f2fs/inode.c f2fs_update_inode skips i_size until committed); "
         "f2fs_ioc_commit_atomic_write moves the COW blocks into the file (fs/f2fs/segment.c "
         "f2fs_commit_atomic_write, under f2fs_lock_op, so a checkpoint sees all or none) and calls "
         "f2fs_do_sync_file with atomic set, which writes the node blocks as one fsync-marked chain that "
         "roll-forward recovery takes whole or not at all, without waiting for them or flushing the cache; "
         "f2fs_ioc_abort_atomic_write and f2fs_release_file (the last writable close) drop the batch; "
         "Daeho Jeong's commit 3db1de0e582c 'f2fs: change the current atomic write way' (the COW design) and "
         "the START_ATOMIC_REPLACE commit (Linux 6.3); xfstests f2fs/003, 004, 010 and 013 run SQLite's "
         "start-write-commit sequence and check the committed data (013: Chao Yu's fix f098aeba04c9 "
         "'f2fs: fix to avoid atomicity corruption of atomic file')",
         tier="linux"),
]
RULES.update({r.name: r for r in F2FS_ATOMIC_RULES})

# XFS_IOC_EXCHANGE_RANGE (xfs made with -i exchange=1, Linux 6.10+).
EXCHANGE_RULES = [
    Rule("exchange-range-dsync",
         "an exchange_range with XFS_EXCHANGE_RANGE_DSYNC (or on an O_SYNC/O_DSYNC fd of either file) is "
         "durable when it returns: each file holds the other's former bytes over its exchanged range "
         "(with TO_EOF, up to its new size)",
         frozenset({"xfs"}), "ioctl_xfs_exchange_range(2): with XFS_EXCHANGE_RANGE_DSYNC all modified data in "
         "both ranges and the exchange's metadata updates reach persistent storage before the call returns; "
         "an O_SYNC or O_DSYNC fd on either file has the same effect; fs/xfs/xfs_exchrange.c: the ranges' "
         "dirty pages are written before the mappings change and the exchange's last transaction is "
         "committed synchronously (xfs_trans_set_sync)"),
]
RULES.update({r.name: r for r in EXCHANGE_RULES})


def rule(name: str) -> Rule:
    return RULES[name]

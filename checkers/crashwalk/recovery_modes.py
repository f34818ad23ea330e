"""How a crash image is recovered: a read-write mount (`rw`), a read-only one (`ro`), or both.

What `-o ro` does on a crash image that needs recovery (kernel 6.18 here,
measured with `tests/test_recovery_modes.py`, and what the file systems
document):

- ext4 replays the journal on a read-only mount unless `noload`/`norecovery`
  is given: write access to the device is enabled for the replay
  (Documentation/admin-guide/ext4.rst, `norecovery`), the replay reaches the
  disk and `needs_recovery` is cleared; orphan cleanup runs too. Only on a
  read-only *block device* does it refuse the mount (xfstests generic/050).
- xfs replays its log on a read-only mount unless `norecovery`
  (Documentation/admin-guide/xfs.rst) and writes the result back and a clean
  unmount record at unmount ("xfs: quiesce the filesystem after recovery on
  readonly mount", 2016; xfstests generic/646). Read-only device: refused.
- btrfs replays the tree log on a read-only mount unless `nologreplay`
  (btrfs(5) mount options; it says nologreplay needs ro) and commits the
  result (the super block's log_root is 0 afterwards); orphan cleanup is
  left to the first read-write mount.

So on all three a read-only mount recovers the image on disk, and fsck runs
on the recovered image after the unmount, as for `rw`: never on an
unrecovered one (block-recording.md: that gives false positives). The
recovery is a different code path all the same (ext4 lifts SB_RDONLY just
for the replay, xfs quiesces by another route, btrfs skips orphan cleanup),
which is why it is worth its own check.
"""

from __future__ import annotations

from foundation.errors import UsageError
from foundation.filesystems import join_opts

MODES = ("rw", "ro")
CHOICES = ("rw", "ro", "both")


def parse_recovery(spec: str) -> tuple[str, ...]:
    """`--recovery rw|ro|both` as the modes to check, in order."""
    if spec == "both":
        return MODES
    if spec in MODES:
        return (spec,)
    raise UsageError(f"--recovery {spec!r}: choose one of {', '.join(CHOICES)}")


def recovery_name(modes: tuple[str, ...]) -> str:
    """The `--recovery` word for MODES (parse_recovery's inverse)."""
    return "both" if modes == MODES else modes[0]


# Mount options that skip recovery: a crash image mounted with them is not
# recovered, and fsck after it would judge an unrecovered image (false positives).
NO_RECOVERY_OPTS = ("norecovery", "noload", "nologreplay", "rescue=nologreplay", "rescue=all")


def check_recovers(mount_opts: str | None) -> None:
    """UsageError if MOUNT_OPTS would keep the recovery mounts from recovering."""
    bad = [o for o in (mount_opts or "").split(",") if o.strip() in NO_RECOVERY_OPTS]
    if bad:
        raise UsageError(f"--mount-opts {bad[0]}: the recovery mounts would not recover the crash images "
                         "(and fsck on an unrecovered image reports errors on healthy ones)")


def mode_opts(mount_opts: str, mode: str) -> str:
    """The mount options of a recovery mount in MODE (the run's options, plus `ro`)."""
    if mode == "ro":
        return join_opts(mount_opts, "ro")
    return mount_opts

"""The one-line summary of an fsck failure names the damage, not the checker's chatter.

The text is xfs_repair -n's own output after a recovery in a guest (powercut run
--backend vm, Debian 6.12.113, the xfs attr-inactivation bug of bench/bugpairs.json):
on an image file xfs_repair first warns that it cannot read the host's geometry,
which said nothing about the image and made every such finding read (and dedupe) alike.
"""

from __future__ import annotations

from checkers.crashwalk.recovery import first_problem

XFS_REPAIR_IN_GUEST = """\
No modify flag set, skipping phase 5
Cannot get host filesystem geometry.
Repair may fail if there is a sector size mismatch between
the image and the host filesystem.
Phase 1 - find and verify superblock...
Cannot get host filesystem geometry.
Repair may fail if there is a sector size mismatch between
the image and the host filesystem.
Phase 2 - using internal log
        - zero log...
        - scan filesystem freespace and inode maps...
agi unlinked bucket 4 is 132 in ag 0 (inode=132)
        - found root inode chunk
Phase 3 - for each AG...
Metadata corruption detected at 0x558c80c4814b, xfs_da3_node block 0x78/0x1000
corrupt block 0 of inode 132 attribute fork
"""


def test_xfs_repair_host_geometry_warning_is_not_the_problem() -> None:
    assert first_problem(XFS_REPAIR_IN_GUEST) == "agi unlinked bucket 4 is 132 in ag 0 (inode=132)"


def test_e2fsck_damage_line_is_the_problem() -> None:
    out = "e2fsck 1.47.0 (5-Feb-2023)\nPass 1: Checking inodes, blocks, and sizes\nInode 12, i_blocks is 2048, should be 2056.  Fix? no\n"
    assert first_problem(out) == "Inode 12, i_blocks is 2048, should be 2056.  Fix? no"

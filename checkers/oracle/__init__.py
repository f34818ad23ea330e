"""The content oracle: is this recovered crash image a state the guarantees allow?

At a crash point the ops whose completion mark is in the log have returned;
one op per thread may be in flight; the rest never started. From the
history (checkers/history.py) and the rules (checkers/fsrules.py) this
computes, per path, which inodes it may name, and per inode, which sizes and
which writer of every byte are allowed; then it reads the mounted crash
image and reports only what no allowed state explains:

- `durability`: something a completed fsync/fdatasync/sync/O_SYNC write
  guaranteed is missing, older, or shorter;
- `stale-data`: bytes that were never written to that file at that offset;
- `atomicity`: a rename left neither the old nor the new state, or an
  RWF_ATOMIC write's range mixes its data with older data (checkers/untorn.py).

Whenever the model cannot be sure (paths it lost track of, ranges shifted by
collapse/insert after the last guarantee), it checks nothing there.

The package, one concern per module: view.py (which ops had returned at a
crash point), index.py (the history's lookups, memoised), model.py (what is
allowed: guarantees, durable names, candidates; no I/O), filecheck.py (a
file's bytes against what is allowed; no I/O), image.py (reads the crash
image and asks the model), metadata.py and names.py (what image.py reads of
metadata and names), memo.py (check results reused between crash states).
"""

from checkers.oracle.image import ContentOracle

__all__ = ["ContentOracle"]

#!/bin/sh
# A few ops and two marks: cheap enough for TCG guests (tests/test_dm_guest.py). POSIX sh.
set -eu
mark() { [ -n "${POWERCUT_MARK_FILE:-}" ] && printf '%s' "$1" > "$POWERCUT_MARK_FILE" || true; }
mkdir d
for i in 1 2 3; do head -c $((i * 8192)) /dev/zero | tr '\0' "$i" > "d/f$i"; done
sync d/f1
mark f1-fsynced
mv d/f2 d/g2
rm d/f3
sync
mark synced

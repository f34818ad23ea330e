#!/usr/bin/env bash
# Mixed workload: create, write, fsync, rename, unlink, truncate, fallocate, many files.
# Runs under bash and under busybox sh (the vm backend's guest): POSIX sh only.
set -eu
mark() { [ -n "${POWERCUT_MARK_FILE:-}" ] && printf '%s' "$1" > "$POWERCUT_MARK_FILE" || true; }
mkdir -p A/C B
for i in $(seq 1 40); do
  head -c $((i * 1024)) /dev/urandom > "A/f$i"
done
mark created
sync A/f1 A/f2           # fsync(2) of each file
dd if=/dev/urandom of=B/big bs=64k count=16 conv=fsync status=none
mark big-fsynced
for i in $(seq 1 10); do mv "A/f$i" "A/C/g$i"; done
for i in $(seq 11 20); do rm "A/f$i"; done
truncate -s 3000 A/f21
truncate -s 1M A/f22
fallocate -l 256k B/pre
# Busybox's fallocate has no -n (keep size): there the file grows instead.
touch B/keep; fallocate -n -l 512k B/keep 2>/dev/null || fallocate -l 512k B/keep
mark before-sync
sync
echo data > B/after
sync B/after
echo workload finished
mark done

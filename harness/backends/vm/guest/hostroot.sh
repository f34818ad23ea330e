# Job `hostroot` (sourced by /init): run PC_COMMAND in a guest whose root is the host's.
# The host's / comes read-only over virtio 9p (tag hostroot) and is the
# chroot; /proc, /sys, /dev (devtmpfs) are the guest's own, /tmp, /run and
# /dev/shm are tmpfs; the host directory PC_OUT is shared writable (tag
# pcout) at the same path. The command's output goes to ttyS1, its exit
# status is reported as "exit N".
h=/host
p9="trans=virtio,version=9p2000.L,msize=524288"
mkdir -p $h
# cache=loose: the root is read-only for the guest, so caching it is safe and
# makes Python's thousands of stat/open calls cheap.
mount -t 9p -o "$p9,ro,cache=loose" hostroot $h || fail "mounting the host's root (9p) failed"
mount -t proc proc $h/proc || fail "proc"
mount -t sysfs sysfs $h/sys || fail "sysfs"
mount -t devtmpfs devtmpfs $h/dev || fail "devtmpfs"
mkdir -p $h/dev/shm $h/dev/pts
mount -t devpts devpts $h/dev/pts
for d in /tmp /run /dev/shm; do
    mount -t tmpfs -o mode=1777 tmpfs "$h$d" || fail "tmpfs on $d"
done
# PC_ROOT (the project) and PC_OUT may lie under /tmp: their mount points are
# made in the tmpfs (or exist already in the read-only root).
mkdir -p "$h$PC_ROOT" && mount -t 9p -o "$p9,ro,cache=loose" pcroot "$h$PC_ROOT" || fail "mounting $PC_ROOT (9p) failed"
mkdir -p "$h$PC_OUT" && mount -t 9p -o "$p9" pcout "$h$PC_OUT" || fail "mounting $PC_OUT (9p) failed"
say "command"
chroot $h /usr/bin/env -i HOME=/root PATH="$PC_PATH" sh -c "$PC_COMMAND" > /dev/ttyS1 2>&1 < /dev/null
result "exit $?"
sync

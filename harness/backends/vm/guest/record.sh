# Job `record` (sourced by /init): record a whole file-system life with dm-log-writes.
# /dev/vda is the data disk, /dev/vdb the log disk. From job.env: PC_FS,
# PC_MKFS (mkfs command words), PC_MOUNT_OPTS, PC_WORKLOAD (command line),
# PC_MARK_MKFS, PC_MARK_MOUNTED, PC_MARK_END (the host's mark texts),
# PC_COVERAGE (kernel coverage of the workload through its umount: "cov w ...", init.sh).
# An empty PC_MKFS means the host put a fresh file system on /dev/vda
# already and its log starts with that mkfs (harness/backends/vm/live.py).
# Optional: PC_SYSCTLS (vm.* names reported as "sysctl vm.NAME VALUE"
# before the workload), PC_RECORDS (a file the workload writes, copied to
# /dev/vdc after it and reported as "records BYTES").
# The target is made, marked and removed by pc-dmlog, the same program the
# dm backend uses on a host (harness/backends/dm/pc-dmlog.c).
dev=pc-logwrites
marks=/run/pc-marks

mark() { /usr/bin/pc-dmlog mark "$dev" "$1" || fail "pc-dmlog mark $1 failed"; }

map=$(/usr/bin/pc-dmlog create "$dev" "powercut-vm-$dev" "$(blockdev --getsz /dev/vda)" /dev/vda /dev/vdb) \
    || fail "pc-dmlog create log-writes failed"
if [ -n "$PC_MKFS" ]; then
    say "mkfs"
    eval "$PC_MKFS $map" > /dev/console 2>&1 || fail "mkfs failed: $PC_MKFS"
    mark "$PC_MARK_MKFS"
fi
[ "$PC_FS" = btrfs ] && forget_btrfs_devices
err=$(mount -t "$PC_FS" ${PC_MOUNT_OPTS:+-o "$PC_MOUNT_OPTS"} "$map" /mnt 2>&1) || fail "mount failed: $err"
mark "$PC_MARK_MOUNTED"

# $POWERCUT_MARK_FILE: each write() is one mark, logged before write() returns.
mkdir -p "$marks"
/usr/bin/pc-dmlog markfs "$dev" "$marks" || fail "pc-dmlog markfs did not start"
# One sysctl process for all values ("vm.NAME = VALUE" lines): a process per value cost
# tens of ms each under TCG. (Not the shell's `read` on the files: sysctl files end at offset 1.)
names=""
for n in $PC_SYSCTLS; do [ -r "/proc/sys/vm/$n" ] && names="$names vm.$n"; done
[ -z "$names" ] || sysctl $names 2> /dev/null | while read -r k _ v; do result "sysctl $k $v"; done
cover_begin
say "workload"
cd /mnt
export POWERCUT_MARK_FILE=$marks/mark POWERCUT_DIR=/mnt
eval "$PC_WORKLOAD" > /dev/ttyS1 2>&1 < /dev/null
code=$?
echo "pc: workload-exit $code" > /dev/console
cd /
if [ -n "$PC_RECORDS" ] && [ -f "$PC_RECORDS" ]; then
    n=$(wc -c < "$PC_RECORDS")
    [ "$n" -le "$(blockdev --getsize64 /dev/vdc)" ] || fail "records file of $n bytes does not fit the records disk"
    dd if="$PC_RECORDS" of=/dev/vdc bs=1M conv=fsync 2> /dev/null || fail "copying the records to /dev/vdc failed"
    result "records $n"
fi
umount "$marks" || fail "umount of the mark file system failed"
result "workload-exit $code"
mark "$PC_MARK_END"
say "umount"
err=$(umount /mnt 2>&1) || fail "umount failed: $err"
cover_end w
# Removing the target makes the kernel append the mark dm-log-writes-end.
/usr/bin/pc-dmlog remove "$dev" || fail "pc-dmlog remove failed"

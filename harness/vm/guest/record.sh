# Job `record` (sourced by /init): record a whole file-system life with dm-log-writes.
# /dev/vda is the data disk, /dev/vdb the log disk. From job.env: PC_FS,
# PC_MKFS (mkfs command words), PC_MOUNT_OPTS, PC_WORKLOAD (command line),
# PC_MARK_MKFS, PC_MARK_MOUNTED, PC_MARK_END (the host's mark texts).
export PC_LOGWRITES_DEV=pc-logwrites
map=/dev/mapper/$PC_LOGWRITES_DEV
mark_fifo=/run/pc-mark
mark_stop=pc:mark-loop-stop

mark() { /usr/sbin/dmsetup message "$PC_LOGWRITES_DEV" 0 mark "$1" || fail "dmsetup message mark $1 failed"; }

# $POWERCUT_MARK_FILE is a FIFO: each writer's text (open to close) becomes one
# mark. The workload does not wait for it (see docs/vm-backend.md); a new
# writer's open() blocks until the previous mark is in the log.
mark_loop() {
    while :; do
        t=$(cat "$mark_fifo")
        case $t in
            *"$mark_stop") t=${t%"$mark_stop"}; [ -z "$t" ] || mark "$t"; return ;;
        esac
        mark "$t"
    done
}

/usr/sbin/dmsetup create --noudevsync "$PC_LOGWRITES_DEV" \
    --table "0 $(blockdev --getsz /dev/vda) log-writes /dev/vda /dev/vdb" || fail "dmsetup create log-writes failed"
say "mkfs"
eval "$PC_MKFS $map" > /dev/console 2>&1 || fail "mkfs failed: $PC_MKFS"
mark "$PC_MARK_MKFS"
err=$(mount -t "$PC_FS" ${PC_MOUNT_OPTS:+-o "$PC_MOUNT_OPTS"} "$map" /mnt 2>&1) || fail "mount failed: $err"
mark "$PC_MARK_MOUNTED"

mkfifo "$mark_fifo"
mark_loop &
loop=$!
say "workload"
cd /mnt
POWERCUT_MARK_FILE=$mark_fifo POWERCUT_DIR=/mnt $PC_WORKLOAD > /dev/ttyS1 2>&1 < /dev/null
code=$?
cd /
printf '%s' "$mark_stop" > "$mark_fifo"
wait $loop
result "workload-exit $code"
mark "$PC_MARK_END"
say "umount"
err=$(umount /mnt 2>&1) || fail "umount failed: $err"
# Removing the target makes the kernel append the mark dm-log-writes-end.
/usr/sbin/dmsetup remove --noudevsync "$PC_LOGWRITES_DEV" || fail "dmsetup remove failed"

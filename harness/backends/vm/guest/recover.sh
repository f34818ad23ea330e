# Job `recover` (sourced by /init): let this kernel recover each crash image.
# PC_BATCH_DISK (default /dev/vda) holds PC_IMAGES images of PC_IMAGE_SECTORS sectors back to back;
# from image PC_FIRST on, each is exposed with dm-linear, mounted (journal/log
# recovery happens here) and unmounted. Results: "begin I" before touching
# image I, then "ok I" or "fail I MESSAGE"; a guest that dies after "begin I"
# died mounting image I.

# One dmsetup call for all devices: under TCG each dmsetup process costs
# ~0.1 s, several times a mount + umount of a small image.
table=""
disk=${PC_BATCH_DISK:-/dev/vda}
i=$PC_FIRST
while [ "$i" -lt "$PC_IMAGES" ]; do
    table="$table${table:+;}pc-image-$i,,,rw,0 $PC_IMAGE_SECTORS linear $disk $((i * PC_IMAGE_SECTORS))"
    i=$((i + 1))
done
/usr/sbin/dmsetup create --noudevsync --concise "$table" || fail "dmsetup create of the linear devices failed"

say "recovery mounts: -o ${PC_MOUNT_OPTS:-defaults}"
i=$PC_FIRST
while [ "$i" -lt "$PC_IMAGES" ]; do
    result "begin $i"
    # On the console too: a kernel message that follows belongs to this mount.
    echo "pc: mount $i" > /dev/console
    [ "$PC_FAULT" = recovery-panic ] && [ "$i" = 0 ] && echo c > /proc/sysrq-trigger
    # A stalled device (suspended without freezing, which would make mount refuse it with EBUSY):
    # the mount below waits in the kernel for I/O that never completes.
    [ "$PC_FAULT" = recovery-hang ] && [ "$i" = 0 ] && /usr/sbin/dmsetup suspend --nolockfs --noudevsync "pc-image-$i"
    [ "$PC_FS" = btrfs ] && forget_btrfs_devices
    # Errors go to a file, not through $(...): a subshell fork per mount costs under TCG.
    if mount -t "$PC_FS" ${PC_MOUNT_OPTS:+-o "$PC_MOUNT_OPTS"} "/dev/mapper/pc-image-$i" /mnt 2> /tmp/pc-err; then
        if umount /mnt 2> /tmp/pc-err; then result "ok $i"; else result "fail $i umount: $(echo $(cat /tmp/pc-err))"; fi
    else
        result "fail $i $(echo $(cat /tmp/pc-err))"
    fi
    i=$((i + 1))
done
/usr/sbin/dmsetup remove_all --noudevsync || fail "dmsetup remove_all failed"

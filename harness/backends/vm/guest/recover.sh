# Job `recover` (sourced by /init): let this kernel recover each crash image.
# PC_BATCH_DISK (default /dev/vda) holds PC_IMAGES images of PC_IMAGE_SECTORS sectors back to back;
# from image PC_FIRST on, each is exposed with dm-linear, mounted (journal/log
# recovery happens here) and unmounted. Results: "begin I" before touching
# image I, then "ok I" or "fail I MESSAGE"; a guest that dies after "begin I"
# died mounting image I. With PC_COVERAGE, "cov r ..." after the last image: the kernel
# functions all recovery mounts of the job ran (init.sh).

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
# One process for all mounts (forget, mount, umount: system calls, no process per image):
# harness/backends/vm/pc-recover.c, which also plants the test faults recovery-panic/-hang.
cover_begin
/usr/bin/pc-recover "$PC_FS" "${PC_MOUNT_OPTS:-defaults}" "$PC_FIRST" "$PC_IMAGES" "$PC_FAULT" >&8 \
    || fail "pc-recover failed"
cover_end r
/usr/sbin/dmsetup remove_all --noudevsync || fail "dmsetup remove_all failed"

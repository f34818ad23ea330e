#!/bin/busybox sh
# /init of powercut's guest (busybox sh). Mounts the basics, loads the
# modules listed in /pc/modules.list, runs the job named in /pc/job.env and
# powers off. Channels: ttyS0 = console (kernel messages, progress lines),
# ttyS1 = the workload's output, ttyS2 = results for the host, one per line.
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
# Raw: no \n -> \r\n translation, so the host gets the bytes as written.
stty -F /dev/ttyS1 raw -echo
stty -F /dev/ttyS2 raw -echo
exec 8>/dev/ttyS2

result() { echo "$*" >&8; }
say() { echo "pc: [$(cut -d" " -f1 /proc/uptime)] $*" > /dev/console; }
poweroff_now() { sync; poweroff -f; sleep 60; }
fail() { result "error $*"; say "error: $*"; poweroff_now; }
# btrfs keeps every device it has scanned, by fsid, until told to forget it. The
# jobs of a live guest start from host-made images that share one fsid, so an
# earlier job's registration must not stand in for the device about to be
# mounted: forget every unmounted one (only powercut's devices are in the guest).
# (pc-recover: one ioctl; `btrfs device scan --forget` cost ~0.15 s under TCG.)
forget_btrfs_devices() { /usr/bin/pc-recover forget-btrfs || say "forgetting btrfs devices failed"; }
# Kernel coverage (harness/backends/vm/cover/pc-cover.c): PC_COVERAGE names the modules
# whose functions are counted. Attached once per boot (~1 s under TCG), zeroed before the
# part of a job it measures and dumped as "cov TAG NAME:COUNT ..." after it. A kernel that
# cannot (no BPF kprobe-multi) says why once per job ("cov-error ..."); the job goes on.
cover_begin() {
    [ -n "$PC_COVERAGE" ] || return 0
    if [ "$(cat /run/pc-cover.mods 2> /dev/null)" != "$PC_COVERAGE" ]; then
        if /usr/bin/pc-cover attach $PC_COVERAGE > /dev/null 2> /run/pc-cover.err; then
            echo "$PC_COVERAGE" > /run/pc-cover.mods
        else
            echo "failed $PC_COVERAGE" > /run/pc-cover.mods
        fi
    fi
    if [ "$(cat /run/pc-cover.mods)" != "$PC_COVERAGE" ]; then
        result "cov-error $(head -n 1 /run/pc-cover.err)"
        PC_COVERAGE=""
        return 0
    fi
    /usr/bin/pc-cover reset
}
cover_end() { [ -z "$PC_COVERAGE" ] || /usr/bin/pc-cover dump "$1" >&8 || result "cov-error dump failed"; }

say "init"
for m in $(cat /pc/modules.list); do
    insmod "/pc/modules/$m" || fail "insmod $m failed"
done
result "kernel $(uname -r)"
. /pc/job.env
# No udev in the guest: dmsetup makes the /dev/mapper nodes itself.
export DM_DISABLE_UDEV=1
say "job $PC_JOB"
. "/pc/$PC_JOB.sh"
[ "$PC_JOB" = serve ] || result "done"
poweroff_now

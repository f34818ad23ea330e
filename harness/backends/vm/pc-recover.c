/* pc-recover: the recovery mounts of a vm guest's batch, in one process.
 *
 * Usage: pc-recover FS MOUNT_OPTS FIRST COUNT [FAULT]
 *        pc-recover forget-btrfs   (only the forgetting, before a recording's mount)
 *        pc-recover dump DIR FILE BYTES   (DIR's dump into FILE: tests of pc-dump.c)
 * For each image I in FIRST..COUNT-1, exposed by the caller as
 * /dev/mapper/pc-image-I (dm-linear over the batch disk): "begin I" on
 * stdout (the control channel), "pc: mount I" on /dev/console, then mount
 * it on /mnt (the kernel under test recovers it) and unmount it: "ok I", or
 * "fail I MESSAGE". For btrfs, the devices an earlier mount registered are
 * forgotten first (every image has the same fsid).
 *
 * Why a program and not a shell loop (harness/backends/vm/guest/recover.sh
 * before): under TCG each process the guest starts costs tens of ms, and
 * `btrfs device scan --forget`, mount and umount were three per image,
 * more than half of a btrfs recovery's guest time. Here each image is
 * three system calls.
 *
 * MOUNT_OPTS is mount(8)'s -o list: the generic flags below become mount(2)
 * flags, the rest is the file system's data string, as mount(8) passes it.
 * FAULT (tests): recovery-panic crashes the kernel at image 0's mount (sysrq),
 * recovery-hang suspends image 0's device first so its mount waits forever.
 *
 * With PC_DUMP_BYTES set (the host cannot mount this file system), each
 * recovered image is remounted read-only and its tree written (pc-dump.c) to
 * PC_BATCH_DISK at PC_DUMP_AT + I * PC_DUMP_BYTES before the unmount.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pc-dump.h"

struct flag {
    const char *name;
    unsigned long set, clear;
};

static const struct flag FLAGS[] = {
    {"defaults", 0, 0},
    {"ro", MS_RDONLY, 0},          {"rw", 0, MS_RDONLY},
    {"nosuid", MS_NOSUID, 0},      {"suid", 0, MS_NOSUID},
    {"nodev", MS_NODEV, 0},        {"dev", 0, MS_NODEV},
    {"noexec", MS_NOEXEC, 0},      {"exec", 0, MS_NOEXEC},
    {"sync", MS_SYNCHRONOUS, 0},   {"async", 0, MS_SYNCHRONOUS},
    {"dirsync", MS_DIRSYNC, 0},
    {"noatime", MS_NOATIME, 0},    {"atime", 0, MS_NOATIME},
    {"nodiratime", MS_NODIRATIME, 0}, {"diratime", 0, MS_NODIRATIME},
    {"relatime", MS_RELATIME, 0},  {"norelatime", 0, MS_RELATIME},
    {"strictatime", MS_STRICTATIME, 0},
    {"lazytime", MS_LAZYTIME, 0},  {"nolazytime", 0, MS_LAZYTIME},
    {"silent", MS_SILENT, 0},      {"loud", 0, MS_SILENT},
    {"mand", MS_MANDLOCK, 0},      {"nomand", 0, MS_MANDLOCK},
};

/* Split OPTS into mount(2) flags and the data string (written to DATA). */
static unsigned long parse_opts(const char *opts, char *data, size_t size) {
    unsigned long flags = 0;
    char *copy = strdup(opts), *save = NULL;
    data[0] = '\0';
    for (char *o = strtok_r(copy, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
        size_t i, n = sizeof(FLAGS) / sizeof(FLAGS[0]);
        for (i = 0; i < n && strcmp(o, FLAGS[i].name) != 0; i++)
            ;
        if (i < n) {
            flags = (flags | FLAGS[i].set) & ~FLAGS[i].clear;
        } else if (strlen(data) + strlen(o) + 2 < size) {
            if (data[0])
                strcat(data, ",");
            strcat(data, o);
        }
    }
    free(copy);
    return flags;
}

static int forget_btrfs_devices(FILE *console) {
    struct btrfs_ioctl_vol_args args;
    int fd = open("/dev/btrfs-control", O_RDWR | O_CLOEXEC), ok;
    memset(&args, 0, sizeof(args));  /* no name: every device not in a mounted file system */
    ok = fd >= 0 && ioctl(fd, BTRFS_IOC_FORGET_DEV, &args) == 0;
    if (!ok)
        fprintf(console, "pc: forgetting btrfs devices failed: %s\n", strerror(errno));
    if (fd >= 0)
        close(fd);
    return ok;
}

static void suspend_device(const char *name) {
    pid_t pid = fork();
    if (pid == 0) {
        execl("/usr/sbin/dmsetup", "dmsetup", "suspend", "--nolockfs", "--noudevsync", name, (char *)NULL);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "forget-btrfs") == 0)
        return forget_btrfs_devices(stderr) ? 0 : 1;
    if (argc == 5 && strcmp(argv[1], "dump") == 0) {
        int fd = open(argv[3], O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        return fd >= 0 && dump_tree(argv[2], fd, 0, strtoull(argv[4], NULL, 10)) == 0 ? 0 : 1;
    }
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: pc-recover FS MOUNT_OPTS FIRST COUNT [FAULT]\n");
        return 2;
    }
    const char *fs = argv[1], *fault = argc == 6 ? argv[5] : "";
    int first = atoi(argv[3]), count = atoi(argv[4]);
    char data[4096], dev[64];
    unsigned long flags = parse_opts(argv[2], data, sizeof(data));
    int btrfs = strcmp(fs, "btrfs") == 0;
    FILE *console = fopen("/dev/console", "w");
    if (console == NULL)
        console = stderr;
    setvbuf(stdout, NULL, _IOLBF, 0);
    setvbuf(console, NULL, _IOLBF, 0);
    const char *dump_bytes = getenv("PC_DUMP_BYTES"), *dump_at = getenv("PC_DUMP_AT");
    int dump_fd = -1;
    if (dump_bytes && *dump_bytes) {
        const char *disk = getenv("PC_BATCH_DISK");
        dump_fd = open(disk && *disk ? disk : "/dev/vda", O_RDWR | O_CLOEXEC);
        if (dump_fd < 0) {
            fprintf(stderr, "pc-recover: opening the batch disk for the dumps: %s\n", strerror(errno));
            return 1;
        }
    }
    for (int i = first; i < count; i++) {
        snprintf(dev, sizeof(dev), "/dev/mapper/pc-image-%d", i);
        printf("begin %d\n", i);
        fprintf(console, "pc: mount %d\n", i);  /* a kernel message after this belongs to image I */
        if (i == 0 && strcmp(fault, "recovery-panic") == 0) {
            int fd = open("/proc/sysrq-trigger", O_WRONLY);
            if (fd >= 0 && write(fd, "c", 1) < 0)
                fprintf(console, "pc: sysrq failed\n");
        }
        if (i == 0 && strcmp(fault, "recovery-hang") == 0)
            suspend_device("pc-image-0");
        if (btrfs)
            forget_btrfs_devices(console);
        if (mount(dev, "/mnt", fs, flags, data[0] ? data : NULL) != 0) {
            printf("fail %d mount: mounting %s on /mnt failed: %s\n", i, dev, strerror(errno));
            continue;
        }
        if (dump_fd >= 0) {
            /* Read-only first: reading the tree must not change the image (atime) fsck checks next. */
            if (mount(NULL, "/mnt", NULL, MS_REMOUNT | MS_RDONLY | flags, data[0] ? data : NULL) != 0)
                fprintf(console, "pc: read-only remount of image %d failed: %s\n", i, strerror(errno));
            uint64_t size = strtoull(dump_bytes, NULL, 10), at = strtoull(dump_at ? dump_at : "0", NULL, 10);
            if (dump_tree("/mnt", dump_fd, at + (uint64_t)i * size, size) != 0)
                fprintf(console, "pc: the dump of image %d is incomplete\n", i);
        }
        if (umount("/mnt") != 0)
            printf("fail %d umount: can't unmount /mnt: %s\n", i, strerror(errno));
        else
            printf("ok %d\n", i);
    }
    return 0;
}

/* f2fs_atomic: the f2fs atomic-write ioctls SQLite uses on Android
 * (include/uapi/linux/f2fs.h; spelled out here so the executor builds where
 * the headers lack F2FS_IOC_START_ATOMIC_REPLACE, Linux 6.3+). START opens a
 * batch on the fd's file (REPLACE: one that starts from an empty file), the
 * writes that follow on it are the batch, COMMIT makes it the file's content,
 * ABORT (or the last close of a writable fd) drops it. Other file systems
 * answer ENOTTY. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "pcexec.h"

#define PC_F2FS_IOCTL_MAGIC 0xf5
#define PC_F2FS_IOC_START_ATOMIC_WRITE _IO(PC_F2FS_IOCTL_MAGIC, 1)
#define PC_F2FS_IOC_COMMIT_ATOMIC_WRITE _IO(PC_F2FS_IOCTL_MAGIC, 2)
#define PC_F2FS_IOC_ABORT_ATOMIC_WRITE _IO(PC_F2FS_IOCTL_MAGIC, 5)
#define PC_F2FS_IOC_START_ATOMIC_REPLACE _IO(PC_F2FS_IOCTL_MAGIC, 25)

static int armed_fd = -1;

/* PC_EXEC_FAULT=early-commit (tests only): commit a batch right after its first
 * write, unrecorded, so the rest of it lands as plain writes while the records
 * still say one batch committed at its COMMIT: the checker sees a file system
 * that left half a committed batch on disk (a planted violation). */
static int early_commit(void)
{
    const char *f = getenv("PC_EXEC_FAULT");
    return f && !strcmp(f, "early-commit");
}

int pc_f2fs_atomic(int fd, const struct pc_op *op)
{
    switch (op->flags) {
    case PC_F2FS_start:
    case PC_F2FS_replace: {
        int r = ioctl(fd, op->flags == PC_F2FS_start ? PC_F2FS_IOC_START_ATOMIC_WRITE
                                                     : PC_F2FS_IOC_START_ATOMIC_REPLACE);
        if (!r && early_commit())
            armed_fd = fd;
        return r;
    }
    case PC_F2FS_commit:
        if (armed_fd == fd)
            armed_fd = -1;
        return ioctl(fd, PC_F2FS_IOC_COMMIT_ATOMIC_WRITE);
    case PC_F2FS_abort:
        if (armed_fd == fd)
            armed_fd = -1;
        return ioctl(fd, PC_F2FS_IOC_ABORT_ATOMIC_WRITE);
    default: /* none or several named: the schema allows one (a hand-written plan may not) */
        errno = EINVAL;
        return -1;
    }
}

void pc_f2fs_atomic_wrote(int fd)
{
    if (fd >= 0 && fd == armed_fd) {
        armed_fd = -1;
        (void)ioctl(fd, PC_F2FS_IOC_COMMIT_ATOMIC_WRITE);
    }
}

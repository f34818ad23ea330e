/* exchange_range: XFS_IOC_EXCHANGE_RANGE (ioctl_xfs_exchange_range(2), Linux 6.10+).
 * The request layout and ioctl number are those of the kernel's
 * fs/xfs/libxfs/xfs_fs.h; they are spelled out here because the build host's
 * xfslibs-dev (Debian bookworm: 6.1) predates them. */
#include <stdint.h>
#include <sys/ioctl.h>

#include "pcexec.h"

struct pc_xfs_exchange_range {
    int32_t file1_fd;
    uint32_t pad;          /* must be zero */
    uint64_t file1_offset;
    uint64_t file2_offset;
    uint64_t length;
    uint64_t flags;
};
_Static_assert(sizeof(struct pc_xfs_exchange_range) == 40, "the kernel's struct xfs_exchange_range");

#define PC_XFS_IOC_EXCHANGE_RANGE _IOW('X', 129, struct pc_xfs_exchange_range)

int pc_exchange_range(int file1, int file2, const struct pc_op *op)
{
    struct pc_xfs_exchange_range x = {
        .file1_fd = file1, .file1_offset = op->from_offset, .file2_offset = op->offset,
        .length = op->length, .flags = (uint64_t)(unsigned)op->flags,
    };
    return ioctl(file2, PC_XFS_IOC_EXCHANGE_RANGE, &x);
}

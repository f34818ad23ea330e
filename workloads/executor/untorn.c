/* What pwritev2 and statx need beyond ops.c: the iovecs of a pwritev2, and
 * statx of the untorn ("atomic") write limits. The build headers (Debian 12:
 * linux-libc-dev 6.1) predate RWF_ATOMIC (6.11) and the statx atomic-write
 * fields, so statx goes through the raw syscall with the kernel's struct
 * layout (include/uapi/linux/stat.h, 256 bytes). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pcexec.h"

struct pc_statx_ts {
    int64_t sec;
    uint32_t nsec;
    int32_t pad;
};

struct pc_statx {
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, pad0;
    uint64_t ino, size, blocks, attributes_mask;
    struct pc_statx_ts atime, btime, ctime, mtime;
    uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
    uint64_t mnt_id;
    uint32_t dio_mem_align, dio_offset_align;
    uint64_t subvol;
    uint32_t atomic_write_unit_min, atomic_write_unit_max, atomic_write_segments_max;
    uint32_t dio_read_offset_align, atomic_write_unit_max_opt, spare2;
    uint64_t spare3[8];
};
_Static_assert(sizeof(struct pc_statx) == 256, "struct statx is 256 bytes");
_Static_assert(offsetof(struct pc_statx, dio_mem_align) == 152, "statx layout");
_Static_assert(offsetof(struct pc_statx, atomic_write_unit_min) == 168, "statx layout");
_Static_assert(offsetof(struct pc_statx, atomic_write_unit_max_opt) == 184, "statx layout");

#define PC_STATX_ATTR_WRITE_ATOMIC 0x00400000ULL

static int strip_atomic = -1;

/* PC_EXEC_FAULT=strip-atomic (tests only): issue RWF_ATOMIC writes without
 * the flag while recording them as asked, so the checker sees a file system
 * that "broke" its untorn-write promise (a planted violation). */
int pc_fault_strip_atomic(void)
{
    if (strip_atomic < 0) {
        const char *f = getenv("PC_EXEC_FAULT");
        if (f && *f && strcmp(f, "strip-atomic") && strcmp(f, "early-commit"))
            pc_die("PC_EXEC_FAULT=%s: unknown fault (known: strip-atomic, early-commit)", f);
        strip_atomic = f && !strcmp(f, "strip-atomic");
    }
    return strip_atomic;
}

int pc_iov_fill(const struct pc_op *op, uint8_t *buf, struct iovec *iov)
{
    for (uint32_t i = 0; i < op->niov; i++) {
        iov[i].iov_base = buf;
        iov[i].iov_len = (size_t)op->iov[i];
        buf += op->iov[i];
    }
    return (int)op->niov;
}

int pc_rwf_flags(const struct pc_op *op)
{
    return pc_fault_strip_atomic() ? op->flags & ~PC_RWF_ATOMIC : op->flags;
}

int pc_statx_raw(const char *path, unsigned mask, struct pc_statx *sx)
{
    return (int)syscall(SYS_statx, AT_FDCWD, path, 0, mask, sx);
}

/* log2(V) + 1, 0 for 0; sets *INEXACT when V is not a power of two. */
static uint64_t log_code(uint32_t v, int *inexact)
{
    if (!v)
        return 0;
    if (v & (v - 1))
        *inexact = 1;
    return (uint64_t)(31 - __builtin_clz(v)) + 1;
}

/* The limits in one record's aux (decoded by workloads/results.py):
 * byte 0 atomic write unit min, 1 unit max, 2 unit max_opt, 4 direct I/O
 * memory alignment, 5 direct I/O offset alignment (each log2 + 1, 0: none),
 * 3 segments max (capped at 255), 6 bits: 1 STATX_WRITE_ATOMIC answered,
 * 2 STATX_DIOALIGN answered, 4 STATX_ATTR_WRITE_ATOMIC set, 8 a value was
 * not a power of two (rounded down). */
int64_t pc_statx_pack(const struct pc_statx *sx)
{
    int inexact = 0;
    uint64_t a = log_code(sx->atomic_write_unit_min, &inexact) |
                 log_code(sx->atomic_write_unit_max, &inexact) << 8 |
                 log_code(sx->atomic_write_unit_max_opt, &inexact) << 16 |
                 (uint64_t)(sx->atomic_write_segments_max > 255 ? 255 : sx->atomic_write_segments_max) << 24 |
                 log_code(sx->dio_mem_align, &inexact) << 32 |
                 log_code(sx->dio_offset_align, &inexact) << 40;
    uint64_t bits = (sx->mask & PC_STATX_WRITE_ATOMIC ? 1u : 0u) | (sx->mask & PC_STATX_DIOALIGN ? 2u : 0u) |
                    (sx->attributes & PC_STATX_ATTR_WRITE_ATOMIC ? 4u : 0u) | (inexact ? 8u : 0u);
    return (int64_t)(a | bits << 48);
}

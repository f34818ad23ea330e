/* One op: prepare (outside the clock), issue the syscall(s) between two
 * clock_gettime calls, record the result. A failing syscall is data for the
 * oracle, not an error of the executor. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <linux/limits.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "pcexec.h"

/* Only the syscall sits between the two clock reads; errno is taken before
 * the second read so nothing can overwrite it. */
#define TIMED(r, call)                          \
    do {                                        \
        (r)->start_ns = pc_now_ns();            \
        int64_t rv_ = (int64_t)(call);          \
        (r)->err = rv_ < 0 ? errno : 0;         \
        (r)->end_ns = pc_now_ns();              \
        (r)->ret = rv_;                         \
    } while (0)

static long page_size;
/* Set while an mmap_write copies: a SIGBUS (page beyond EOF, ENOSPC on a
 * hole) jumps back here instead of killing the run. */
static _Thread_local sigjmp_buf *volatile bus_jmp; /* volatile: memcpy must not hide the stores */

static void on_sigbus(int sig)
{
    if (bus_jmp)
        siglongjmp(*bus_jmp, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

void pc_ops_init(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sa.sa_flags = SA_NODEFER; /* the jump leaves the handler: keep SIGBUS unblocked */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    page_size = sysconf(_SC_PAGESIZE);
    pc_fault_strip_atomic(); /* an unknown fault ends the run before any op */
}

/* memcpy that returns EFAULT instead of dying of SIGBUS. */
static int guarded_copy(void *dst, const void *src, size_t n)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) {
        bus_jmp = NULL;
        return EFAULT;
    }
    bus_jmp = &jb;
    memcpy(dst, src, n);
    bus_jmp = NULL;
    return 0;
}

/* map, copy, optionally msync, unmap: the whole sequence is the timed op. */
static int mmap_write(int fd, const uint8_t *src, uint64_t off, size_t len, int do_msync,
                      uint16_t *flags)
{
    uint64_t base = off - off % (uint64_t)page_size;
    size_t maplen = len + (size_t)(off - base);
    uint8_t *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
    if (map == MAP_FAILED)
        return -1;
    int err = guarded_copy(map + (off - base), src, len);
    if (err)
        *flags |= REC_SIGBUS;
    else if (do_msync && msync(map, maplen, MS_SYNC))
        err = errno;
    munmap(map, maplen);
    errno = err;
    return err ? -1 : 0;
}

#define FIEMAP_BATCH 64

/* The file's extents as filefrag counts them: one that continues the
 * previous extent on disk (right after it, or at the same disk-to-file
 * offset across a hole) is the same extent. FLAGS: FIEMAP_FLAG_SYNC or 0. */
static int64_t count_extents(int fd, uint32_t flags)
{
    struct {
        struct fiemap fm;
        struct fiemap_extent ext[FIEMAP_BATCH];
    } b;
    struct fiemap_extent prev = { 0 };
    int64_t count = 0;
    uint64_t start = 0;
    for (;;) {
        memset(&b.fm, 0, sizeof b.fm);
        b.fm.fm_start = start;
        b.fm.fm_length = FIEMAP_MAX_OFFSET - start;
        b.fm.fm_flags = flags;
        b.fm.fm_extent_count = FIEMAP_BATCH;
        if (ioctl(fd, FS_IOC_FIEMAP, &b.fm) < 0)
            return -1;
        for (uint32_t i = 0; i < b.fm.fm_mapped_extents; i++) {
            const struct fiemap_extent *e = &b.ext[i];
            if (!count || (e->fe_physical != prev.fe_physical + prev.fe_length &&
                           e->fe_physical != prev.fe_physical + (e->fe_logical - prev.fe_logical)))
                count++;
            prev = *e;
            if (e->fe_flags & FIEMAP_EXTENT_LAST)
                return count;
        }
        if (b.fm.fm_mapped_extents < FIEMAP_BATCH)
            return count;
        start = prev.fe_logical + prev.fe_length;
        flags &= ~(uint32_t)FIEMAP_FLAG_SYNC; /* written back once is enough */
    }
}

static int sleep_us(uint64_t us)
{
    struct timespec ts = { .tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000 };
    int e = clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
    errno = e;
    return e ? -1 : 0;
}

static int barrier_wait(pthread_barrier_t *b)
{
    int e = pthread_barrier_wait(b);
    if (e == PTHREAD_BARRIER_SERIAL_THREAD)
        return 0;
    errno = e;
    return e ? -1 : 0;
}

/* Where a write/read at the current position will land. */
static int64_t position(const struct pc_fd *f)
{
    struct stat st;
    if (f->append)
        return fstat(f->fd, &st) ? 0 : st.st_size;
    off_t pos = lseek(f->fd, 0, SEEK_CUR);
    return pos < 0 ? 0 : pos;
}

/* Where a pwritev2 will land: the end of file with O_APPEND or RWF_APPEND,
 * the fd's position for offset -1, else its offset. */
static int64_t pwritev2_offset(const struct pc_fd *f, const struct pc_op *op, uint64_t off)
{
    struct stat st;
    if (f->append || (op->flags & RWF_APPEND))
        return fstat(f->fd, &st) ? 0 : st.st_size;
    return op->at_position ? position(f) : (int64_t)off;
}

/* setxattr of COUNT names with one value: NAME, then NAME.1 .. NAME.(COUNT-1) (what
 * Samba, Ceph and backup tools do to one file, at one record's cost). Stops at the
 * first failure; *DONE is how many were set, so the model applies exactly those. */
static int set_xattrs(const struct pc_op *op, const void *value, size_t len, int64_t *done)
{
    char name[XATTR_NAME_MAX + 1];
    uint64_t n = op->count ? op->count : 1;
    *done = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *nm = op->name;
        if (i) {
            if (snprintf(name, sizeof name, "%s.%llu", op->name, (unsigned long long)i) >= (int)sizeof name) {
                errno = ERANGE;  /* what setxattr(2) answers for a name longer than XATTR_NAME_MAX */
                return -1;
            }
            nm = name;
        }
        if (setxattr(op->path, nm, value, len, 0))
            return -1;
        *done = (int64_t)(i + 1);
    }
    return 0;
}

static void set_slot(struct pc_fd *f, int64_t fd, int append)
{
    f->fd = fd < 0 ? -1 : (int)fd;
    f->append = append;
}

void pc_exec_op(const struct pc_plan *plan, struct pc_thread *t, const struct pc_op *op,
                uint32_t iter, struct pc_record *r)
{
    struct pc_fd *slot = op->fd >= 0 ? &t->fds[op->fd] : NULL;
    int fd = slot ? slot->fd : -1;
    uint64_t off = op->offset + (uint64_t)iter * op->stride;
    size_t len = (size_t)op->length;

    memset(r, 0, sizeof *r);
    r->seq = op->seq;
    r->iter = iter;
    r->thread = (uint16_t)t->index;
    int from = op->from_fd >= 0 ? t->fds[op->from_fd].fd : -1;
    if ((slot && fd < 0 && op->kind != K_OPEN && op->kind != K_CREAT) || (op->from_fd >= 0 && from < 0)) {
        /* its open failed (the loader proved it was opened): no kernel call */
        r->start_ns = r->end_ns = pc_now_ns();
        r->ret = -1;
        r->err = EBADF;
        r->flags = REC_SKIPPED;
        return;
    }
    switch (op->kind) {
    case K_WRITE:
        off = (uint64_t)position(slot);
        /* fall through */
    case K_PWRITE:
    case K_MMAP_WRITE:
        pc_pattern_fill(t->buf, plan->wid, op->file_id, op->seq, iter, off, len);
        break;
    case K_SETXATTR:
    case K_FSETXATTR: /* a value is the pattern of its own offset 0 */
        pc_pattern_fill(t->buf, plan->wid, op->file_id, op->seq, iter, 0, len);
        break;
    case K_PWRITEV2:
        off = (uint64_t)pwritev2_offset(slot, op, off);
        pc_pattern_fill(t->buf, plan->wid, op->file_id, op->seq, iter, off, len);
        break;
    case K_READ:
        off = (uint64_t)position(slot);
        break;
    default:
        break;
    }
    r->aux = (int64_t)off;

    switch (op->kind) {
    case K_OPEN:
        TIMED(r, open(op->path, op->flags, op->mode));
        set_slot(slot, r->ret, !!(op->flags & O_APPEND));
        break;
    case K_CREAT:
        TIMED(r, creat(op->path, op->mode));
        set_slot(slot, r->ret, 0);
        break;
    case K_CLOSE:
        TIMED(r, close(fd));
        set_slot(slot, -1, 0);
        break;
    case K_WRITE: TIMED(r, write(fd, t->buf, len)); pc_f2fs_atomic_wrote(fd); break;
    case K_PWRITE: TIMED(r, pwrite(fd, t->buf, len, (off_t)off)); pc_f2fs_atomic_wrote(fd); break;
    case K_READ: TIMED(r, read(fd, t->buf, len)); break;
    case K_PREAD: TIMED(r, pread(fd, t->buf, len, (off_t)off)); break;
    case K_FALLOCATE: TIMED(r, fallocate(fd, op->flags, (off_t)off, (off_t)len)); break;
    case K_FTRUNCATE: TIMED(r, ftruncate(fd, (off_t)len)); break;
    case K_TRUNCATE: TIMED(r, truncate(op->path, (off_t)len)); break;
    case K_FSYNC: TIMED(r, fsync(fd)); break;
    case K_FDATASYNC: TIMED(r, fdatasync(fd)); break;
    case K_SYNC: TIMED(r, (sync(), 0)); break;
    case K_SYNCFS: TIMED(r, syncfs(fd)); break;
    case K_SYNC_FILE_RANGE:
        TIMED(r, sync_file_range(fd, (off_t)off, (off_t)len, (unsigned)op->flags));
        break;
    case K_RENAME:
        TIMED(r, renameat2(AT_FDCWD, op->path, AT_FDCWD, op->path2, (unsigned)op->flags));
        break;
    case K_LINK: TIMED(r, link(op->path, op->path2)); break;
    case K_LINKAT: TIMED(r, linkat(fd, "", AT_FDCWD, op->path2, AT_EMPTY_PATH)); break;
    case K_COPY_FILE_RANGE: {
        loff_t in = (loff_t)op->from_offset, out = (loff_t)off;
        TIMED(r, copy_file_range(from, &in, fd, &out, len, 0));
        break;
    }
    case K_CLONE:
        if (!op->from_offset && !op->offset && !op->length) {
            TIMED(r, ioctl(fd, FICLONE, from));
        } else {
            struct file_clone_range fcr = { .src_fd = from, .src_offset = op->from_offset,
                                            .src_length = op->length, .dest_offset = off };
            TIMED(r, ioctl(fd, FICLONERANGE, &fcr));
        }
        break;
    case K_EXCHANGE_RANGE: TIMED(r, pc_exchange_range(from, fd, op)); break;
    case K_F2FS_ATOMIC: TIMED(r, pc_f2fs_atomic(fd, op)); break;
    case K_SYMLINK: TIMED(r, symlink(op->path2, op->path)); break;
    case K_UNLINK: TIMED(r, unlink(op->path)); break;
    case K_MKDIR: TIMED(r, mkdir(op->path, op->mode)); break;
    case K_RMDIR: TIMED(r, rmdir(op->path)); break;
    case K_SETXATTR: TIMED(r, set_xattrs(op, t->buf, len, &r->aux)); break;
    case K_FSETXATTR: TIMED(r, fsetxattr(fd, op->name, t->buf, len, op->flags)); break;
    case K_REMOVEXATTR: TIMED(r, removexattr(op->path, op->name)); break;
    case K_MMAP_WRITE: TIMED(r, mmap_write(fd, t->buf, off, len, op->msync, &r->flags)); break;
    case K_FIEMAP: TIMED(r, count_extents(fd, (uint32_t)op->flags)); break;
    case K_PWRITEV2: {
        struct iovec iov[PC_MAX_IOV];
        int n = pc_iov_fill(op, t->buf, iov), flags = pc_rwf_flags(op);
        TIMED(r, pwritev2(fd, iov, n, op->at_position ? -1 : (off_t)(op->offset + (uint64_t)iter * op->stride),
                          flags));
        break;
    }
    case K_STATX: {
        _Alignas(8) uint8_t sx[PC_STATX_SIZE];
        memset(sx, 0, sizeof sx);
        TIMED(r, pc_statx_raw(op->path, (unsigned)op->flags, (struct pc_statx *)sx));
        r->aux = r->ret < 0 ? 0 : pc_statx_pack((const struct pc_statx *)sx);
        break;
    }
    case K_SLEEP: TIMED(r, sleep_us(op->us)); break;
    case K_BARRIER: TIMED(r, barrier_wait(&plan->barriers[op->barrier].b)); break;
    case K_REPEAT: /* run.c drives repeats */
    case K__COUNT:
        pc_die("internal: op kind %d reached pc_exec_op", (int)op->kind);
    }
}

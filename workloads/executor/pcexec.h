/* pc-exec: runs a compiled powercut workload plan, timing every op.
 * Shared types of the executor's modules (plan.c parses, run.c drives
 * threads, ops.c issues the syscalls, pattern.c makes the data, records.c
 * writes the results, main.c is the command line). */
#ifndef PCEXEC_H
#define PCEXEC_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#define PC_MAX_IOV 16

/* Op kinds: generated from the workload schema (workloads/plan_schema.py, `make`
 * writes it to the build directory), with plan.c's kind names, fields and flags. */
#include "pc-kinds.h"

struct pc_op {
    enum pc_kind kind;
    uint32_t seq;
    int fd;            /* slot in the thread's fd table, -1: none */
    int from_fd;       /* copy_file_range, clone: the source's slot; exchange_range: file1's; -1: none */
    uint64_t from_offset; /* copy_file_range, clone: where the source range starts; exchange_range: file1's */
    uint32_t file_id;  /* pattern file id of the data this op writes */
    int flags;         /* the kind's flag names as their values (its x-plan flags: open's O_ flags,
                          fallocate's mode, statx's mask, ...); fiemap: FIEMAP_FLAG_SYNC or 0 */
    int at_position;   /* pwritev2 with offset -1: at the fd's position */
    uint32_t niov;     /* pwritev2: iovec count and lengths (summing to length) */
    uint64_t iov[PC_MAX_IOV];
    int msync;         /* mmap_write: msync(MS_SYNC) before munmap */
    unsigned mode;     /* open, creat, mkdir */
    uint64_t offset, stride, length;
    uint64_t us;       /* sleep */
    uint64_t count, period_us; /* repeat */
    int barrier;       /* index into pc_plan.barriers */
    char *path;        /* path, rename/link "from", symlink's link path */
    char *path2;       /* rename/link "to", symlink "target" */
    char *name;        /* xattr name */
    struct pc_op *body;
    size_t nbody;
};

/* One timed op (or one repeat iteration): the records file's layout too. */
struct pc_record {
    uint32_t seq, iter;
    uint16_t thread, flags;
    int32_t err;       /* errno, 0 on success */
    int64_t ret;       /* syscall return value */
    uint64_t start_ns, end_ns; /* CLOCK_MONOTONIC */
    int64_t aux;       /* repeat: lateness ns; offset-taking ops: the file offset used;
                          statx: the limits, packed (untorn.c) */
};
_Static_assert(sizeof(struct pc_record) == 48, "record layout is part of the file format");

enum {
    REC_DEADLINE_MISS = 1, /* repeat iteration started > 1 period late or overran its slot */
    REC_SKIPPED = 2,       /* fd was never opened: EBADF recorded, kernel not called */
    REC_SIGBUS = 4,        /* mmap_write copy faulted (e.g. beyond EOF): EFAULT recorded */
};

struct pc_fd {
    int fd;            /* -1: closed or open failed */
    int append;        /* opened with O_APPEND: writes land at end of file */
};

struct pc_thread {
    unsigned index;
    char *name;
    const char *policy_name;
    int policy, priority, nice, cpu; /* cpu -1: not pinned */
    struct pc_op *ops;
    size_t nops;
    struct pc_fd *fds;
    size_t nfds;
    uint8_t *buf;      /* data buffer, 4096-aligned (O_DIRECT) */
    size_t buflen;
    struct pc_record *recs;
    size_t nrecs, maxrecs;
    pthread_t tid;
    char setup_error[256]; /* non-empty: sched/affinity set-up failed */
};

struct pc_barrier {
    char *name;
    unsigned parties;
    pthread_barrier_t b;
};

struct pc_plan {
    uint32_t wid;
    char *name;
    struct pc_thread *threads;
    size_t nthreads;
    struct pc_barrier *barriers;
    size_t nbarriers;
};

/* Ends the program with exit status 2 and one line on stderr. */
_Noreturn void pc_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Stores the N low bytes of V little-endian: every file format here is LE. */
static inline void pc_put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t pc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* plan.c */
void pc_plan_parse(FILE *f, const char *what, struct pc_plan *plan);

/* untorn.c: pwritev2 and statx (headers may predate RWF_ATOMIC and STATX_WRITE_ATOMIC) */
#define PC_RWF_ATOMIC 0x00000040
#define PC_STATX_WRITE_ATOMIC 0x00010000U
#define PC_STATX_DIOALIGN 0x00002000U
#define PC_STATX_BASIC_STATS 0x000007ffU
struct iovec;
struct pc_statx;
int pc_fault_strip_atomic(void);
int pc_iov_fill(const struct pc_op *op, uint8_t *buf, struct iovec *iov); /* returns the count */
int pc_rwf_flags(const struct pc_op *op); /* the flags to issue (a planted fault may strip some) */
int pc_statx_raw(const char *path, unsigned mask, struct pc_statx *sx);
int64_t pc_statx_pack(const struct pc_statx *sx);
#define PC_STATX_SIZE 256

/* exchange.c: XFS_IOC_EXCHANGE_RANGE on file2 with file1's range (headers may predate it) */
#define PC_XCHG_TO_EOF 0x1u         /* XFS_EXCHANGE_RANGE_TO_EOF */
#define PC_XCHG_DSYNC 0x2u          /* XFS_EXCHANGE_RANGE_DSYNC */
#define PC_XCHG_FILE1_WRITTEN 0x8u  /* XFS_EXCHANGE_RANGE_FILE1_WRITTEN */
int pc_exchange_range(int file1, int file2, const struct pc_op *op);

/* f2fs_atomic.c: the f2fs atomic-write ioctls; op->flags names one (several: EINVAL) (the flag names are
 * the workload's action values: the schema's x-plan prefixes them with PC_F2FS_) */
enum pc_f2fs_atomic { PC_F2FS_start = 1, PC_F2FS_replace = 2, PC_F2FS_commit = 4, PC_F2FS_abort = 8 };
int pc_f2fs_atomic(int fd, const struct pc_op *op);
/* after a write on FD: the planted early-commit fault (tests only) commits a batch here */
void pc_f2fs_atomic_wrote(int fd);

/* pattern.c */
void pc_pattern_fill(uint8_t *dst, uint32_t wid, uint32_t file_id, uint32_t seq,
                     uint32_t iter, uint64_t offset, size_t len);
int pc_pattern_dump(int argc, char **argv);

/* ops.c */
void pc_ops_init(void);
void pc_exec_op(const struct pc_plan *plan, struct pc_thread *t, const struct pc_op *op,
                uint32_t iter, struct pc_record *r);

/* run.c */
struct pc_run_opts {
    int mark_fd;           /* -1: no marks */
    const char *mark_prefix;
};
struct pc_run_result {
    uint64_t start_ns, end_ns;
    uint32_t mark_failures;
    int mark_errno;        /* errno of the first failed mark write */
};
void pc_prepare(struct pc_plan *plan);
void pc_run(struct pc_plan *plan, const struct pc_run_opts *o, struct pc_run_result *res);

/* records.c */
struct pc_overhead {
    uint64_t min_ns, median_ns;
};
void pc_measure_overhead(struct pc_overhead *ov);
int pc_write_records(FILE *f, const struct pc_plan *plan, const struct pc_overhead *ov,
                     const struct pc_run_result *res);

#endif

/* Threads, repeats and marks. Everything a run needs is allocated and
 * touched in pc_prepare, before any thread starts: the timed region does no
 * allocation and no I/O of the executor's own (marks are written between
 * ops, outside the clock). */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pcexec.h"

#define MAX_RECORDS (16u << 20)   /* 768 MiB of records: more is a workload bug */
#define THREAD_STACK (1u << 20)   /* locked by mlockall: keep it small */

static struct {
    const struct pc_plan *plan;
    const struct pc_run_opts *opts;
    pthread_barrier_t setup, go;
    int ok;                        /* written before `go`, read after it */
    atomic_uint mark_failures;
    atomic_int mark_errno;
} run;

/* Records the ops produce (a repeat: one per iteration besides its body's),
 * checking that no op's iteration number overflows 32 bits. */
static uint64_t count_records(const struct pc_op *ops, size_t n, uint64_t iters)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t each = 1;
        if (ops[i].kind == K_REPEAT) {
            if (iters * ops[i].count > (uint64_t)UINT32_MAX + 1)
                pc_die("op %u: nested repeats exceed 2^32 iterations", ops[i].seq);
            each = ops[i].count * (1 + count_records(ops[i].body, ops[i].nbody, iters * ops[i].count));
        }
        total += each;
        if (each > MAX_RECORDS || total > MAX_RECORDS)
            pc_die("the plan would record more than %u ops", MAX_RECORDS);
    }
    return total;
}

/* The largest data buffer any op of the list needs. */
static uint64_t max_length(const struct pc_op *ops, size_t n)
{
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t l = 0;
        switch (ops[i].kind) {
        case K_WRITE: case K_PWRITE: case K_READ: case K_PREAD: case K_SETXATTR: case K_MMAP_WRITE:
        case K_PWRITEV2:
            l = ops[i].length;
            break;
        case K_REPEAT:
            l = max_length(ops[i].body, ops[i].nbody);
            break;
        default:
            break;
        }
        m = l > m ? l : m;
    }
    return m;
}

static void *alloc_touched(size_t size, size_t align)
{
    void *p;
    if (posix_memalign(&p, align, size ? size : align))
        pc_die("cannot allocate %zu bytes", size);
    memset(p, 0, size); /* fault every page in now, not inside the clock */
    return p;
}

void pc_prepare(struct pc_plan *plan)
{
    for (size_t i = 0; i < plan->nthreads; i++) {
        struct pc_thread *t = &plan->threads[i];
        t->maxrecs = count_records(t->ops, t->nops, 1);
        t->recs = alloc_touched(t->maxrecs * sizeof *t->recs, 64);
        uint64_t len = max_length(t->ops, t->nops);
        if (len > (1u << 30))
            pc_die("thread %s: an op of %llu bytes exceeds the 1 GiB buffer limit", t->name,
                   (unsigned long long)len);
        t->buflen = ((size_t)len + 4095) / 4096 * 4096; /* 4096: O_DIRECT alignment */
        t->buf = alloc_touched(t->buflen, 4096);
        t->fds = alloc_touched(t->nfds * sizeof *t->fds, 64);
        for (size_t f = 0; f < t->nfds; f++)
            t->fds[f].fd = -1;
    }
    for (size_t i = 0; i < plan->nbarriers; i++)
        if (pthread_barrier_init(&plan->barriers[i].b, NULL, plan->barriers[i].parties))
            pc_die("barrier %s: cannot create", plan->barriers[i].name);
}

/* One mark = one write() of one line (the recorder logs each write as a mark). */
static void mark(const char *buf, int len)
{
    errno = 0;
    if (len < 0 || write(run.opts->mark_fd, buf, (size_t)len) != len) {
        int expected = 0;
        atomic_compare_exchange_strong(&run.mark_errno, &expected, errno ? errno : EIO);
        atomic_fetch_add(&run.mark_failures, 1);
    }
}

static void mark_text(const char *what)
{
    char buf[512];
    if (run.opts->mark_fd >= 0)
        mark(buf, snprintf(buf, sizeof buf, "%s%s\n", run.opts->mark_prefix, what));
}

static void mark_op(const struct pc_thread *t, uint32_t seq, uint32_t iter)
{
    char buf[512];
    if (run.opts->mark_fd >= 0)
        mark(buf, snprintf(buf, sizeof buf, "%sop %u.%u.%u\n", run.opts->mark_prefix, t->index, seq, iter));
}

static struct pc_record *next_record(struct pc_thread *t)
{
    if (t->nrecs == t->maxrecs)
        pc_die("internal: thread %s recorded more ops than counted", t->name);
    return &t->recs[t->nrecs++];
}

static void sleep_until(uint64_t ns)
{
    struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void run_ops(struct pc_thread *t, const struct pc_op *ops, size_t n, uint64_t iter);

/* Iteration k of a periodic repeat is due at t0 + k*period (t0: when the
 * repeat starts); a late iteration starts at once, the grid does not shift. */
static void run_repeat(struct pc_thread *t, const struct pc_op *op, uint64_t iter)
{
    uint64_t period = op->period_us * 1000, t0 = pc_now_ns();
    for (uint64_t k = 0; k < op->count; k++) {
        uint64_t it = iter * op->count + k, due = t0 + k * period;
        struct pc_record *r = next_record(t); /* taken first: records stay in start order */
        if (period)
            sleep_until(due);
        uint64_t start = pc_now_ns();
        run_ops(t, op->body, op->nbody, it);
        memset(r, 0, sizeof *r);
        r->start_ns = start;
        r->end_ns = pc_now_ns();
        r->seq = op->seq;
        r->iter = (uint32_t)it;
        r->thread = (uint16_t)t->index;
        if (period) {
            r->aux = (int64_t)(start - due);
            if (start - due > period || r->end_ns > due + period)
                r->flags = REC_DEADLINE_MISS;
        }
    }
}

static void run_ops(struct pc_thread *t, const struct pc_op *ops, size_t n, uint64_t iter)
{
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind == K_REPEAT) {
            run_repeat(t, &ops[i], iter);
            continue;
        }
        pc_exec_op(run.plan, t, &ops[i], (uint32_t)iter, next_record(t));
        mark_op(t, ops[i].seq, (uint32_t)iter);
    }
}

/* Pinning, nice and policy, from inside the thread; failures are reported
 * by the main thread before any op runs. */
static void setup_thread(struct pc_thread *t)
{
    int e;
    if (t->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(t->cpu, &set);
        if ((e = pthread_setaffinity_np(pthread_self(), sizeof set, &set))) {
            snprintf(t->setup_error, sizeof t->setup_error, "thread %s: cannot pin to CPU %d: %s",
                     t->name, t->cpu, strerror(e));
            return;
        }
    }
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), t->nice)) {
        snprintf(t->setup_error, sizeof t->setup_error, "thread %s: cannot set nice %d: %s",
                 t->name, t->nice, strerror(errno));
        return;
    }
    struct sched_param sp = { .sched_priority = t->priority };
    if ((e = pthread_setschedparam(pthread_self(), t->policy, &sp)))
        snprintf(t->setup_error, sizeof t->setup_error,
                 "thread %s: cannot set scheduling policy %s priority %d: %s", t->name, t->policy_name,
                 t->priority, strerror(e));
}

static void *thread_main(void *arg)
{
    struct pc_thread *t = arg;
    setup_thread(t);
    pthread_barrier_wait(&run.setup);
    pthread_barrier_wait(&run.go);
    if (run.ok)
        run_ops(t, t->ops, t->nops, 0);
    return NULL;
}

void pc_run(struct pc_plan *plan, const struct pc_run_opts *o, struct pc_run_result *res)
{
    pthread_attr_t attr;
    unsigned n = (unsigned)plan->nthreads;
    run.plan = plan;
    run.opts = o;
    if (pthread_barrier_init(&run.setup, NULL, n + 1) || pthread_barrier_init(&run.go, NULL, n + 1) ||
        pthread_attr_init(&attr) || pthread_attr_setstacksize(&attr, THREAD_STACK))
        pc_die("cannot set up threads");
    for (unsigned i = 0; i < n; i++) {
        int e = pthread_create(&plan->threads[i].tid, &attr, thread_main, &plan->threads[i]);
        if (e)
            pc_die("cannot start thread %s: %s", plan->threads[i].name, strerror(e));
    }
    pthread_barrier_wait(&run.setup);
    const char *error = NULL;
    for (unsigned i = 0; i < n && !error; i++)
        if (plan->threads[i].setup_error[0])
            error = plan->threads[i].setup_error;
    run.ok = !error;
    if (run.ok) {
        mark_text("start");
        res->start_ns = pc_now_ns();
    }
    pthread_barrier_wait(&run.go);
    for (unsigned i = 0; i < n; i++)
        pthread_join(plan->threads[i].tid, NULL);
    if (error)
        pc_die("%s", error);
    res->end_ns = pc_now_ns();
    mark_text("end");
    res->mark_failures = atomic_load(&run.mark_failures);
    res->mark_errno = atomic_load(&run.mark_errno);
}

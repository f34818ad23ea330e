/* Parser of the plan that workloads/plan.py compiles from a workload.
 *
 * Plan format "powercut-plan 1": one record per line, space-separated
 * key=value fields. String values are percent-encoded (%XX for every byte
 * but A-Z a-z 0-9 - . _ ~ /), so they hold no spaces. Flag lists are names
 * joined by '|', or '-' when empty.
 *
 *   powercut-plan 1
 *   workload wid=<u32> name=<str>
 *   barrier index=<i> parties=<n> name=<str>       one line per barrier, index 0, 1, ...
 *   thread index=<i> name=<str> policy=<other|batch|idle|fifo|rr> priority=<n> nice=<n> cpu=<n|-1> fds=<n>
 *   op seq=<n> kind=<kind> [id=<str>] <the kind's fields, below>
 *   ...                                            a repeat's body follows its op line up to "endrepeat"
 *   endthread
 *   end
 *
 * The fields of each kind's line, in order, and its flag names: each op's
 * x-plan in workloads/schema/workload.schema.json, as the generated
 * pc-kinds.h tables (workloads/plan.py documents what the fields mean).
 * Modes are octal; everything else decimal.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <sys/uio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "pcexec.h"

#define MAX_TOKENS 16
#define MAX_DEPTH 8

struct flag_name {
    const char *name;
    int value;
};
#ifndef RWF_ATOMIC /* headers older than Linux 6.11's */
#define RWF_ATOMIC PC_RWF_ATOMIC
#endif
#define PC_KIND_TABLES
#include "pc-kinds.h"
static const struct flag_name policies[] = {
    { "other", SCHED_OTHER }, { "batch", SCHED_BATCH }, { "idle", SCHED_IDLE },
    { "fifo", SCHED_FIFO }, { "rr", SCHED_RR }, { 0, 0 },
};

struct parser {
    FILE *f;
    const char *what;
    unsigned line;
    char *buf;
    size_t cap;
    char *tok[MAX_TOKENS];
    int ntok;
    const struct pc_plan *plan;
    size_t nfds;        /* fd slots of the thread being parsed */
};

static _Noreturn void __attribute__((format(printf, 2, 3)))
perr(const struct parser *p, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pc_die("%s line %u: %s", p->what, p->line, msg);
}

/* Reads the next non-empty line into p->tok; 0 at end of file. */
static int next_line(struct parser *p)
{
    for (;;) {
        if (getline(&p->buf, &p->cap, p->f) < 0)
            return 0;
        p->line++;
        p->ntok = 0;
        for (char *s = strtok(p->buf, " \t\r\n"); s; s = strtok(NULL, " \t\r\n")) {
            if (p->ntok == MAX_TOKENS)
                perr(p, "too many fields");
            p->tok[p->ntok++] = s;
        }
        if (p->ntok)
            return 1;
    }
}

static void expect_word(struct parser *p, const char *word)
{
    if (!next_line(p))
        pc_die("%s: ends early: '%s' expected", p->what, word);
    if (strcmp(p->tok[0], word))
        perr(p, "'%s' expected, found '%s'", word, p->tok[0]);
}

/* The raw value of KEY on the current line, NULL if absent. */
static const char *field(const struct parser *p, const char *key)
{
    size_t n = strlen(key);
    for (int i = 1; i < p->ntok; i++)
        if (!strncmp(p->tok[i], key, n) && p->tok[i][n] == '=')
            return p->tok[i] + n + 1;
    return NULL;
}

static const char *need(const struct parser *p, const char *key)
{
    const char *v = field(p, key);
    if (!v)
        perr(p, "field '%s' missing", key);
    return v;
}

static int64_t num_base(const struct parser *p, const char *key, int64_t min, int64_t max, int base)
{
    const char *s = need(p, key);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, base);
    if (errno || end == s || *end || v < min || v > max)
        perr(p, "%s=%s: not a number in [%lld, %lld]", key, s, (long long)min, (long long)max);
    return v;
}

static int64_t num(const struct parser *p, const char *key, int64_t min, int64_t max)
{
    return num_base(p, key, min, max, 10);
}

static int hexval(int c)
{
    return isdigit(c) ? c - '0' : tolower(c) - 'a' + 10;
}

/* The percent-decoded string value of KEY, heap-allocated. */
static char *str(const struct parser *p, const char *key)
{
    const char *s = need(p, key);
    char *out = malloc(strlen(s) + 1), *o = out;
    if (!out)
        pc_die("out of memory");
    for (; *s; s++) {
        if (*s != '%') {
            *o++ = *s;
            continue;
        }
        if (!isxdigit((unsigned char)s[1]) || !isxdigit((unsigned char)s[2]))
            perr(p, "%s: bad %%-escape", key);
        *o++ = (char)(hexval((unsigned char)s[1]) << 4 | hexval((unsigned char)s[2]));
        s += 2;
    }
    *o = 0;
    if (o == out || strlen(out) != (size_t)(o - out))
        perr(p, "%s: empty or contains NUL", key);
    return out;
}

/* KEY's value: names from TABLE joined by '|', or '-'. */
static int flags(const struct parser *p, const char *key, const struct flag_name *table)
{
    const char *s = need(p, key);
    int v = 0;
    if (!strcmp(s, "-"))
        return 0;
    while (*s) {
        size_t n = strcspn(s, "|");
        const struct flag_name *f = table;
        while (f->name && (strlen(f->name) != n || strncmp(f->name, s, n)))
            f++;
        if (!f->name)
            perr(p, "%s: unknown flag '%.*s'", key, (int)n, s);
        v |= f->value;
        s += n + (s[n] == '|');
    }
    return v;
}

/* Whether the space-separated LIST holds the word W (of length N). */
static int in_list(const char *list, const char *w, size_t n)
{
    while (*list) {
        size_t m = strcspn(list, " ");
        if (m == n && !strncmp(list, w, n))
            return 1;
        list += m + (list[m] == ' ');
    }
    return 0;
}

/* Every field on the line must be one the kind takes. */
static void check_fields(const struct parser *p, const char *allowed)
{
    for (int i = 1; i < p->ntok; i++) {
        size_t n = strcspn(p->tok[i], "=");
        if (!in_list("seq kind id", p->tok[i], n) && !in_list(allowed, p->tok[i], n))
            perr(p, "field '%.*s' does not belong to a %s op", (int)n, p->tok[i], field(p, "kind"));
    }
}

static void parse_ops(struct parser *p, struct pc_op **ops, size_t *n, const char *end, int depth);

/* iov=L1,L2,...: the iovec lengths, which must add up to the op's length. */
static void parse_iov(const struct parser *p, struct pc_op *op)
{
    const char *s = need(p, "iov");
    uint64_t sum = 0;
    op->niov = 0;
    while (*s) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || (*end && *end != ',') || op->niov == PC_MAX_IOV || v > INT32_MAX)
            perr(p, "iov: at most %d lengths below 2^31, joined by ','", PC_MAX_IOV);
        op->iov[op->niov++] = v;
        sum += v;
        s = *end ? end + 1 : end;
    }
    if (!op->niov || sum != op->length)
        perr(p, "iov: lengths must add up to length=%llu", (unsigned long long)op->length);
}

static void parse_op(struct parser *p, struct pc_op *op, int depth)
{
    const char *kind = need(p, "kind");
    int k = 0;
    while (k < K__COUNT && strcmp(kind_names[k], kind))
        k++;
    if (k == K__COUNT)
        perr(p, "unknown op kind '%s'", kind);
    memset(op, 0, sizeof *op);
    op->kind = (enum pc_kind)k;
    op->fd = -1;
    op->from_fd = -1;
    op->barrier = -1;
    op->seq = (uint32_t)num(p, "seq", 0, UINT32_MAX);
    const char *spec = kind_fields[k];
    check_fields(p, spec);
    /* Decoded by name: each field means the same in every kind that has it. */
#define HAS(key) in_list(spec, key, strlen(key))
    if (HAS("fd"))
        op->fd = (int)num(p, "fd", 0, (int64_t)p->nfds - 1);
    if (HAS("from_fd"))
        op->from_fd = (int)num(p, "from_fd", 0, (int64_t)p->nfds - 1);
    if (HAS("from_offset"))
        op->from_offset = (uint64_t)num(p, "from_offset", 0, INT64_MAX);
    if (HAS("file"))
        op->file_id = (uint32_t)num(p, "file", 0, UINT32_MAX);
    if (HAS("path") || HAS("from"))
        op->path = str(p, HAS("from") ? "from" : "path");
    if (HAS("to") || HAS("target"))
        op->path2 = str(p, HAS("to") ? "to" : "target");
    if (HAS("name"))
        op->name = str(p, "name");
    if (HAS("mode"))
        op->mode = (unsigned)num_base(p, "mode", 0, 07777, 8);
    if (HAS("offset") && k == K_PWRITEV2 && !strcmp(need(p, "offset"), "-1"))
        op->at_position = 1;
    else if (HAS("offset"))
        op->offset = (uint64_t)num(p, "offset", 0, INT64_MAX);
    if (HAS("stride"))
        op->stride = (uint64_t)num(p, "stride", 0, INT64_MAX);
    if (HAS("length"))
        op->length = (uint64_t)num(p, "length", 0, INT64_MAX);
    if (HAS("msync"))
        op->msync = (int)num(p, "msync", 0, 1);
    if (HAS("us"))
        op->us = (uint64_t)num(p, "us", 0, INT64_MAX / 1000);
    if (HAS("period_us"))
        op->period_us = (uint64_t)num(p, "period_us", 0, INT64_MAX / 1000);
    if (HAS("count"))
        op->count = (uint64_t)num(p, "count", 1, UINT32_MAX);
    if (HAS("barrier"))
        op->barrier = (int)num(p, "barrier", 0, (int64_t)p->plan->nbarriers - 1);
#undef HAS
    if (kind_flags[k])
        op->flags = flags(p, "flags", kind_flags[k]);
    else if (k == K_FIEMAP)
        op->flags = num(p, "sync", 0, 1) ? FIEMAP_FLAG_SYNC : 0;
    if (k == K_PWRITEV2)
        parse_iov(p, op);
    if (k == K_REPEAT) {
        if (depth == MAX_DEPTH)
            perr(p, "repeats nested deeper than %d", MAX_DEPTH);
        parse_ops(p, &op->body, &op->nbody, "endrepeat", depth + 1);
        if (!op->nbody)
            perr(p, "empty repeat body");
    }
}

/* Op lines up to the line END, into a heap array. */
static void parse_ops(struct parser *p, struct pc_op **ops, size_t *n, const char *end, int depth)
{
    size_t cap = 0;
    *ops = NULL;
    *n = 0;
    for (;;) {
        if (!next_line(p))
            pc_die("%s: ends early: '%s' expected", p->what, end);
        if (!strcmp(p->tok[0], end))
            return;
        if (strcmp(p->tok[0], "op"))
            perr(p, "'op' or '%s' expected, found '%s'", end, p->tok[0]);
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            *ops = realloc(*ops, cap * sizeof **ops);
            if (!*ops)
                pc_die("out of memory");
        }
        parse_op(p, &(*ops)[(*n)++], depth);
    }
}

static int lookup(const struct parser *p, const char *key, const struct flag_name *table)
{
    const char *s = need(p, key);
    for (; table->name; table++)
        if (!strcmp(table->name, s))
            return table->value;
    perr(p, "%s: unknown value '%s'", key, s);
}

static void parse_thread(struct parser *p, struct pc_thread *t, unsigned index)
{
    memset(t, 0, sizeof *t);
    if (num(p, "index", 0, UINT16_MAX) != index)
        perr(p, "thread index %u expected", index);
    t->index = index;
    t->name = str(p, "name");
    t->policy = lookup(p, "policy", policies);
    t->policy_name = str(p, "policy");
    t->priority = (int)num(p, "priority", 0, 99);
    t->nice = (int)num(p, "nice", -20, 19);
    t->cpu = (int)num(p, "cpu", -1, CPU_SETSIZE - 1);
    t->nfds = (size_t)num(p, "fds", 0, 65536);
    p->nfds = t->nfds;
    parse_ops(p, &t->ops, &t->nops, "endthread", 0);
}

void pc_plan_parse(FILE *f, const char *what, struct pc_plan *plan)
{
    struct parser p = { .f = f, .what = what, .plan = plan };
    memset(plan, 0, sizeof *plan);
    if (!next_line(&p) || p.ntok != 2 || strcmp(p.tok[0], "powercut-plan") || strcmp(p.tok[1], "1"))
        pc_die("%s: not a powercut plan (first line must be 'powercut-plan 1')", what);
    expect_word(&p, "workload");
    plan->wid = (uint32_t)num(&p, "wid", 0, UINT32_MAX);
    plan->name = str(&p, "name");
    size_t tcap = 0, bcap = 0;
    for (;;) {
        if (!next_line(&p))
            pc_die("%s: ends early: 'end' expected", what);
        if (!strcmp(p.tok[0], "end"))
            break;
        if (!strcmp(p.tok[0], "barrier")) {
            if (plan->nthreads)
                perr(&p, "barrier lines must come before the threads");
            if (plan->nbarriers == bcap) {
                bcap = bcap ? 2 * bcap : 4;
                plan->barriers = realloc(plan->barriers, bcap * sizeof *plan->barriers);
            }
            if (!plan->barriers)
                pc_die("out of memory");
            struct pc_barrier *b = &plan->barriers[plan->nbarriers];
            if (num(&p, "index", 0, INT32_MAX) != (int64_t)plan->nbarriers)
                perr(&p, "barrier index %zu expected", plan->nbarriers);
            b->parties = (unsigned)num(&p, "parties", 2, UINT16_MAX);
            b->name = str(&p, "name");
            plan->nbarriers++;
        } else if (!strcmp(p.tok[0], "thread")) {
            if (plan->nthreads == tcap) {
                tcap = tcap ? 2 * tcap : 4;
                plan->threads = realloc(plan->threads, tcap * sizeof *plan->threads);
            }
            if (!plan->threads)
                pc_die("out of memory");
            parse_thread(&p, &plan->threads[plan->nthreads], (unsigned)plan->nthreads);
            plan->nthreads++;
        } else {
            perr(&p, "'barrier', 'thread' or 'end' expected, found '%s'", p.tok[0]);
        }
    }
    if (!plan->nthreads)
        pc_die("%s: no threads", what);
    if (next_line(&p))
        perr(&p, "text after 'end'");
    free(p.buf);
}

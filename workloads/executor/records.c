/* The records file pc-exec writes after the run (read by workloads/results.py).
 *
 * All little-endian. Header:
 *    0  8  magic "PCEXREC1"           32 u32 workload id
 *    8  u32 version (1)               36 u32 mark writes that failed
 *   12  u32 header size (= offset     40 u64 clock overhead, min ns
 *          of the first record)       48 u64 clock overhead, median ns
 *   16  u32 record size (48)          56 u64 run start (CLOCK_MONOTONIC ns)
 *   20  u32 thread count              64 u64 run end
 *   24  u64 record count
 *   72  per thread: u32 record count, u32 name length, name bytes;
 *       zero padding up to the header size (a multiple of 8)
 * Records, thread by thread, each thread's in start order (struct pc_record):
 *    0 u32 seq   4 u32 iter   8 u16 thread   10 u16 flags (REC_*)
 *   12 i32 errno   16 i64 return value   24 u64 start ns   32 u64 end ns
 *   40 i64 aux: repeat iteration lateness ns, or the file offset an op used
 */
#include <stdlib.h>
#include <string.h>

#include "pcexec.h"

#define OVERHEAD_SAMPLES 10000
#define FIXED_HEADER 72

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Cost of the two back-to-back clock reads that bracket every op. */
void pc_measure_overhead(struct pc_overhead *ov)
{
    static uint64_t d[OVERHEAD_SAMPLES];
    for (int i = 0; i < OVERHEAD_SAMPLES; i++) {
        uint64_t a = pc_now_ns();
        d[i] = pc_now_ns() - a;
    }
    qsort(d, OVERHEAD_SAMPLES, sizeof d[0], cmp_u64);
    ov->min_ns = d[0];
    ov->median_ns = d[OVERHEAD_SAMPLES / 2];
}

static int put(FILE *f, uint64_t v, int n)
{
    uint8_t b[8];
    pc_put_le(b, v, n);
    return fwrite(b, 1, (size_t)n, f) == (size_t)n ? 0 : -1;
}

static int put_record(FILE *f, const struct pc_record *r)
{
    return put(f, r->seq, 4) | put(f, r->iter, 4) | put(f, r->thread, 2) | put(f, r->flags, 2) |
           put(f, (uint32_t)r->err, 4) | put(f, (uint64_t)r->ret, 8) | put(f, r->start_ns, 8) |
           put(f, r->end_ns, 8) | put(f, (uint64_t)r->aux, 8);
}

/* 0 on success, -1 with errno set by stdio otherwise. */
int pc_write_records(FILE *f, const struct pc_plan *plan, const struct pc_overhead *ov,
                     const struct pc_run_result *res)
{
    uint64_t nrecs = 0, hsize = FIXED_HEADER;
    for (size_t i = 0; i < plan->nthreads; i++) {
        nrecs += plan->threads[i].nrecs;
        hsize += 8 + strlen(plan->threads[i].name);
    }
    uint64_t pad = (8 - hsize % 8) % 8;
    hsize += pad;
    int bad = fwrite("PCEXREC1", 1, 8, f) != 8;
    bad |= put(f, 1, 4) | put(f, hsize, 4) | put(f, sizeof(struct pc_record), 4) |
           put(f, plan->nthreads, 4) | put(f, nrecs, 8) | put(f, plan->wid, 4) |
           put(f, res->mark_failures, 4) | put(f, ov->min_ns, 8) | put(f, ov->median_ns, 8) |
           put(f, res->start_ns, 8) | put(f, res->end_ns, 8);
    for (size_t i = 0; i < plan->nthreads; i++) {
        size_t len = strlen(plan->threads[i].name);
        bad |= put(f, plan->threads[i].nrecs, 4) | put(f, len, 4);
        bad |= fwrite(plan->threads[i].name, 1, len, f) != len;
    }
    bad |= put(f, 0, (int)pad);
    for (size_t i = 0; i < plan->nthreads; i++)
        for (size_t k = 0; k < plan->threads[i].nrecs; k++)
            bad |= put_record(f, &plan->threads[i].recs[k]);
    bad |= fflush(f) != 0;
    return bad ? -1 : 0;
}

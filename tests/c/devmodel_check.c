/* devmodel_check: what the device model (harness/backends/fuse/devmodel.c)
 * makes requests wait for, observed through its own counters, never through
 * elapsed time. Run as `devmodel_check CASE`; exit 0 if the case holds.
 *
 *   behind-flush   qd 1: a write queued while a flush is served completes
 *                  after the flush
 *   excl-flush     qd 4, flush_excl: a flush waits for the write in service,
 *                  and a write arriving meanwhile waits for the flush
 *   shared-queue   qd 4 without flush_excl: a write enters service while a
 *                  flush is being served (the control for excl-flush) */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devmodel.h"

/* Completion order: each request takes the next number when it is done. */
static atomic_int order;

struct req {
	enum dm_kind kind;
	int done_as;
	pthread_t t;
};

static void *serve(void *arg)
{
	struct req *r = arg;

	devmodel_serve(r->kind, r->kind == DM_FLUSH ? 0 : 4096);
	r->done_as = atomic_fetch_add(&order, 1) + 1;
	return NULL;
}

static void start(struct req *r, enum dm_kind kind)
{
	r->kind = kind;
	if (pthread_create(&r->t, NULL, serve, r)) {
		perror("pthread_create");
		exit(2);
	}
}

/* Wait (yielding) until the model has IN requests in service and WAIT queued. */
static void until(unsigned in, unsigned wait)
{
	unsigned s, w;

	for (devmodel_counts(&s, &w); s != in || w != wait; devmodel_counts(&s, &w))
		sched_yield();
}

static void model(const char *spec)
{
	const char *why = NULL;

	if (devmodel_parse(spec, &why)) {
		fprintf(stderr, "devmodel_check: %s: %s\n", spec, why);
		exit(2);
	}
}

static int check(int ok, const char *what)
{
	printf("%s: %s\n", ok ? "ok" : "FAILED", what);
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	struct req a = { 0 }, b = { 0 }, c = { 0 };

	if (argc != 2)
		return 2;
	if (!strcmp(argv[1], "behind-flush")) {
		model("flush_us=200000,write_us=0,qd=1");
		start(&a, DM_FLUSH);
		until(1, 0);
		start(&b, DM_WRITE);
		until(1, 1); /* the write is queued behind the flush */
		pthread_join(a.t, NULL);
		pthread_join(b.t, NULL);
		return check(a.done_as == 1 && b.done_as == 2, "the queued write completed after the flush");
	}
	if (!strcmp(argv[1], "excl-flush")) {
		model("flush_us=100000,write_us=100000,qd=4,flush_excl=1");
		start(&a, DM_WRITE);
		until(1, 0);
		start(&b, DM_FLUSH);
		until(1, 1); /* the flush waits for the write in service */
		start(&c, DM_WRITE);
		until(1, 2); /* a slot is free, but the new write waits for the flush */
		pthread_join(a.t, NULL);
		pthread_join(b.t, NULL);
		pthread_join(c.t, NULL);
		return check(a.done_as == 1 && b.done_as == 2 && c.done_as == 3,
			     "write in service, then the flush, then the write that arrived during it");
	}
	if (!strcmp(argv[1], "shared-queue")) {
		model("flush_us=200000,write_us=100000,qd=4");
		start(&a, DM_FLUSH);
		until(1, 0);
		start(&b, DM_WRITE);
		until(2, 0); /* hangs (the test's timeout) if the write had to wait */
		pthread_join(a.t, NULL);
		pthread_join(b.t, NULL);
		return check(1, "a write entered service while the flush was served");
	}
	return 2;
}

/* devmodel: see devmodel.h. */
#include "devmodel.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
	bool on;
	uint64_t cost_ns[4];   /* per request, by kind */
	double ns_per_byte;    /* 0: no bandwidth limit */
	unsigned qd;           /* 0: no queue limit */
	bool flush_excl;       /* a flush waits for the queue to drain and holds the device alone */
	unsigned busy;         /* requests in service */
	unsigned waiting;      /* requests waiting to enter service */
	bool excl;             /* an exclusive flush waits or is in service: nothing else enters */
	uint64_t channel_free; /* CLOCK_MONOTONIC ns when the channel is next free */
	pthread_mutex_t lock;
	pthread_cond_t slot;
} M = { .lock = PTHREAD_MUTEX_INITIALIZER, .slot = PTHREAD_COND_INITIALIZER };

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = { .tv_sec = (time_t)(t / 1000000000u), .tv_nsec = (long)(t % 1000000000u) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

int devmodel_parse(const char *spec, const char **why)
{
	static const char *keys[] = { "read_us", "write_us", "flush_us", "discard_us", "mbps", "qd",
				      "flush_excl" };
	char *copy, *save = NULL, *item;
	int rc = 0;

	if (!spec || !*spec)
		return 0;
	copy = strdup(spec);
	if (!copy) {
		*why = "out of memory";
		return -1;
	}
	for (item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '='), *end;
		double v;
		size_t k;

		if (!eq) {
			*why = "each item must be key=value";
			rc = -1;
			break;
		}
		*eq = '\0';
		errno = 0;
		v = strtod(eq + 1, &end);
		if (errno || end == eq + 1 || *end || v < 0 || v > 1e9) {
			*why = "a value is not a number in [0, 1e9]";
			rc = -1;
			break;
		}
		for (k = 0; k < sizeof keys / sizeof keys[0] && strcmp(item, keys[k]); k++)
			;
		if (k < 4)
			M.cost_ns[k] = (uint64_t)(v * 1000.0);
		else if (k == 4)
			M.ns_per_byte = v > 0 ? 1000.0 / v : 0; /* MB/s = bytes/us */
		else if (k == 5)
			M.qd = (unsigned)v;
		else if (k == 6)
			M.flush_excl = v != 0;
		else {
			*why = "unknown key (known: read_us, write_us, flush_us, discard_us, mbps, qd, flush_excl)";
			rc = -1;
		}
	}
	free(copy);
	M.on = rc == 0;
	return rc;
}

bool devmodel_active(void)
{
	return M.on;
}

unsigned devmodel_parallel(unsigned cap)
{
	return M.qd && M.qd < cap ? M.qd : cap;
}

/* May a request enter service now? An exclusive flush (which holds M.excl
 * from when it is queued until it is done, keeping every other request out)
 * waits for the requests in service to finish. */
static bool may_enter(bool excl_flush)
{
	if (excl_flush)
		return M.busy == 0;
	return !M.excl && !(M.qd && M.busy >= M.qd);
}

void devmodel_serve(enum dm_kind kind, size_t bytes)
{
	uint64_t start, done;
	bool excl_flush = kind == DM_FLUSH && M.flush_excl;

	if (!M.on)
		return;
	pthread_mutex_lock(&M.lock);
	M.waiting++;
	if (excl_flush) {
		while (M.excl) /* one exclusive flush at a time */
			pthread_cond_wait(&M.slot, &M.lock);
		M.excl = true;
	}
	while (!may_enter(excl_flush))
		pthread_cond_wait(&M.slot, &M.lock);
	M.waiting--;
	M.busy++;
	start = now_ns();
	if (M.ns_per_byte > 0 && bytes && kind != DM_DISCARD) {
		if (M.channel_free > start)
			start = M.channel_free;
		start += (uint64_t)(M.ns_per_byte * (double)bytes);
		M.channel_free = start;
	}
	pthread_mutex_unlock(&M.lock);
	done = start + M.cost_ns[kind];
	sleep_until(done);
	pthread_mutex_lock(&M.lock);
	M.busy--;
	if (excl_flush)
		M.excl = false;
	/* Waiters wait for different things (a slot, a drained queue, the end
	 * of a flush): wake them all to look again. */
	pthread_cond_broadcast(&M.slot);
	pthread_mutex_unlock(&M.lock);
}

void devmodel_counts(unsigned *in_service, unsigned *waiting)
{
	pthread_mutex_lock(&M.lock);
	*in_service = M.busy;
	*waiting = M.waiting;
	pthread_mutex_unlock(&M.lock);
}

/* devmodel: pc-recorder plays a storage device's timing (--device SPEC).
 *
 * Each request holds one of QD queue slots (requests beyond wait), moves its
 * bytes over one shared channel of BANDWIDTH (transfers queue behind each
 * other), then takes the request's own service time (reads, writes) or the
 * flush cost (cache flushes); only then is it applied, logged and
 * acknowledged as before. Only when a request completes changes: the log
 * and the crash states are exactly those of an untimed run of the same
 * requests. With flush_excl a cache flush is not queued with the others: it
 * waits for the requests in service to finish, and no request enters while
 * it waits or is served (a non-NCQ FLUSH CACHE EXT on SATA, one command at a
 * time on eMMC). */
#ifndef PC_DEVMODEL_H
#define PC_DEVMODEL_H

#include <stdbool.h>
#include <stddef.h>

enum dm_kind { DM_READ, DM_WRITE, DM_FLUSH, DM_DISCARD };

/* Parse "key=value,..." (read_us, write_us, flush_us, discard_us, mbps,
 * qd, flush_excl); returns 0, or -1 with *why set. An empty SPEC: no delays. */
int devmodel_parse(const char *spec, const char **why);

/* Whether a model was given (requests then sleep). */
bool devmodel_active(void);

/* How many requests the model lets be served at once: its queue depth,
 * capped at CAP (also for no limit). */
unsigned devmodel_parallel(unsigned cap);

/* Wait as the device would for a request of KIND moving BYTES; a no-op
 * without a model. Call before applying the request. */
void devmodel_serve(enum dm_kind kind, size_t bytes);

/* How many requests are in service and how many wait to enter (tests). */
void devmodel_counts(unsigned *in_service, unsigned *waiting);

#endif

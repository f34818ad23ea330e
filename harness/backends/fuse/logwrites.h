/* Writer for the dm-log-writes on-disk log format (drivers/md/dm-log-writes.c).
 *
 * Layout: block 0 holds the super block; entries start at byte `sectorsize`.
 * Each entry is one header block followed, for writes, by nr_sectors blocks of
 * data. All integers little endian. Sector numbers count sectorsize units.
 *
 * Not thread-safe: the caller serialises all calls (the recorder holds one
 * lock across "apply to the image" and "append to the log", which is what
 * makes the log order match the order the kernel saw completions in). */
#ifndef PC_LOGWRITES_H
#define PC_LOGWRITES_H

#include <stddef.h>
#include <stdint.h>

#define LW_MAGIC 0x6a736677736872ULL
#define LW_VERSION 1ULL

/* FUA (2) and METADATA (16) exist in the format but are never emitted: the
 * loop device turns FUA into write + flush before it reaches us. */
#define LW_FLUSH 1u
#define LW_DISCARD 4u
#define LW_MARK 8u

#define LW_ENTRY_HDR 32u /* sector, nr_sectors, flags, data_len */
#define LW_END_MARK "dm-log-writes-end"

struct lw_log {
	int fd;
	uint32_t sectorsize;
	uint64_t off;        /* byte offset where the next entry goes */
	uint64_t nr_entries;
	unsigned char *hdr;  /* one zeroed block reused for every entry header */
	unsigned char *super; /* block 0 mapped shared, or NULL */
};

/* Longest mark text: the header block must also hold the 32-byte header and,
 * as in the kernel target, leave room for a terminating NUL. */
static inline size_t lw_max_mark(const struct lw_log *l)
{
	return l->sectorsize - LW_ENTRY_HDR - 1;
}

/* All functions return 0 or a negative errno. */
int lw_create(struct lw_log *l, const char *path, uint32_t sectorsize);
int lw_write(struct lw_log *l, uint64_t sector, const void *data, size_t len);
int lw_write_zeroes(struct lw_log *l, uint64_t sector, uint64_t nr_sectors);
int lw_discard(struct lw_log *l, uint64_t sector, uint64_t nr_sectors);
int lw_flush(struct lw_log *l);
int lw_mark(struct lw_log *l, const char *text, size_t len);
int lw_sync_super(struct lw_log *l);
/* Appends the end mark, rewrites the super block, closes the file. */
int lw_finish(struct lw_log *l);
/* Closes without the end mark: the log stays visibly incomplete. */
void lw_abandon(struct lw_log *l);

#endif

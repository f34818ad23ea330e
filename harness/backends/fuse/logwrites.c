#include "logwrites.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

static void put_le64(unsigned char *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, sizeof v);
}

static void put_le32(unsigned char *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, sizeof v);
}

/* pwritev until everything is written; short writes are legal for files. */
static int pwritev_all(int fd, struct iovec *iov, int cnt, uint64_t off)
{
	while (cnt > 0) {
		ssize_t n = pwritev(fd, iov, cnt, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		off += (uint64_t)n;
		while (cnt > 0 && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (char *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

static void fill_hdr(struct lw_log *l, uint64_t sector, uint64_t nr_sectors,
		     uint64_t flags, uint64_t data_len)
{
	put_le64(l->hdr + 0, sector);
	put_le64(l->hdr + 8, nr_sectors);
	put_le64(l->hdr + 16, flags);
	put_le64(l->hdr + 24, data_len);
}

/* Header block plus optional data in one syscall: per-entry cost matters at
 * thousands of flushes per second. */
static int append(struct lw_log *l, const void *data, size_t len)
{
	struct iovec iov[2] = {
		{ .iov_base = l->hdr, .iov_len = l->sectorsize },
		{ .iov_base = (void *)data, .iov_len = len },
	};
	int rc = pwritev_all(l->fd, iov, len ? 2 : 1, l->off);
	if (rc)
		return rc;
	l->off += l->sectorsize + len;
	l->nr_entries++;
	return 0;
}

int lw_sync_super(struct lw_log *l)
{
	unsigned char sb[32] = { 0 };
	struct iovec iov = { .iov_base = sb, .iov_len = sizeof sb };

	put_le64(sb + 0, LW_MAGIC);
	put_le64(sb + 8, LW_VERSION);
	put_le64(sb + 16, l->nr_entries);
	put_le32(sb + 24, l->sectorsize);
	/* Through the shared mapping when there is one: the same page cache
	 * page a read() of the log sees, without a syscall per flush. */
	if (l->super) {
		memcpy(l->super, sb, sizeof sb);
		return 0;
	}
	return pwritev_all(l->fd, &iov, 1, 0);
}

static void unmap_super(struct lw_log *l)
{
	if (l->super)
		munmap(l->super, l->sectorsize);
	l->super = NULL;
}

int lw_create(struct lw_log *l, const char *path, uint32_t sectorsize)
{
	int rc = 0;

	memset(l, 0, sizeof *l);
	l->sectorsize = sectorsize;
	l->off = sectorsize;
	l->hdr = calloc(1, sectorsize);
	if (!l->hdr)
		return -ENOMEM;
	l->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (l->fd < 0) {
		rc = -errno;
		free(l->hdr);
		return rc;
	}
	/* Size the file to one full block so block 0 reads back zero-padded
	 * even before the first entry lands. */
	if (ftruncate(l->fd, sectorsize) < 0 || (rc = lw_sync_super(l)) != 0) {
		rc = rc ? rc : -errno;
		lw_abandon(l);
		return rc;
	}
	l->super = mmap(NULL, sectorsize, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0);
	if (l->super == MAP_FAILED)
		l->super = NULL; /* then pwrite it is */
	return 0;
}

int lw_write(struct lw_log *l, uint64_t sector, const void *data, size_t len)
{
	fill_hdr(l, sector, len / l->sectorsize, 0, 0);
	return append(l, data, len);
}

/* The data of a zero write is left as a hole in the (sparse) log file: it
 * reads back as zeros, and a multi-GiB write-zeroes costs no I/O. The
 * ftruncate makes the hole real even if no entry follows. */
int lw_write_zeroes(struct lw_log *l, uint64_t sector, uint64_t nr_sectors)
{
	uint64_t end = l->off + l->sectorsize + nr_sectors * l->sectorsize;
	int rc;

	fill_hdr(l, sector, nr_sectors, 0, 0);
	rc = append(l, NULL, 0);
	if (rc)
		return rc;
	if (ftruncate(l->fd, (off_t)end) < 0)
		return -errno;
	l->off = end;
	return 0;
}

int lw_discard(struct lw_log *l, uint64_t sector, uint64_t nr_sectors)
{
	fill_hdr(l, sector, nr_sectors, LW_DISCARD, 0);
	return append(l, NULL, 0);
}

int lw_flush(struct lw_log *l)
{
	int rc;

	fill_hdr(l, 0, 0, LW_FLUSH, 0);
	rc = append(l, NULL, 0);
	return rc ? rc : lw_sync_super(l);
}

int lw_mark(struct lw_log *l, const char *text, size_t len)
{
	int rc;

	if (len == 0 || len > lw_max_mark(l))
		return -EINVAL;
	fill_hdr(l, 0, 0, LW_MARK, len);
	memcpy(l->hdr + LW_ENTRY_HDR, text, len);
	rc = append(l, NULL, 0);
	memset(l->hdr + LW_ENTRY_HDR, 0, len);
	return rc ? rc : lw_sync_super(l);
}

int lw_finish(struct lw_log *l)
{
	int rc = lw_mark(l, LW_END_MARK, strlen(LW_END_MARK));

	unmap_super(l);

	if (close(l->fd) < 0 && !rc)
		rc = -errno;
	l->fd = -1;
	free(l->hdr);
	l->hdr = NULL;
	return rc;
}

void lw_abandon(struct lw_log *l)
{
	unmap_super(l);
	close(l->fd);
	l->fd = -1;
	free(l->hdr);
	l->hdr = NULL;
}

/* pc-recorder: a userspace stand-in for the kernel's dm-log-writes target.
 *
 * Serves a FUSE file system with two files: disk.img (backed by IMG; a loop
 * device is attached to it and the file system under test lives there) and
 * control (each write() appends a MARK). Every write, flush and discard that
 * reaches disk.img is applied to IMG and appended to LOG in dm-log-writes
 * format, so the log can be replayed by xfstests' replay-log or our own.
 *
 * Ordering: an entry is applied and appended under one mutex and only then
 * acknowledged, so a write the kernel saw complete before it issued a flush
 * is always logged before that flush. */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "devmodel.h"
#include "logwrites.h"

#define DISK_NAME "disk.img"
#define CONTROL_NAME "control"
#define MAX_WRITE (1u << 20)
/* Worker threads do little on their stacks; with mlockall(MCL_FUTURE) the
 * default 8 MiB stack per worker would all be pinned in RAM. */
#define WORKER_STACK "262144"

enum node { N_NONE, N_ROOT, N_DISK, N_CONTROL };

static struct recorder {
	int img_fd;
	uint64_t img_size;
	uint32_t ss;
	bool drop_flush;
	int ready_fd;
	time_t start;
	pthread_mutex_t lock; /* orders IMG updates and log appends */
	bool failed;          /* an IMG/LOG error made the log unusable */
	struct lw_log log;
} R = { .img_fd = -1, .ready_fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER };

/* One fprintf per line: stderr is unbuffered and several threads may report
 * at once. */
static void vmsg(const char *fmt, va_list ap)
{
	char text[512];

	vsnprintf(text, sizeof text, fmt, ap);
	fprintf(stderr, "pc-recorder: %s\n", text);
}

static void msg(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vmsg(fmt, ap);
	va_end(ap);
}

static _Noreturn void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vmsg(fmt, ap);
	va_end(ap);
	exit(2);
}

/* Called with R.lock held. Once IMG and LOG may disagree the recording is
 * worthless: refuse all further changes (the device "died") and leave the
 * log without its end mark so nobody mistakes it for a complete one. */
static int fail(const char *what, int err)
{
	msg("%s: %s", what, strerror(-err));
	R.failed = true;
	return -EIO;
}

static enum node node_of(const char *path)
{
	if (strcmp(path, "/") == 0)
		return N_ROOT;
	if (strcmp(path, "/" DISK_NAME) == 0)
		return N_DISK;
	if (strcmp(path, "/" CONTROL_NAME) == 0)
		return N_CONTROL;
	return N_NONE;
}

/* Block-device rules: whole sectors only, nothing past the end. */
static int check_range(off_t off, uint64_t len)
{
	if (off < 0 || (uint64_t)off % R.ss || len % R.ss)
		return -EINVAL;
	if ((uint64_t)off > R.img_size || len > R.img_size - (uint64_t)off)
		return -ENOSPC;
	return 0;
}

static int pwrite_all(int fd, const char *buf, size_t len, off_t off)
{
	while (len) {
		ssize_t n = pwrite(fd, buf, len, off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		buf += n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

static void *rec_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	(void)cfg;
	/* With writeback caching the kernel would acknowledge writes itself
	 * and send them later: the log would no longer see the order in which
	 * the loop device completed them. */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	conn->max_write = MAX_WRITE;
	if (R.ready_fd >= 0) {
		if (write(R.ready_fd, "ready\n", 6) != 6)
			msg("cannot write to --ready-fd: %s", strerror(errno));
		close(R.ready_fd);
		R.ready_fd = -1;
	}
	return fuse_get_context()->private_data;
}

static int rec_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	(void)fi;
	memset(st, 0, sizeof *st);
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_atime = st->st_mtime = st->st_ctime = R.start;
	switch (node_of(path)) {
	case N_ROOT:
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	case N_DISK:
		st->st_mode = S_IFREG | 0600;
		st->st_nlink = 1;
		st->st_size = (off_t)R.img_size;
		st->st_blksize = R.ss;
		st->st_blocks = (blkcnt_t)(R.img_size / 512);
		return 0;
	case N_CONTROL:
		st->st_mode = S_IFREG | 0200;
		st->st_nlink = 1;
		return 0;
	case N_NONE:
		break;
	}
	return -ENOENT;
}

static int rec_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		       struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off;
	(void)fi;
	(void)flags;
	if (node_of(path) != N_ROOT)
		return -ENOTDIR;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, DISK_NAME, NULL, 0, 0);
	fill(buf, CONTROL_NAME, NULL, 0, 0);
	return 0;
}

static int rec_open(const char *path, struct fuse_file_info *fi)
{
	switch (node_of(path)) {
	case N_DISK:
		/* No FUSE page cache: every block I/O must reach us as it
		 * happens. */
		fi->direct_io = 1;
		return 0;
	case N_CONTROL:
		if ((fi->flags & O_ACCMODE) != O_WRONLY)
			return -EACCES;
		fi->direct_io = 1; /* one write() = one request = one mark */
		return 0;
	case N_ROOT:
		return -EISDIR;
	case N_NONE:
		break;
	}
	return -ENOENT;
}

static int rec_read(const char *path, char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	size_t done = 0;

	(void)fi;
	if (node_of(path) != N_DISK)
		return -EBADF;
	devmodel_serve(DM_READ, size);
	while (done < size) {
		ssize_t n = pread(R.img_fd, buf + done, size - done, off + (off_t)done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			msg("read IMG at %lld: %s", (long long)off, strerror(errno));
			return -EIO;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (int)done;
}

/* One write() is one mark, kept the way dm-log-writes keeps `dmsetup message
 * DEV 0 mark TEXT`: the text is a C string (it ends at the first NUL) cut to
 * the longest mark the log holds (kstrndup(text, sectorsize - 32 - 1) in
 * log_mark). An empty text is refused, as dm refuses a message without it. */
static int write_mark(const char *buf, size_t size)
{
	size_t len = size;
	const char *nul = memchr(buf, '\0', size);
	int rc;

	if (nul)
		len = (size_t)(nul - buf);
	if (len && buf[len - 1] == '\n') /* `echo TEXT > control` */
		len--;
	if (len > lw_max_mark(&R.log))
		len = lw_max_mark(&R.log);
	if (len == 0)
		return -EINVAL;
	pthread_mutex_lock(&R.lock);
	if (R.failed)
		rc = -EIO;
	else if ((rc = lw_mark(&R.log, buf, len)) != 0)
		rc = fail("append MARK to LOG", rc);
	pthread_mutex_unlock(&R.lock);
	return rc ? rc : (int)size;
}

static int rec_write(const char *path, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	int rc;

	(void)fi;
	switch (node_of(path)) {
	case N_CONTROL:
		return write_mark(buf, size);
	case N_DISK:
		break;
	default:
		return -EBADF;
	}
	if ((rc = check_range(off, size)) != 0)
		return rc;
	if (size == 0)
		return 0;
	devmodel_serve(DM_WRITE, size);
	pthread_mutex_lock(&R.lock);
	if (R.failed)
		rc = -EIO;
	else if ((rc = pwrite_all(R.img_fd, buf, size, off)) != 0)
		rc = fail("write IMG", rc);
	else if ((rc = lw_write(&R.log, (uint64_t)off / R.ss, buf, size)) != 0)
		rc = fail("append write to LOG", rc);
	pthread_mutex_unlock(&R.lock);
	return rc ? rc : (int)size;
}

/* FUSE FSYNC is the block layer's cache flush. IMG and LOG are deliberately
 * not synced: their own durability is not what is being tested. */
static int rec_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	int rc = 0;

	(void)datasync;
	(void)fi;
	if (node_of(path) != N_DISK)
		return 0;
	devmodel_serve(DM_FLUSH, 0);
	if (R.drop_flush)
		return 0;
	pthread_mutex_lock(&R.lock);
	if (R.failed)
		rc = -EIO;
	else if ((rc = lw_flush(&R.log)) != 0)
		rc = fail("append FLUSH to LOG", rc);
	pthread_mutex_unlock(&R.lock);
	return rc;
}

/* FUSE FLUSH comes from close(), not from a cache flush. */
static int rec_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	(void)fi;
	return 0;
}

static int rec_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	(void)fi;
	return 0;
}

/* Zero a range of IMG; tmpfs has no ZERO_RANGE but a hole reads as zeros. */
static int zero_img(off_t off, off_t len)
{
	if (fallocate(R.img_fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, off, len) == 0)
		return 0;
	if (errno != EOPNOTSUPP)
		return -errno;
	if (fallocate(R.img_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) == 0)
		return 0;
	return -errno;
}

/* The loop device turns DISCARD into PUNCH_HOLE and WRITE_ZEROES into
 * ZERO_RANGE (or PUNCH_HOLE without REQ_NOUNMAP). dm-log-writes has no
 * write-zeroes entry: the block layer would fall back to writing zeros, so
 * that is what gets logged. */
static int rec_fallocate(const char *path, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	bool punch = mode == (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
	uint64_t sector = (uint64_t)off / R.ss, nr = (uint64_t)len / R.ss;
	int rc;

	(void)fi;
	if (node_of(path) != N_DISK)
		return -EOPNOTSUPP;
	if (off < 0 || len <= 0)
		return -EINVAL;
	if ((uint64_t)off > R.img_size || (uint64_t)len > R.img_size - (uint64_t)off)
		return -ENOSPC;
	if (mode == 0 || mode == FALLOC_FL_KEEP_SIZE)
		return fallocate(R.img_fd, mode, off, len) < 0 ? -errno : 0;
	if (!punch && (mode & ~FALLOC_FL_KEEP_SIZE) != FALLOC_FL_ZERO_RANGE)
		return -EOPNOTSUPP;
	if ((rc = check_range(off, (uint64_t)len)) != 0)
		return rc;
	devmodel_serve(punch ? DM_DISCARD : DM_WRITE, punch ? 0 : (size_t)len);

	pthread_mutex_lock(&R.lock);
	if (R.failed) {
		rc = -EIO;
	} else {
		rc = punch ? (fallocate(R.img_fd, mode, off, len) < 0 ? -errno : 0)
			   : zero_img(off, len);
		if (rc == -EOPNOTSUPP)
			; /* IMG's file system can't: nothing changed, the block
			   * layer falls back (zeroing) or skips (discard) */
		else if (rc)
			rc = fail(punch ? "punch hole in IMG" : "zero range in IMG", rc);
		else if ((rc = punch ? lw_discard(&R.log, sector, nr)
				     : lw_write_zeroes(&R.log, sector, nr)) != 0)
			rc = fail("append to LOG", rc);
	}
	pthread_mutex_unlock(&R.lock);
	return rc;
}

static int rec_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	(void)size;
	(void)fi;
	switch (node_of(path)) {
	case N_CONTROL:
		return 0; /* shell redirection (O_TRUNC) must work on control */
	case N_DISK:
		return -EPERM; /* a block device has a fixed size */
	case N_ROOT:
		return -EISDIR;
	case N_NONE:
		break;
	}
	return -ENOENT;
}

static int rec_statfs(const char *path, struct statvfs *st)
{
	(void)path;
	memset(st, 0, sizeof *st);
	st->f_bsize = R.ss;
	st->f_frsize = R.ss;
	st->f_blocks = R.img_size / R.ss;
	st->f_files = 2;
	st->f_namemax = NAME_MAX;
	return 0;
}

static const struct fuse_operations rec_ops = {
	.init = rec_init,
	.getattr = rec_getattr,
	.readdir = rec_readdir,
	.open = rec_open,
	.read = rec_read,
	.write = rec_write,
	.fsync = rec_fsync,
	.flush = rec_flush,
	.release = rec_release,
	.fallocate = rec_fallocate,
	.truncate = rec_truncate,
	.statfs = rec_statfs,
};

struct opts {
	const char *img, *log, *mnt;
};

static _Noreturn void usage_error(const char *why)
{
	die("%s (usage: pc-recorder --image IMG --log LOG [--sector-size 512|4096] "
	    "[--ready-fd N] [--fault drop-flush] [--device read_us=N,write_us=N,flush_us=N,mbps=N,qd=N,flush_excl=0|1] MOUNTPOINT)", why);
}

static long parse_num(const char *s, const char *opt)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > INT_MAX)
		die("bad value for %s: '%s'", opt, s);
	return v;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lopts[] = {
		{ "image", required_argument, NULL, 'i' },
		{ "log", required_argument, NULL, 'l' },
		{ "sector-size", required_argument, NULL, 's' },
		{ "ready-fd", required_argument, NULL, 'r' },
		{ "fault", required_argument, NULL, 'f' },
		{ "device", required_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	R.ss = 512;
	opterr = 0; /* errors are reported as one "pc-recorder: ..." line */
	while ((c = getopt_long(argc, argv, ":", lopts, NULL)) != -1) {
		switch (c) {
		case 'i':
			o->img = optarg;
			break;
		case 'l':
			o->log = optarg;
			break;
		case 's':
			R.ss = (uint32_t)parse_num(optarg, "--sector-size");
			if (R.ss != 512 && R.ss != 4096)
				die("--sector-size must be 512 or 4096, not %s", optarg);
			break;
		case 'r':
			R.ready_fd = (int)parse_num(optarg, "--ready-fd");
			if (fcntl(R.ready_fd, F_GETFD) < 0)
				die("--ready-fd %d is not an open file descriptor", R.ready_fd);
			break;
		case 'f':
			if (strcmp(optarg, "drop-flush") != 0)
				die("unknown --fault '%s' (known: drop-flush)", optarg);
			R.drop_flush = true;
			break;
		case 'd': {
			const char *why = NULL;

			if (devmodel_parse(optarg, &why) != 0)
				die("--device '%s': %s", optarg, why);
			break;
		}
		case ':':
			die("option %s needs a value", argv[optind - 1]);
		default:
			die("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (!o->img)
		usage_error("--image is required");
	if (!o->log)
		usage_error("--log is required");
	if (optind != argc - 1)
		usage_error("exactly one MOUNTPOINT is required");
	o->mnt = argv[optind];
}

static void open_image(const char *img)
{
	struct stat st;

	R.img_fd = open(img, O_RDWR | O_CLOEXEC);
	if (R.img_fd < 0)
		die("cannot open image '%s': %s", img, strerror(errno));
	if (fstat(R.img_fd, &st) < 0)
		die("cannot stat image '%s': %s", img, strerror(errno));
	if (!S_ISREG(st.st_mode))
		die("image '%s' is not a regular file", img);
	if (st.st_size == 0 || st.st_size % R.ss)
		die("image '%s' size %lld is not a positive multiple of %u", img,
		    (long long)st.st_size, R.ss);
	R.img_size = (uint64_t)st.st_size;
}

int main(int argc, char **argv)
{
	struct opts o = { 0 };
	struct stat st;
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_loop_config *lcfg;
	struct fuse *f;
	int rc, status;

	parse_args(argc, argv, &o);
	open_image(o.img);
	if (stat(o.mnt, &st) < 0)
		die("mount point '%s': %s", o.mnt, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		die("mount point '%s' is not a directory", o.mnt);
	if ((rc = lw_create(&R.log, o.log, R.ss)) != 0)
		die("cannot create log '%s': %s", o.log, strerror(-rc));
	R.start = time(NULL);

	/* We sit under a block device: memory reclaim may wait on our I/O, so
	 * we must neither be throttled as a writer nor be paged out. */
	if (prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) < 0)
		msg("warning: PR_SET_IO_FLUSHER: %s", strerror(errno));
	if (mlockall(MCL_CURRENT | MCL_FUTURE) < 0)
		msg("warning: mlockall: %s", strerror(errno));
	setenv("FUSE_THREAD_STACK", WORKER_STACK, 0);

	if (fuse_opt_add_arg(&args, argv[0]) ||
	    fuse_opt_add_arg(&args, "-o") ||
	    fuse_opt_add_arg(&args, "fsname=pc-recorder,subtype=pc-recorder"))
		die("out of memory");
	f = fuse_new(&args, &rec_ops, sizeof rec_ops, NULL);
	if (!f)
		die("cannot create FUSE instance");
	if (fuse_mount(f, o.mnt) != 0)
		die("cannot mount FUSE at '%s'", o.mnt);
	if (fuse_set_signal_handlers(fuse_get_session(f)) != 0)
		die("cannot install signal handlers");

	lcfg = fuse_loop_cfg_create();
	if (!lcfg)
		die("out of memory");
	/* Returns on unmount (fusermount3 -u) or SIGTERM/SIGINT/SIGHUP, after
	 * all in-flight requests have been answered; a positive value is the
	 * number of the signal that ended it. */
	rc = fuse_loop_mt(f, lcfg);
	fuse_loop_cfg_destroy(lcfg);
	if (rc < 0)
		msg("FUSE loop failed: %s", strerror(-rc));
	fuse_remove_signal_handlers(fuse_get_session(f));
	fuse_unmount(f);
	fuse_destroy(f);
	fuse_opt_free_args(&args);

	status = 0;
	if (R.failed) {
		msg("log is incomplete after an I/O error; no end mark written");
		lw_abandon(&R.log);
		status = 1;
	} else if ((rc = lw_finish(&R.log)) != 0) {
		msg("cannot finish log '%s': %s", o.log, strerror(-rc));
		status = 1;
	}
	close(R.img_fd);
	return status;
}

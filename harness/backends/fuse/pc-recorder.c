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
#include <fuse_lowlevel.h>
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
/* Requests served at once under a device model with a deep queue (nvme: 1024):
 * beyond this many the model's queue would only add threads, not realism. */
#define MAX_PARALLEL 64u
/* The kernel's limit on background requests unless we raise it
 * (FUSE_DEFAULT_MAX_BACKGROUND in fs/fuse). */
#define KERNEL_MAX_BACKGROUND 12u

enum node { N_NONE, N_ROOT, N_DISK, N_CONTROL };
enum { INO_DISK = 2, INO_CONTROL = 3 }; /* FUSE_ROOT_ID is 1 */

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

static int read_img(char *buf, size_t size, off_t off)
{
	size_t done = 0;

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

static int write_disk(const char *buf, size_t size, off_t off)
{
	int rc;

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
static int flush_disk(void)
{
	int rc = 0;

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
static int fallocate_disk(int mode, off_t off, off_t len)
{
	bool punch = mode == (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
	uint64_t sector = (uint64_t)off / R.ss, nr = (uint64_t)len / R.ss;
	int rc;

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

/* ---- FUSE low-level glue: inode numbers instead of paths (no path
 * resolution per request), attributes that never change cached by the
 * kernel for good. */

/* The files never change size or kind: the kernel may keep their entries
 * and attributes (no LOOKUP/GETATTR on the I/O path). */
#define ATTR_TIMEOUT 86400.0

static enum node node_of_ino(fuse_ino_t ino)
{
	switch (ino) {
	case FUSE_ROOT_ID:
		return N_ROOT;
	case INO_DISK:
		return N_DISK;
	case INO_CONTROL:
		return N_CONTROL;
	}
	return N_NONE;
}

static void fill_stat(enum node n, struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_atime = st->st_mtime = st->st_ctime = R.start;
	switch (n) {
	case N_ROOT:
		st->st_ino = FUSE_ROOT_ID;
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		break;
	case N_DISK:
		st->st_ino = INO_DISK;
		st->st_mode = S_IFREG | 0600;
		st->st_nlink = 1;
		st->st_size = (off_t)R.img_size;
		st->st_blksize = R.ss;
		st->st_blocks = (blkcnt_t)(R.img_size / 512);
		break;
	case N_CONTROL:
		st->st_ino = INO_CONTROL;
		st->st_mode = S_IFREG | 0200;
		st->st_nlink = 1;
		break;
	case N_NONE:
		break;
	}
}

static void ll_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	/* With writeback caching the kernel would acknowledge writes itself
	 * and send them later: the log would no longer see the order in which
	 * the loop device completed them. */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	conn->max_write = MAX_WRITE;
	/* The loop device's direct I/O reaches us as background requests, at
	 * most max_background at once (12 by default): a device model must see
	 * up to its queue depth of them. */
	if (devmodel_active() && devmodel_parallel(MAX_PARALLEL) > KERNEL_MAX_BACKGROUND) {
		conn->max_background = devmodel_parallel(MAX_PARALLEL);
		conn->congestion_threshold = conn->max_background;
	}
	if (R.ready_fd >= 0) {
		if (write(R.ready_fd, "ready\n", 6) != 6)
			msg("cannot write to --ready-fd: %s", strerror(errno));
		close(R.ready_fd);
		R.ready_fd = -1;
	}
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	enum node n = N_NONE;

	if (parent == FUSE_ROOT_ID && strcmp(name, DISK_NAME) == 0)
		n = N_DISK;
	else if (parent == FUSE_ROOT_ID && strcmp(name, CONTROL_NAME) == 0)
		n = N_CONTROL;
	if (n == N_NONE) {
		fuse_reply_err(req, parent == FUSE_ROOT_ID ? ENOENT : ENOTDIR);
		return;
	}
	memset(&e, 0, sizeof e);
	fill_stat(n, &e.attr);
	e.ino = e.attr.st_ino;
	e.attr_timeout = e.entry_timeout = ATTR_TIMEOUT;
	fuse_reply_entry(req, &e);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	enum node n = node_of_ino(ino);

	(void)fi;
	if (n == N_NONE) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_stat(n, &st);
	fuse_reply_attr(req, &st, ATTR_TIMEOUT);
}

/* Only a size change means anything here (shell redirection truncates
 * control; a block device has a fixed size); other attributes stay. */
static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct stat st;
	enum node n = node_of_ino(ino);

	(void)attr;
	(void)fi;
	if (n == N_NONE) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (n == N_DISK) {
			fuse_reply_err(req, EPERM);
			return;
		}
		if (n == N_ROOT) {
			fuse_reply_err(req, EISDIR);
			return;
		}
	}
	fill_stat(n, &st);
	fuse_reply_attr(req, &st, ATTR_TIMEOUT);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	static const char *names[] = { ".", "..", DISK_NAME, CONTROL_NAME };
	static const fuse_ino_t inos[] = { FUSE_ROOT_ID, FUSE_ROOT_ID, INO_DISK, INO_CONTROL };
	char buf[512];
	size_t used = 0;

	(void)fi;
	if (node_of_ino(ino) != N_ROOT) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	if (size > sizeof buf)
		size = sizeof buf;
	/* Entry i's offset is i + 1: the offset to continue after it. */
	for (off_t i = off < 0 ? 0 : off; i < 4; i++) {
		struct stat st = { .st_ino = inos[i], .st_mode = i < 2 ? S_IFDIR : S_IFREG };
		size_t need = fuse_add_direntry(req, NULL, 0, names[i], NULL, 0);

		if (used + need > size)
			break;
		fuse_add_direntry(req, buf + used, size - used, names[i], &st, i + 1);
		used += need;
	}
	fuse_reply_buf(req, buf, used);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	switch (node_of_ino(ino)) {
	case N_DISK:
		/* No FUSE page cache: every block I/O must reach us as it
		 * happens. */
		fi->direct_io = 1;
		fi->noflush = 1; /* close() is not a cache flush */
		fuse_reply_open(req, fi);
		return;
	case N_CONTROL:
		if ((fi->flags & O_ACCMODE) != O_WRONLY) {
			fuse_reply_err(req, EACCES);
			return;
		}
		fi->direct_io = 1; /* one write() = one request = one mark */
		fi->noflush = 1;
		fuse_reply_open(req, fi);
		return;
	case N_ROOT:
		fuse_reply_err(req, EISDIR);
		return;
	case N_NONE:
		break;
	}
	fuse_reply_err(req, ENOENT);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	static _Thread_local char *buf;
	int rc;

	(void)fi;
	if (node_of_ino(ino) != N_DISK) {
		fuse_reply_err(req, EBADF);
		return;
	}
	if (!buf && !(buf = malloc(MAX_WRITE))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (size > MAX_WRITE)
		size = MAX_WRITE;
	rc = read_img(buf, size, off);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_buf(req, buf, (size_t)rc);
}

static void reply_count(fuse_req_t req, int rc)
{
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_write(req, (size_t)rc);
}

static void ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	(void)fi;
	switch (node_of_ino(ino)) {
	case N_CONTROL:
		reply_count(req, write_mark(buf, size));
		return;
	case N_DISK:
		reply_count(req, write_disk(buf, size, off));
		return;
	default:
		fuse_reply_err(req, EBADF);
	}
}

static void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	(void)fi;
	fuse_reply_err(req, node_of_ino(ino) == N_DISK ? -flush_disk() : 0);
}

/* FUSE FLUSH comes from close(), not from a cache flush. */
static void ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	(void)fi;
	if (node_of_ino(ino) != N_DISK)
		fuse_reply_err(req, EOPNOTSUPP);
	else
		fuse_reply_err(req, -fallocate_disk(mode, off, len));
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs st;

	(void)ino;
	memset(&st, 0, sizeof st);
	st.f_bsize = R.ss;
	st.f_frsize = R.ss;
	st.f_blocks = R.img_size / R.ss;
	st.f_files = 2;
	st.f_namemax = NAME_MAX;
	fuse_reply_statfs(req, &st);
}

static const struct fuse_lowlevel_ops rec_ops = {
	.init = ll_init,
	.lookup = ll_lookup,
	.getattr = ll_getattr,
	.setattr = ll_setattr,
	.readdir = ll_readdir,
	.open = ll_open,
	.read = ll_read,
	.write = ll_write,
	.fsync = ll_fsync,
	.flush = ll_flush,
	.fallocate = ll_fallocate,
	.statfs = ll_statfs,
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
	struct fuse_session *se;
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
	se = fuse_session_new(&args, &rec_ops, sizeof rec_ops, NULL);
	if (!se)
		die("cannot create FUSE session");
	if (fuse_set_signal_handlers(se) != 0)
		die("cannot install signal handlers");
	if (fuse_session_mount(se, o.mnt) != 0)
		die("cannot mount FUSE at '%s'", o.mnt);

	/* Returns on unmount (fusermount3 -u) or SIGTERM/SIGINT/SIGHUP, after
	 * all in-flight requests have been answered; a positive value is the
	 * number of the signal that ended it. Without a device model one
	 * thread serves everything: the loop device sends one request at a
	 * time on the paths that matter (a flush waits for its writes), and
	 * each request is mostly spent under R.lock anyway, so worker threads
	 * only add hand-offs. A device model sleeps per request and must let
	 * up to qd of them wait at once. */
	if (devmodel_active()) {
		struct fuse_loop_config *lcfg = fuse_loop_cfg_create();

		if (!lcfg)
			die("out of memory");
		/* qd requests may sleep at once; marks and everything else
		 * keep libfuse's default of 10 threads besides. */
		fuse_loop_cfg_set_max_threads(lcfg, devmodel_parallel(MAX_PARALLEL) + 10);
		rc = fuse_session_loop_mt(se, lcfg);
		fuse_loop_cfg_destroy(lcfg);
	} else {
		rc = fuse_session_loop(se);
	}
	if (rc < 0)
		msg("FUSE loop failed: %s", strerror(-rc));
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
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

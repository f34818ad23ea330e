/* pc-dmlog: the one implementation of a dm-log-writes recording's device side.
 *
 * Used by the `dm` backend on a host (harness/backends/dm/) and by the vm
 * backend's guest (harness/backends/vm/guest/record.sh) alike, so creating
 * the log-writes target, marking and removing it exist once. It talks to
 * device-mapper with the DM ioctls on /dev/mapper/control (no dmsetup, no
 * udev: the device node is devtmpfs's /dev/dm-MINOR).
 *
 *   pc-dmlog targets                               target types the kernel has, one per line
 *   pc-dmlog create NAME UUID SECTORS DATA LOG     a log-writes target over DATA logging to LOG;
 *                                                  prints its device node (/dev/dm-N)
 *   pc-dmlog mark NAME TEXT                        one mark in the log
 *   pc-dmlog remove NAME                           flush, then remove the target (the kernel
 *                                                  appends the mark dm-log-writes-end)
 *   pc-dmlog markfs NAME MOUNTPOINT                serve MOUNTPOINT/mark (below)
 *
 * markfs serves a FUSE file system with one write-only file, "mark". Each
 * write() on it becomes one mark in the kernel's dm-log-writes log (the
 * DM_TARGET_MSG ioctl) and returns only after the target has queued the
 * mark, so the mark is ordered after every write that completed before the
 * write() and before every write issued after it returns: the contract of
 * pc-recorder's control file. Returns once mounted and keeps serving in the
 * background until MOUNTPOINT is unmounted.
 *
 * Exit status: 0 done, 1 the kernel refused, 2 usage or no device-mapper. */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <linux/dm-ioctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define MARK_NAME "mark"
/* dm-log-writes keeps at most sectorsize - 32 - 1 bytes of a mark (the rest
 * is cut silently); the guest's disks have 512-byte sectors. Longer texts
 * are refused, as pc-recorder refuses them. */
#define MAX_MARK (512 - 32 - 1)

static const char *dm_name;
static int control_fd = -1;

static _Noreturn void die(const char *what)
{
	fprintf(stderr, "pc-dmlog: %s: %s\n", what, strerror(errno));
	exit(errno == ENOENT || errno == ENODEV ? 2 : 1);
}

/* A DM ioctl buffer: the header, then SPACE bytes of payload. */
static struct dm_ioctl *dm_buffer(const char *name, size_t space)
{
	size_t size = sizeof(struct dm_ioctl) + space;
	struct dm_ioctl *io = calloc(1, size);

	if (!io)
		return NULL;
	io->version[0] = DM_VERSION_MAJOR;
	io->data_size = (__u32)size;
	io->data_start = sizeof *io;
	if (name)
		snprintf(io->name, sizeof io->name, "%s", name);
	return io;
}

static int dm_call(unsigned long cmd, struct dm_ioctl *io)
{
	return ioctl(control_fd, cmd, io) < 0 ? -errno : 0;
}

/* dm core splits a message into words at whitespace and drops backslashes
 * before the character they escape: escape both so the text arrives whole. */
static size_t escape(char *out, const char *text, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		if (strchr(" \t\n\v\f\r\\", text[i]))
			out[n++] = '\\';
		out[n++] = text[i];
	}
	return n;
}

static int send_mark(const char *text, size_t len)
{
	static const char verb[] = "mark ";
	struct dm_ioctl *io = dm_buffer(dm_name, sizeof(struct dm_target_msg) + sizeof verb + 2 * len);
	struct dm_target_msg *msg;
	int rc;

	if (!io)
		return -ENOMEM;
	msg = (struct dm_target_msg *)(io + 1);
	memcpy(msg->message, verb, sizeof verb - 1);
	escape(msg->message + sizeof verb - 1, text, len);
	rc = dm_call(DM_TARGET_MSG, io);
	free(io);
	return rc;
}

static int mk_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	(void)fi;
	memset(st, 0, sizeof *st);
	if (strcmp(path, "/") == 0) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	}
	if (strcmp(path, "/" MARK_NAME) == 0) {
		st->st_mode = S_IFREG | 0222;
		st->st_nlink = 1;
		return 0;
	}
	return -ENOENT;
}

static int mk_open(const char *path, struct fuse_file_info *fi)
{
	if (strcmp(path, "/" MARK_NAME) != 0)
		return -ENOENT;
	if ((fi->flags & O_ACCMODE) != O_WRONLY)
		return -EACCES;
	fi->direct_io = 1; /* one write() = one request = one mark */
	return 0;
}

static int mk_write(const char *path, const char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	size_t len = size;
	int rc;

	(void)path;
	(void)off;
	(void)fi;
	if (len && buf[len - 1] == '\n')
		len--;
	if (len == 0 || len > MAX_MARK || memchr(buf, '\0', len))
		return -EINVAL;
	rc = send_mark(buf, len);
	return rc ? rc : (int)size;
}

static int mk_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	(void)size;
	(void)fi;
	/* Shell redirection opens with O_TRUNC: that must work on the mark file. */
	return strcmp(path, "/" MARK_NAME) == 0 ? 0 : -EACCES;
}

static const struct fuse_operations mk_ops = {
	.getattr = mk_getattr,
	.open = mk_open,
	.write = mk_write,
	.truncate = mk_truncate,
};

static int markfs(const char *prog, const char *mountpoint)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse *f;

	if (fuse_opt_add_arg(&args, prog) || fuse_opt_add_arg(&args, "-o") ||
	    fuse_opt_add_arg(&args, "fsname=pc-markfs,subtype=pc-markfs"))
		die("fuse arguments");
	f = fuse_new(&args, &mk_ops, sizeof mk_ops, NULL);
	if (!f || fuse_mount(f, mountpoint) != 0)
		die("cannot mount FUSE");
	/* The parent exits once the child runs: the mount is in place by then. */
	if (fuse_daemonize(0) != 0)
		die("daemonize");
	/* Single-threaded on purpose: marks are serialized like the writes they order. */
	fuse_loop(f);
	fuse_unmount(f);
	fuse_destroy(f);
	fuse_opt_free_args(&args);
	return 0;
}

static int targets(void)
{
	struct dm_ioctl *io = dm_buffer(NULL, 16384);
	struct dm_target_versions *v;
	size_t at;

	if (!io || dm_call(DM_LIST_VERSIONS, io) < 0)
		die("DM_LIST_VERSIONS");
	for (at = io->data_start;; at += v->next) {
		v = (struct dm_target_versions *)((char *)io + at);
		printf("%s\n", v->name);
		if (!v->next)
			break;
	}
	free(io);
	return 0;
}

/* The ioctl sequence `dmsetup create NAME -u UUID --table TABLE` makes:
 * create the device, load the table into its inactive slot, resume it. */
static int create(const char *uuid, unsigned long long sectors, const char *data, const char *log)
{
	size_t plen = strlen(data) + strlen(log) + 2;
	size_t spec = (sizeof(struct dm_target_spec) + plen + 7) & ~(size_t)7;
	struct dm_ioctl *io = dm_buffer(dm_name, spec);
	struct dm_target_spec *t;
	unsigned int minor;
	int rc;

	if (!io)
		die("memory");
	snprintf(io->uuid, sizeof io->uuid, "%s", uuid);
	if (dm_call(DM_DEV_CREATE, io) < 0)
		die("DM_DEV_CREATE");
	minor = minor(io->dev);
	free(io);
	io = dm_buffer(dm_name, spec);
	if (!io)
		die("memory");
	io->target_count = 1;
	t = (struct dm_target_spec *)(io + 1);
	t->sector_start = 0;
	t->length = sectors;
	snprintf(t->target_type, sizeof t->target_type, "log-writes");
	snprintf((char *)(t + 1), plen, "%s %s", data, log);
	rc = dm_call(DM_TABLE_LOAD, io);
	if (rc == 0) {
		free(io);
		io = dm_buffer(dm_name, 0);
		rc = io ? dm_call(DM_DEV_SUSPEND, io) : -ENOMEM; /* no DM_SUSPEND_FLAG: resume */
	}
	if (rc < 0) {
		int err = -rc;

		free(io);
		io = dm_buffer(dm_name, 0);
		if (io)
			dm_call(DM_DEV_REMOVE, io); /* leave nothing half made */
		errno = err;
		die(err == EINVAL ? "loading the log-writes table (is dm-log-writes there? see dmesg)" : "DM_TABLE_LOAD");
	}
	free(io);
	printf("/dev/dm-%u\n", minor);
	return 0;
}

/* Flush the device, then remove it. The flush matters: on removal the
 * kernel (log_writes_dtr) puts the writes completed since the last flush at
 * the head of the queue of entries still to be logged, i.e. before entries
 * that completed earlier (list_splice_init, not _tail), so the log's tail
 * could replay to something else than the device holds. A flush first
 * attaches those writes to the flush entry, in completion order, and
 * leaves none behind. */
static int remove_target(void)
{
	struct dm_ioctl *io = dm_buffer(dm_name, 0);
	char node[64];
	int fd;

	if (!io || dm_call(DM_DEV_STATUS, io) < 0)
		die("DM_DEV_STATUS");
	snprintf(node, sizeof node, "/dev/dm-%u", minor(io->dev));
	fd = open(node, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0)
		die(node);
	close(fd);
	free(io);
	io = dm_buffer(dm_name, 0);
	if (!io || dm_call(DM_DEV_REMOVE, io) < 0)
		die("DM_DEV_REMOVE");
	free(io);
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: pc-dmlog targets | create NAME UUID SECTORS DATA LOG | mark NAME TEXT |"
			" remove NAME | markfs NAME MOUNTPOINT\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";

	if (!(strcmp(cmd, "targets") == 0 && argc == 2) && !(strcmp(cmd, "create") == 0 && argc == 7) &&
	    !(strcmp(cmd, "mark") == 0 && argc == 4) && !(strcmp(cmd, "remove") == 0 && argc == 3) &&
	    !(strcmp(cmd, "markfs") == 0 && argc == 4))
		return usage();
	dm_name = argc > 2 ? argv[2] : "";
	control_fd = open("/dev/mapper/control", O_RDWR | O_CLOEXEC);
	if (control_fd < 0)
		die("/dev/mapper/control");
	if (strcmp(cmd, "targets") == 0)
		return targets();
	if (strcmp(cmd, "create") == 0)
		return create(argv[3], strtoull(argv[4], NULL, 10), argv[5], argv[6]);
	if (strcmp(cmd, "mark") == 0) {
		size_t len = strlen(argv[3]);
		int rc = len == 0 || len > MAX_MARK ? -EINVAL : send_mark(argv[3], len);

		errno = -rc;
		if (rc < 0)
			die("DM_TARGET_MSG mark");
		return 0;
	}
	if (strcmp(cmd, "remove") == 0)
		return remove_target();
	return markfs(argv[0], argv[3]);
}

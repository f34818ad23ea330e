/* pc-markfs: $POWERCUT_MARK_FILE inside the vm backend's guest.
 *
 * Serves a FUSE file system with one write-only file, "mark". Each write()
 * on it becomes one mark in the kernel's dm-log-writes log (the DM_TARGET_MSG
 * ioctl that `dmsetup message DEV 0 mark TEXT` sends) and returns only after
 * the target has queued the mark, so the mark is ordered after every write
 * that completed before the write() and before every write issued after it
 * returns: the contract of pc-recorder's control file, kept in the guest.
 *
 * Usage: pc-markfs DM-DEVICE-NAME MOUNTPOINT. Returns once mounted and keeps
 * serving in the background until MOUNTPOINT is unmounted. */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <linux/dm-ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
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
	fprintf(stderr, "pc-markfs: %s: %s\n", what, strerror(errno));
	exit(2);
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
	size_t size = sizeof(struct dm_ioctl) + sizeof(struct dm_target_msg) + sizeof verb + 2 * len;
	struct dm_ioctl *io = calloc(1, size);
	struct dm_target_msg *msg;
	int rc = 0;

	if (!io)
		return -ENOMEM;
	io->version[0] = DM_VERSION_MAJOR;
	io->data_size = (__u32)size;
	io->data_start = sizeof *io;
	snprintf(io->name, sizeof io->name, "%s", dm_name);
	msg = (struct dm_target_msg *)(io + 1);
	memcpy(msg->message, verb, sizeof verb - 1);
	escape(msg->message + sizeof verb - 1, text, len);
	if (ioctl(control_fd, DM_TARGET_MSG, io) < 0)
		rc = -errno;
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

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse *f;

	if (argc != 3) {
		fprintf(stderr, "usage: pc-markfs DM-DEVICE-NAME MOUNTPOINT\n");
		return 2;
	}
	dm_name = argv[1];
	control_fd = open("/dev/mapper/control", O_RDWR | O_CLOEXEC);
	if (control_fd < 0)
		die("/dev/mapper/control");
	if (fuse_opt_add_arg(&args, argv[0]) || fuse_opt_add_arg(&args, "-o") ||
	    fuse_opt_add_arg(&args, "fsname=pc-markfs,subtype=pc-markfs"))
		die("fuse arguments");
	f = fuse_new(&args, &mk_ops, sizeof mk_ops, NULL);
	if (!f || fuse_mount(f, argv[2]) != 0)
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

/* pc-repro: the small program a powercut shell export bundles.
 *
 *   pc-repro ops OP ARGS... [OP ARGS...]   run file-system ops in the current
 *                                          directory, holding named fds open
 *   pc-repro replay LOG TARGET MARK        write a dm-log-writes LOG onto TARGET
 *                                          up to and including the entry MARK
 *
 * ops: open NAME PATH FLAGS MODE | close NAME | write NAME LEN | pwrite NAME OFF LEN
 *      | read NAME LEN | pread NAME OFF LEN | fallocate NAME MODE OFF LEN
 *      | ftruncate NAME LEN | truncate PATH LEN | fsync NAME | fdatasync NAME
 *      | syncfs NAME | sync | sync_file_range NAME OFF LEN FLAGS
 *      | rename FROM TO FLAGS | link FROM TO | linkat NAME TO | symlink TARGET PATH | unlink PATH
 *      | rmdir PATH | mkdir PATH MODE | setxattr PATH NAME LEN | removexattr PATH NAME
 *      | setxattrs PATH NAME LEN COUNT (NAME, NAME.1 .. NAME.(COUNT-1); stops at a failure)
 *      | fsetxattr NAME XATTR LEN FLAGS (XATTR_CREATE 1, XATTR_REPLACE 2)
 *      | mmap_write NAME OFF LEN MSYNC | pwritev2 NAME OFF FLAGS LEN,LEN,...
 *      | copy_file_range FROM FROM_OFF NAME OFF LEN
 *      | clone FROM FROM_OFF NAME OFF LEN (0 0 0: FICLONE, else FICLONERANGE)
 *      | exchange_range FILE1 FILE1_OFF NAME OFF LEN FLAGS (XFS_IOC_EXCHANGE_RANGE on NAME)
 *      | f2fs_atomic NAME start|replace|commit|abort (the f2fs atomic-write ioctls) | mark TEXT
 * Numbers are decimal (FLAGS and MODE: the numeric values). Data is one byte
 * value per op ('a' + op number % 26). `mark TEXT` runs
 * `dmsetup message $PC_LOGWRITES 0 mark TEXT`. Each op prints one line with its
 * result; a failing op is reported and the run goes on, like powercut's executor.
 *
 * The log format (little endian): a super block (magic, version, nr_entries,
 * sectorsize), then per entry one header block (sector, nr_sectors, flags,
 * data_len; a mark's text follows the header) and nr_sectors * sectorsize
 * bytes of data unless it is a discard (written as zeros here).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#define MAXFDS 64
#define LW_MAGIC 0x6A736677736872ULL
#define LW_DISCARD 4
#define LW_MARK 8

static struct { char name[64]; int fd; } fds[MAXFDS];
static int nfds;

static int fd_of(const char *name)
{
    for (int i = 0; i < nfds; i++)
        if (!strcmp(fds[i].name, name))
            return fds[i].fd;
    return -1;
}

static void bind_fd(const char *name, int fd)
{
    for (int i = 0; i < nfds; i++)
        if (!strcmp(fds[i].name, name)) {
            fds[i].fd = fd;
            return;
        }
    if (nfds < MAXFDS) {
        snprintf(fds[nfds].name, sizeof fds[nfds].name, "%s", name);
        fds[nfds++].fd = fd;
    }
}

static long long num(const char *s) { return strtoll(s, NULL, 10); }

static char *buffer(size_t len, int op)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 1))  /* aligned: O_DIRECT works too */
        return NULL;
    memset(p, 'a' + op % 26, len);
    return p;
}

static long long run_mark(const char *text)
{
    const char *dev = getenv("PC_LOGWRITES");
    if (!dev)
        return errno = EINVAL, -1;
    pid_t pid = fork();
    if (pid == 0) {
        execlp("dmsetup", "dmsetup", "message", dev, "0", "mark", text, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : (errno = EIO, -1);
}

static long long mmap_write(int fd, off_t off, size_t len, int do_msync, int op)
{
    long page = sysconf(_SC_PAGESIZE);
    off_t start = off - off % page;
    size_t span = (size_t)(off - start) + len;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, start);
    if (m == MAP_FAILED)
        return -1;
    memset(m + (off - start), 'a' + op % 26, len);
    long long r = do_msync ? msync(m, span, MS_SYNC) : 0;
    munmap(m, span);
    return r;
}

/* COUNT setxattr calls with one value: NAME, then NAME.1 .. NAME.(COUNT-1), as the
 * executor's setxattr with a count makes them; stops at the first failure. */
static long long set_xattrs(const char *path, const char *name, const char *buf, size_t len, long long count)
{
    char nm[256];
    for (long long i = 0; i < count; i++) {
        if (i && snprintf(nm, sizeof nm, "%s.%lld", name, i) >= (int)sizeof nm) {
            errno = ERANGE;
            return -1;
        }
        if (setxattr(path, i ? nm : name, buf, len, 0))
            return -1;
    }
    return 0;
}

/* pwritev2(2) of consecutive parts (lengths LENS, comma separated) of one buffer. */
static long long write_vec(int fd, off_t off, int flags, const char *lens, int op)
{
    struct iovec iov[16];
    size_t total = 0;
    int n = 0;
    for (const char *p = lens; *p && n < 16; n++) {
        char *end;
        iov[n].iov_len = strtoull(p, &end, 10);
        total += iov[n].iov_len;
        p = *end == ',' ? end + 1 : end;
    }
    char *buf = buffer(total, op);
    if (!buf)
        return -1;
    for (int i = 0, at = 0; i < n; at += (int)iov[i].iov_len, i++)
        iov[i].iov_base = buf + at;
    long long r = pwritev2(fd, iov, n, off, flags);
    int saved = errno;
    free(buf);
    errno = saved;
    return r;
}

/* Run the op at argv[0]; returns how many arguments it took (0: unknown op). */
static int one_op(char **a, int left, int op)
{
    static const struct { const char *name; int args; } arity[] = {
        {"open", 5}, {"close", 2}, {"write", 3}, {"pwrite", 4}, {"read", 3}, {"pread", 4},
        {"fallocate", 5}, {"ftruncate", 3}, {"truncate", 3}, {"fsync", 2}, {"fdatasync", 2},
        {"syncfs", 2}, {"sync", 1}, {"sync_file_range", 5}, {"rename", 4}, {"link", 3}, {"linkat", 3},
        {"symlink", 3}, {"unlink", 2}, {"rmdir", 2}, {"mkdir", 3}, {"setxattr", 4},
        {"setxattrs", 5}, {"fsetxattr", 5}, {"removexattr", 3}, {"mmap_write", 5}, {"pwritev2", 5}, {"copy_file_range", 6},
        {"clone", 6}, {"exchange_range", 7}, {"f2fs_atomic", 3}, {"mark", 2},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof arity / sizeof arity[0]; i++)
        if (!strcmp(a[0], arity[i].name))
            n = arity[i].args;
    if (!n || n > left)
        return 0;
    const char *k = a[0];
    long long r = -1;
    char *buf = NULL;
    errno = 0;
    if (!strcmp(k, "open")) {
        r = open(a[2], (int)num(a[3]), (mode_t)num(a[4]));
        if (r >= 0)
            bind_fd(a[1], (int)r);
    } else if (!strcmp(k, "close")) {
        r = close(fd_of(a[1]));
    } else if (!strcmp(k, "write")) {
        buf = buffer((size_t)num(a[2]), op);
        r = buf ? write(fd_of(a[1]), buf, (size_t)num(a[2])) : -1;
    } else if (!strcmp(k, "pwrite")) {
        buf = buffer((size_t)num(a[3]), op);
        r = buf ? pwrite(fd_of(a[1]), buf, (size_t)num(a[3]), (off_t)num(a[2])) : -1;
    } else if (!strcmp(k, "read")) {
        buf = buffer((size_t)num(a[2]), op);
        r = buf ? read(fd_of(a[1]), buf, (size_t)num(a[2])) : -1;
    } else if (!strcmp(k, "pread")) {
        buf = buffer((size_t)num(a[3]), op);
        r = buf ? pread(fd_of(a[1]), buf, (size_t)num(a[3]), (off_t)num(a[2])) : -1;
    } else if (!strcmp(k, "fallocate")) {
        r = fallocate(fd_of(a[1]), (int)num(a[2]), (off_t)num(a[3]), (off_t)num(a[4]));
    } else if (!strcmp(k, "ftruncate")) {
        r = ftruncate(fd_of(a[1]), (off_t)num(a[2]));
    } else if (!strcmp(k, "truncate")) {
        r = truncate(a[1], (off_t)num(a[2]));
    } else if (!strcmp(k, "fsync")) {
        r = fsync(fd_of(a[1]));
    } else if (!strcmp(k, "fdatasync")) {
        r = fdatasync(fd_of(a[1]));
    } else if (!strcmp(k, "syncfs")) {
        r = syncfs(fd_of(a[1]));
    } else if (!strcmp(k, "sync")) {
        sync();
        r = 0;
    } else if (!strcmp(k, "sync_file_range")) {
        r = sync_file_range(fd_of(a[1]), (off_t)num(a[2]), (off_t)num(a[3]), (unsigned)num(a[4]));
    } else if (!strcmp(k, "rename")) {
        r = syscall(SYS_renameat2, AT_FDCWD, a[1], AT_FDCWD, a[2], (unsigned)num(a[3]));
    } else if (!strcmp(k, "link")) {
        r = link(a[1], a[2]);
    } else if (!strcmp(k, "linkat")) {
        r = linkat(fd_of(a[1]), "", AT_FDCWD, a[2], AT_EMPTY_PATH);
    } else if (!strcmp(k, "symlink")) {
        r = symlink(a[1], a[2]);
    } else if (!strcmp(k, "unlink")) {
        r = unlink(a[1]);
    } else if (!strcmp(k, "rmdir")) {
        r = rmdir(a[1]);
    } else if (!strcmp(k, "mkdir")) {
        r = mkdir(a[1], (mode_t)num(a[2]));
    } else if (!strcmp(k, "setxattr")) {
        buf = buffer((size_t)num(a[3]), op);
        r = buf ? setxattr(a[1], a[2], buf, (size_t)num(a[3]), 0) : -1;
    } else if (!strcmp(k, "setxattrs")) {
        buf = buffer((size_t)num(a[3]), op);
        r = buf ? set_xattrs(a[1], a[2], buf, (size_t)num(a[3]), num(a[4])) : -1;
    } else if (!strcmp(k, "fsetxattr")) {
        buf = buffer((size_t)num(a[3]), op);
        r = buf ? fsetxattr(fd_of(a[1]), a[2], buf, (size_t)num(a[3]), (int)num(a[4])) : -1;
    } else if (!strcmp(k, "removexattr")) {
        r = removexattr(a[1], a[2]);
    } else if (!strcmp(k, "mmap_write")) {
        r = mmap_write(fd_of(a[1]), (off_t)num(a[2]), (size_t)num(a[3]), (int)num(a[4]), op);
    } else if (!strcmp(k, "pwritev2")) {
        r = write_vec(fd_of(a[1]), (off_t)num(a[2]), (int)num(a[3]), a[4], op);
    } else if (!strcmp(k, "copy_file_range")) {
        loff_t in = (loff_t)num(a[2]), out = (loff_t)num(a[4]);
        r = copy_file_range(fd_of(a[1]), &in, fd_of(a[3]), &out, (size_t)num(a[5]), 0);
    } else if (!strcmp(k, "clone")) {
        struct file_clone_range fcr = { .src_fd = fd_of(a[1]), .src_offset = (uint64_t)num(a[2]),
                                        .dest_offset = (uint64_t)num(a[4]), .src_length = (uint64_t)num(a[5]) };
        if (fcr.src_offset || fcr.dest_offset || fcr.src_length)
            r = ioctl(fd_of(a[3]), FICLONERANGE, &fcr);
        else
            r = ioctl(fd_of(a[3]), FICLONE, fcr.src_fd);
    } else if (!strcmp(k, "exchange_range")) {
        /* struct xfs_exchange_range and XFS_IOC_EXCHANGE_RANGE (fs/xfs/libxfs/xfs_fs.h, Linux 6.10) */
        struct { int32_t file1_fd; uint32_t pad; uint64_t off1, off2, len, flags; } x = {
            fd_of(a[1]), 0, (uint64_t)num(a[2]), (uint64_t)num(a[4]), (uint64_t)num(a[5]), (uint64_t)num(a[6]) };
        r = ioctl(fd_of(a[3]), _IOW('X', 129, x), &x);
    } else if (!strcmp(k, "f2fs_atomic")) {
        /* F2FS_IOC_{START,COMMIT,ABORT}_ATOMIC_WRITE, F2FS_IOC_START_ATOMIC_REPLACE (include/uapi/linux/f2fs.h) */
        int nr = !strcmp(a[2], "start") ? 1 : !strcmp(a[2], "commit") ? 2 : !strcmp(a[2], "abort") ? 5 : 25;
        r = ioctl(fd_of(a[1]), _IO(0xf5, nr));
    } else if (!strcmp(k, "mark")) {
        r = run_mark(a[1]);
    }
    int saved = errno;
    free(buf);
    printf("op %d: %s", op, k);
    for (int i = 1; i < n; i++)
        printf(" %s", a[i]);
    if (r < 0)
        printf(" = -1 (%s)\n", strerror(saved));
    else
        printf(" = %lld\n", r);
    fflush(stdout);
    return n;
}

static int ops(int argc, char **argv)
{
    int op = 0;
    for (int i = 0; i < argc;) {
        int used = one_op(argv + i, argc - i, op++);
        if (!used) {
            fprintf(stderr, "pc-repro: bad op at '%s'\n", argv[i]);
            return 2;
        }
        i += used;
    }
    return 0;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int replay(const char *log, const char *target, const char *mark)
{
    int lf = open(log, O_RDONLY), tf = open(target, O_WRONLY);
    if (lf < 0 || tf < 0) {
        perror("pc-repro replay: open");
        return 2;
    }
    unsigned char sb[32];
    if (pread(lf, sb, sizeof sb, 0) != (ssize_t)sizeof sb || le64(sb) != LW_MAGIC) {
        fprintf(stderr, "pc-repro replay: %s is no dm-log-writes log\n", log);
        return 2;
    }
    uint64_t entries = le64(sb + 16);
    uint32_t ss = (uint32_t)(sb[24] | sb[25] << 8 | sb[26] << 16 | (uint32_t)sb[27] << 24);
    unsigned char *hdr = malloc(ss);
    off_t pos = ss;
    for (uint64_t i = 0; i < entries; i++) {
        if (pread(lf, hdr, ss, pos) != (ssize_t)ss) {
            fprintf(stderr, "pc-repro replay: log cut short at entry %llu\n", (unsigned long long)i);
            return 2;
        }
        pos += ss;
        uint64_t sector = le64(hdr), nr = le64(hdr + 8), flags = le64(hdr + 16), dlen = le64(hdr + 24);
        if (flags & LW_MARK) {
            if (dlen == strlen(mark) && !memcmp(hdr + 32, mark, dlen)) {
                printf("replayed entries 0..%llu (mark %s)\n", (unsigned long long)i, mark);
                return fsync(tf) ? 2 : 0;
            }
            continue;
        }
        size_t len = (size_t)(nr * ss);
        unsigned char *data = calloc(1, len ? len : 1);
        if (!(flags & LW_DISCARD)) {
            if (pread(lf, data, len, pos) != (ssize_t)len) {
                fprintf(stderr, "pc-repro replay: data of entry %llu cut short\n", (unsigned long long)i);
                return 2;
            }
            pos += (off_t)len;
        }
        if (len && pwrite(tf, data, len, (off_t)(sector * ss)) != (ssize_t)len) {
            perror("pc-repro replay: write");
            return 2;
        }
        free(data);
    }
    fprintf(stderr, "pc-repro replay: mark '%s' not in %s\n", mark, log);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "ops"))
        return ops(argc - 2, argv + 2);
    if (argc == 5 && !strcmp(argv[1], "replay"))
        return replay(argv[2], argv[3], argv[4]);
    fprintf(stderr, "usage: pc-repro ops OP ARGS... | pc-repro replay LOG TARGET MARK\n");
    return 2;
}

/* The recovered tree as the guest kernel reads it, for the host's content oracle.
 *
 * Where the host kernel cannot mount the file system (f2fs on a host without
 * it), the content checks still have to read the image the kernel under test
 * recovered: after each recovery mount, pc-recover walks /mnt and writes what
 * the oracle reads (harness/backends/vm/contentdump.py rebuilds it as a
 * directory on the host) into the image's dump region of the batch disk:
 * every name with its kind, mode, inode number, link count and size, a
 * symlink's target, a file's data extents (SEEK_DATA/SEEK_HOLE), its mapped
 * ranges (FIEMAP, for the allocation checks) and its xattrs, and the errno of
 * every read that failed (a damaged image). Records, little-endian:
 *   u8 tag, u32 payload length, payload
 *   'N' u64 ino, u32 mode, u32 nlink, u64 size, path (relative, no NUL)
 *   'L' symlink target        'D' u64 offset, bytes      'M' u64 offset, u64 length
 *   'X' u16 name length, name, value
 *   'E' u32 errno, u16 path length, path, what failed (the path's node may be missing)
 *   'Z' the end (a dump without it did not fit its region)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "pc-dump.h"

#define CHUNK (1 << 20)

struct dump {
    int fd;               /* the batch disk */
    uint64_t at, end;     /* next write position, end of the region */
    int full;
    unsigned char *buf;   /* CHUNK bytes of file data at a time */
    const char *rel;      /* the path being read (for errors) */
};

static void put(struct dump *d, char tag, const void *a, size_t alen, const void *b, size_t blen) {
    unsigned char head[5];
    uint32_t len = (uint32_t)(alen + blen);
    if (d->full || d->at + 5 + len > d->end) {
        d->full = 1;
        return;
    }
    head[0] = (unsigned char)tag;
    memcpy(head + 1, &len, 4);  /* x86-64 guests: little-endian */
    if (pwrite(d->fd, head, 5, (off_t)d->at) != 5 || (alen && pwrite(d->fd, a, alen, (off_t)(d->at + 5)) != (ssize_t)alen) ||
        (blen && pwrite(d->fd, b, blen, (off_t)(d->at + 5 + alen)) != (ssize_t)blen)) {
        d->full = 1;
        return;
    }
    d->at += 5 + len;
}

static void put_error(struct dump *d, const char *what) {
    unsigned char head[6 + 4096];
    uint32_t e = (uint32_t)errno;
    uint16_t n = (uint16_t)strlen(d->rel);
    memcpy(head, &e, 4);
    memcpy(head + 4, &n, 2);
    memcpy(head + 6, d->rel, n);
    put(d, 'E', head, 6 + (size_t)n, what, strlen(what));
}

static void dump_data(struct dump *d, int fd, uint64_t size) {
    off_t pos = 0;
    while ((uint64_t)pos < size && !d->full) {
        off_t data = lseek(fd, pos, SEEK_DATA), hole;
        if (data < 0) {
            if (errno != ENXIO)
                put_error(d, "seek");
            return;
        }
        hole = lseek(fd, data, SEEK_HOLE);
        if (hole < 0 || (uint64_t)hole > size)
            hole = (off_t)size;
        for (pos = data; pos < hole && !d->full;) {
            size_t want = (size_t)(hole - pos) < CHUNK ? (size_t)(hole - pos) : CHUNK;
            ssize_t got = pread(fd, d->buf + 8, want, pos);
            uint64_t off = (uint64_t)pos;
            if (got < 0) {
                put_error(d, "read");
                return;
            }
            if (got == 0)
                return;
            memcpy(d->buf, &off, 8);
            put(d, 'D', d->buf, 8 + (size_t)got, NULL, 0);
            pos += got;
        }
    }
}

static void dump_mapped(struct dump *d, int fd) {
    size_t n = 256;
    struct fiemap *fm = calloc(1, sizeof(*fm) + n * sizeof(struct fiemap_extent));
    uint64_t start = 0;
    if (fm == NULL)
        return;
    for (;;) {
        memset(fm, 0, sizeof(*fm));
        fm->fm_start = start;
        fm->fm_length = FIEMAP_MAX_OFFSET - start;
        fm->fm_extent_count = (uint32_t)n;
        if (ioctl(fd, FS_IOC_FIEMAP, fm) != 0 || fm->fm_mapped_extents == 0)
            break;
        for (uint32_t i = 0; i < fm->fm_mapped_extents; i++) {
            uint64_t range[2] = {fm->fm_extents[i].fe_logical, fm->fm_extents[i].fe_length};
            put(d, 'M', range, sizeof(range), NULL, 0);
        }
        struct fiemap_extent *last = &fm->fm_extents[fm->fm_mapped_extents - 1];
        if (last->fe_flags & FIEMAP_EXTENT_LAST)
            break;
        start = last->fe_logical + last->fe_length;
    }
    free(fm);
}

static void dump_xattrs(struct dump *d, const char *path) {
    char names[65536], value[65536];
    ssize_t len = llistxattr(path, names, sizeof(names));
    if (len < 0) {
        if (errno != ENOTSUP)
            put_error(d, "listxattr");
        return;
    }
    for (char *n = names; n < names + len; n += strlen(n) + 1) {
        ssize_t vlen = lgetxattr(path, n, value, sizeof(value));
        uint16_t nlen = (uint16_t)strlen(n);
        unsigned char head[2 + 256];
        if (vlen < 0) {
            put_error(d, "getxattr");
            continue;
        }
        memcpy(head, &nlen, 2);
        memcpy(head + 2, n, nlen);
        put(d, 'X', head, 2 + (size_t)nlen, value, (size_t)vlen);
    }
}

static void walk(struct dump *d, const char *root, const char *rel) {
    char full[4096], child[4096];
    struct stat st;
    snprintf(full, sizeof(full), "%s%s%s", root, *rel ? "/" : "", rel);
    d->rel = rel;
    if (lstat(full, &st) != 0) {
        put_error(d, "lstat");
        return;
    }
    {
        unsigned char head[24];
        uint64_t ino = st.st_ino, size = (uint64_t)st.st_size;
        uint32_t mode = st.st_mode, nlink = (uint32_t)st.st_nlink;
        memcpy(head, &ino, 8);
        memcpy(head + 8, &mode, 4);
        memcpy(head + 12, &nlink, 4);
        memcpy(head + 16, &size, 8);
        put(d, 'N', head, sizeof(head), rel, strlen(rel));
    }
    if (S_ISLNK(st.st_mode)) {
        ssize_t n = readlink(full, child, sizeof(child));
        if (n < 0)
            put_error(d, "readlink");
        else
            put(d, 'L', child, (size_t)n, NULL, 0);
        return;
    }
    if (*rel)
        dump_xattrs(d, full);
    if (S_ISREG(st.st_mode)) {
        int fd = open(full, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            put_error(d, "open");
            return;
        }
        dump_data(d, fd, (uint64_t)st.st_size);
        dump_mapped(d, fd);
        close(fd);
        return;
    }
    if (!S_ISDIR(st.st_mode))
        return;
    DIR *dir = opendir(full);
    if (dir == NULL) {
        put_error(d, "opendir");
        return;
    }
    struct dirent *e;
    errno = 0;
    while ((e = readdir(dir)) != NULL && !d->full) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(child, sizeof(child), "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        walk(d, root, child);
        d->rel = rel;
        errno = 0;
    }
    if (errno != 0)
        put_error(d, "readdir");
    closedir(dir);
}

int dump_tree(const char *root, int fd, uint64_t start, uint64_t length) {
    struct dump d = {fd, start + 8, start + length, 0, malloc(8 + CHUNK), ""};
    if (d.buf == NULL || pwrite(fd, "PCDUMP1", 8, (off_t)start) != 8)
        return -1;
    walk(&d, root, "");
    put(&d, 'Z', NULL, 0, NULL, 0);
    free(d.buf);
    return d.full ? -1 : fdatasync(fd);  /* on the host before "ok I" says the image is done */
}

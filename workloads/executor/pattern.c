/* The data pattern of every write: byte-for-byte the same as
 * workloads/pattern.py, whose docstring defines the layout (512-byte chunks
 * aligned in the FILE, 32-byte header with a CRC32, splitmix64 filler).
 * Data is generated, never stored, so any byte found on disk after a crash
 * can be traced to the op and iteration that wrote it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pcexec.h"

#define CHUNK 512
#define HEADER 32
#define CRC_AT 28
#define GOLDEN 0x9E3779B97F4A7C15ull

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* zlib's CRC32 (reflected 0xEDB88320), so Python checks it with zlib.crc32. */
static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_of(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    while (n--)
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The full chunk that op (seq, iter) writes at aligned file offset OFF. */
static void make_chunk(uint8_t *c, uint32_t wid, uint32_t file_id, uint32_t seq,
                       uint32_t iter, uint64_t off)
{
    uint64_t k = mix64(mix64(mix64((uint64_t)wid << 32 | file_id) ^
                             ((uint64_t)seq << 32 | iter)) ^ off);
    memcpy(c, "pcD1", 4);
    pc_put_le(c + 4, wid, 4);
    pc_put_le(c + 8, file_id, 4);
    pc_put_le(c + 12, seq, 4);
    pc_put_le(c + 16, iter, 4);
    pc_put_le(c + 20, off, 8);
    pc_put_le(c + CRC_AT, 0, 4);
    for (int i = 0; i < (CHUNK - HEADER) / 8; i++)
        pc_put_le(c + HEADER + 8 * i, mix64(k + (uint64_t)(i + 1) * GOLDEN), 8);
    pc_put_le(c + CRC_AT, crc32_of(c, CHUNK), 4);
}

void pc_pattern_fill(uint8_t *dst, uint32_t wid, uint32_t file_id, uint32_t seq,
                     uint32_t iter, uint64_t offset, size_t len)
{
    uint8_t chunk[CHUNK];
    pthread_once(&crc_once, crc_init);
    while (len) {
        uint64_t base = offset - offset % CHUNK;
        size_t skip = (size_t)(offset - base);
        size_t n = CHUNK - skip < len ? CHUNK - skip : len;
        make_chunk(chunk, wid, file_id, seq, iter, base);
        memcpy(dst, chunk + skip, n);
        dst += n;
        offset += n;
        len -= n;
    }
}

static uint64_t arg_u64(const char *s, uint64_t max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || *s == '-' || v > max)
        pc_die("--pattern-dump: bad number '%s'", s);
    return v;
}

/* Hidden test mode: pc-exec --pattern-dump WID FILE_ID SEQ ITER OFFSET LENGTH
 * writes the pattern bytes to stdout, so tests compare C with Python. */
int pc_pattern_dump(int argc, char **argv)
{
    if (argc != 6)
        pc_die("usage: pc-exec --pattern-dump WID FILE_ID SEQ ITER OFFSET LENGTH");
    uint64_t len = arg_u64(argv[5], 1u << 30);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        pc_die("--pattern-dump: out of memory");
    pc_pattern_fill(buf, (uint32_t)arg_u64(argv[0], UINT32_MAX), (uint32_t)arg_u64(argv[1], UINT32_MAX),
                    (uint32_t)arg_u64(argv[2], UINT32_MAX), (uint32_t)arg_u64(argv[3], UINT32_MAX),
                    arg_u64(argv[4], INT64_MAX), len);
    for (size_t done = 0; done < len;) {
        ssize_t w = write(1, buf + done, len - done);
        if (w <= 0)
            pc_die("--pattern-dump: write to stdout: %s", strerror(errno));
        done += (size_t)w;
    }
    free(buf);
    return 0;
}

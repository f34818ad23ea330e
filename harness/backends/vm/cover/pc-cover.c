/* pc-cover: which kernel functions ran, counted per function, with no kernel rebuild.
 *
 * Usage: pc-cover attach MODULES...   (once per boot; MODULES: ext4 jbd2 ..., and
 *                                      "blk-flush" for the block layer's flush path;
 *                                      -NAME leaves function NAME out)
 *        pc-cover dump TAG             print "cov TAG NAME:COUNT ..." and zero the counters
 *        pc-cover reset                zero the counters
 *
 * Stock distribution kernels have no kcov, but they have BPF and fprobe. `attach`
 * loads a five-instruction BPF program on every ftrace-able function of MODULES
 * (read from tracefs' available_filter_functions) as one kprobe-multi link: each
 * function gets its index in that list as the link's cookie, and the program adds
 * one to counters[cookie] in an mmap-able array map. The map and the link are
 * pinned in bpffs, so they outlive this process and later calls find them; the
 * names, by index, go to NAMES_FILE. `dump` reads the counters through mmap (no
 * system call per function) and zeroes them.
 *
 * Why not the function tracer into the ring buffer: under TCG, formatting and
 * reading back ~30,000 trace lines of a short workload took seconds, ten times
 * the workload (docs/coverage.md); here reading is one pass over an array.
 */
#include <errno.h>
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BPFFS "/sys/fs/bpf"
#define MAP_PIN BPFFS "/pc-cover-map"
#define LINK_PIN BPFFS "/pc-cover-link"
#define NAMES_FILE "/run/pc-cover.names"
#define TRACEFS "/sys/kernel/tracing"
#define FUNCS TRACEFS "/available_filter_functions"

static long bpf(int cmd, union bpf_attr *attr) {
    return syscall(__NR_bpf, cmd, attr, sizeof(*attr));
}

static int die(const char *what) {
    fprintf(stderr, "pc-cover: %s: %s\n", what, strerror(errno));
    return 1;
}

/* The block layer's flush path: the vmlinux functions (no module) of these names. */
static int block_flush(const char *name) {
    return (strncmp(name, "blk", 3) == 0 && strstr(name, "flush") != NULL) ||
           strcmp(name, "submit_bio_wait") == 0;
}

static int wanted(const char *module, int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], module) == 0)
            return 1;
    return 0;
}

/* -NAME: a hot helper left out (its calls cost most and say nothing of which path ran). */
static int excluded(const char *name, int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (argv[i][0] == '-' && strcmp(argv[i] + 1, name) == 0)
            return 1;
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The functions to count, sorted, without duplicates (static functions of one name in two
 * files: kallsyms resolves a name once). */
static char **read_functions(int argc, char **argv, unsigned *count) {
    FILE *f = fopen(FUNCS, "r");
    char line[512];
    size_t n = 0, cap = 4096;
    char **names = malloc(cap * sizeof(*names));
    int flush = wanted("blk-flush", argc, argv);
    if (f == NULL || names == NULL)
        return NULL;
    while (fgets(line, sizeof(line), f)) {
        char *name = strtok(line, " \t\n"), *module = strtok(NULL, " \t\n");
        if (name == NULL)
            continue;
        if (module != NULL) {  /* "[ext4]" */
            size_t len = strlen(module);
            if (len < 3 || module[0] != '[')
                continue;
            module[len - 1] = '\0';
            if (!wanted(module + 1, argc, argv))
                continue;
        } else if (!flush || !block_flush(name)) {
            continue;
        }
        if (excluded(name, argc, argv))
            continue;
        if (n == cap && (names = realloc(names, (cap *= 2) * sizeof(*names))) == NULL)
            return NULL;
        names[n++] = strdup(name);
    }
    fclose(f);
    qsort(names, n, sizeof(*names), cmp_names);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || strcmp(names[m - 1], names[i]) != 0)
            names[m++] = names[i];
    *count = (unsigned)m;
    return names;
}

static int attach(int argc, char **argv) {
    unsigned n = 0;
    mkdir(TRACEFS, 0755);
    mount("nodev", TRACEFS, "tracefs", 0, NULL);  /* EBUSY: mounted already */
    mount("bpf", BPFFS, "bpf", 0, NULL);
    unlink(LINK_PIN);  /* attaching again (other modules) replaces the old link */
    unlink(MAP_PIN);
    char **names = read_functions(argc, argv, &n);
    if (names == NULL)
        return die("reading " FUNCS);
    if (n == 0) {
        fprintf(stderr, "pc-cover: no ftrace-able function in the modules asked for\n");
        return 1;
    }
    union bpf_attr a;
    memset(&a, 0, sizeof(a));
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 8;
    a.max_entries = n;
    a.map_flags = BPF_F_MMAPABLE;
    int map = (int)bpf(BPF_MAP_CREATE, &a);
    if (map < 0)
        return die("creating the counter map");
    /* r1 = ctx; r0 = cookie; key = r0; r0 = &counters[key]; if r0: *r0 += 1 (atomic); return 0 */
    struct bpf_insn prog[] = {
        {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_get_attach_cookie},
        {.code = BPF_STX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_10, .src_reg = BPF_REG_0, .off = -4},
        {.code = BPF_LD | BPF_DW | BPF_IMM, .dst_reg = BPF_REG_1, .src_reg = BPF_PSEUDO_MAP_FD, .imm = map},
        {0},
        {.code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = BPF_REG_2, .src_reg = BPF_REG_10},
        {.code = BPF_ALU64 | BPF_ADD | BPF_K, .dst_reg = BPF_REG_2, .imm = -4},
        {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_map_lookup_elem},
        {.code = BPF_JMP | BPF_JEQ | BPF_K, .dst_reg = BPF_REG_0, .off = 2, .imm = 0},
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_1, .imm = 1},
        {.code = BPF_STX | BPF_ATOMIC | BPF_DW, .dst_reg = BPF_REG_0, .src_reg = BPF_REG_1, .imm = BPF_ADD},
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 0},
        {.code = BPF_JMP | BPF_EXIT},
    };
    static char log[65536];
    memset(&a, 0, sizeof(a));
    a.prog_type = BPF_PROG_TYPE_KPROBE;
    a.expected_attach_type = BPF_TRACE_KPROBE_MULTI;
    a.insns = (uint64_t)(uintptr_t)prog;
    a.insn_cnt = sizeof(prog) / sizeof(prog[0]);
    a.license = (uint64_t)(uintptr_t)"GPL";
    a.log_buf = (uint64_t)(uintptr_t)log;
    a.log_size = sizeof(log);
    a.log_level = 1;
    int fd = (int)bpf(BPF_PROG_LOAD, &a);
    if (fd < 0) {
        fprintf(stderr, "pc-cover: loading the program: %s\n%s\n", strerror(errno), log);
        return 1;
    }
    uint64_t *cookies = malloc(n * sizeof(*cookies));
    if (cookies == NULL)
        return die("malloc");
    for (unsigned i = 0; i < n; i++)
        cookies[i] = i;
    memset(&a, 0, sizeof(a));
    a.link_create.prog_fd = (uint32_t)fd;
    a.link_create.attach_type = BPF_TRACE_KPROBE_MULTI;
    a.link_create.kprobe_multi.cnt = n;
    a.link_create.kprobe_multi.syms = (uint64_t)(uintptr_t)names;
    a.link_create.kprobe_multi.cookies = (uint64_t)(uintptr_t)cookies;
    int link = (int)bpf(BPF_LINK_CREATE, &a);
    if (link < 0)
        return die("attaching to the functions (kprobe-multi link)");
    memset(&a, 0, sizeof(a));
    a.pathname = (uint64_t)(uintptr_t)MAP_PIN;
    a.bpf_fd = (uint32_t)map;
    if (bpf(BPF_OBJ_PIN, &a) != 0)
        return die("pinning the map");
    a.pathname = (uint64_t)(uintptr_t)LINK_PIN;
    a.bpf_fd = (uint32_t)link;
    if (bpf(BPF_OBJ_PIN, &a) != 0)
        return die("pinning the link");
    FILE *out = fopen(NAMES_FILE, "w");
    if (out == NULL)
        return die("writing " NAMES_FILE);
    for (unsigned i = 0; i < n; i++)
        fprintf(out, "%s\n", names[i]);
    fclose(out);
    printf("%u\n", n);
    return 0;
}

static uint64_t *counters(unsigned *n) {
    union bpf_attr a;
    struct bpf_map_info info;
    memset(&a, 0, sizeof(a));
    a.pathname = (uint64_t)(uintptr_t)MAP_PIN;
    int map = (int)bpf(BPF_OBJ_GET, &a);
    if (map < 0)
        return NULL;
    memset(&info, 0, sizeof(info));
    memset(&a, 0, sizeof(a));
    a.info.bpf_fd = (uint32_t)map;
    a.info.info_len = sizeof(info);
    a.info.info = (uint64_t)(uintptr_t)&info;
    if (bpf(BPF_OBJ_GET_INFO_BY_FD, &a) != 0)
        return NULL;
    *n = info.max_entries;
    void *p = mmap(NULL, (size_t)*n * 8, PROT_READ | PROT_WRITE, MAP_SHARED, map, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int dump(const char *tag) {
    unsigned n = 0, i = 0;
    uint64_t *c = counters(&n);
    if (c == NULL)
        return die("opening the pinned counters (pc-cover attach first)");
    FILE *f = fopen(NAMES_FILE, "r");
    char name[512];
    if (f == NULL)
        return die("reading " NAMES_FILE);
    printf("cov %s", tag);
    while (i < n && fgets(name, sizeof(name), f)) {
        if (c[i]) {
            name[strcspn(name, "\n")] = '\0';
            printf(" %s:%llu", name, (unsigned long long)c[i]);
            c[i] = 0;
        }
        i++;
    }
    printf("\n");
    fclose(f);
    return 0;
}

static int reset(void) {
    unsigned n = 0;
    uint64_t *c = counters(&n);
    if (c == NULL)
        return die("opening the pinned counters (pc-cover attach first)");
    memset(c, 0, (size_t)n * 8);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "attach") == 0)
        return attach(argc, argv);
    if (argc == 3 && strcmp(argv[1], "dump") == 0)
        return dump(argv[2]);
    if (argc == 2 && strcmp(argv[1], "reset") == 0)
        return reset();
    fprintf(stderr, "usage: pc-cover attach MODULE... | dump TAG | reset\n");
    return 2;
}

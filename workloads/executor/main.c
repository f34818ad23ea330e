/* pc-exec: runs a powercut plan (see plan.c) in DIR, timing every op.
 *
 *   pc-exec --plan PLAN --dir DIR --out RECORDS [--mark-file PATH] [--mark-prefix STR]
 *   pc-exec --pattern-dump WID FILE_ID SEQ ITER OFFSET LENGTH   (tests: pattern bytes to stdout)
 *
 * Exit 0 when the workload ran (failed syscalls are recorded, not fatal);
 * 2 with one line on stderr for bad usage or plan, a thread whose
 * scheduling cannot be set, or records/marks that could not be written.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pcexec.h"

#define MARK_MAX 479        /* one mark of the recorder's mark file */
#define MARK_PREFIX_MAX 400
_Static_assert(MARK_PREFIX_MAX + sizeof "op 65535.4294967295.4294967295\n" - 1 <= MARK_MAX,
               "the longest mark must fit in one mark write");

static const char usage[] =
    "usage: pc-exec --plan PLAN --dir DIR --out RECORDS [--mark-file PATH] [--mark-prefix STR]";

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "plan", required_argument, 0, 'p' }, { "dir", required_argument, 0, 'd' },
        { "out", required_argument, 0, 'o' }, { "mark-file", required_argument, 0, 'm' },
        { "mark-prefix", required_argument, 0, 'x' }, { 0, 0, 0, 0 },
    };
    const char *plan_path = NULL, *dir = NULL, *out = NULL, *mark_file = NULL, *prefix = "";
    int c;

    if (argc > 1 && !strcmp(argv[1], "--pattern-dump"))
        return pc_pattern_dump(argc - 2, argv + 2);
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'p': plan_path = optarg; break;
        case 'd': dir = optarg; break;
        case 'o': out = optarg; break;
        case 'm': mark_file = optarg; break;
        case 'x': prefix = optarg; break;
        default: pc_die("%s", usage);
        }
    }
    if (optind != argc || !plan_path || !dir || !out)
        pc_die("%s", usage);
    if (strlen(prefix) > MARK_PREFIX_MAX || strchr(prefix, '\n'))
        pc_die("--mark-prefix: at most %d characters and no newline", MARK_PREFIX_MAX);

    /* Everything named on the command line is opened before chdir(DIR). */
    FILE *pf = fopen(plan_path, "r");
    if (!pf)
        pc_die("%s: %s", plan_path, strerror(errno));
    struct pc_plan plan;
    pc_plan_parse(pf, plan_path, &plan);
    fclose(pf);
    FILE *of = fopen(out, "wb");
    if (!of)
        pc_die("%s: %s", out, strerror(errno));
    struct pc_run_opts opts = { .mark_fd = -1, .mark_prefix = prefix };
    if (mark_file && (opts.mark_fd = open(mark_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) < 0)
        pc_die("%s: %s", mark_file, strerror(errno));
    if (chdir(dir))
        pc_die("%s: %s", dir, strerror(errno));

    if (mlockall(MCL_CURRENT | MCL_FUTURE))
        fprintf(stderr, "pc-exec: warning: mlockall: %s (page faults may show in latencies)\n",
                strerror(errno));
    pc_ops_init();
    pc_prepare(&plan);
    struct pc_overhead ov;
    pc_measure_overhead(&ov);
    struct pc_run_result res = { 0 };
    pc_run(&plan, &opts, &res);

    if (pc_write_records(of, &plan, &ov, &res) || fclose(of))
        pc_die("%s: %s", out, strerror(errno));
    if (res.mark_failures)
        pc_die("%s: %u mark writes failed (%s): the marks do not match the run", mark_file,
               res.mark_failures, strerror(res.mark_errno));
    return 0;
}

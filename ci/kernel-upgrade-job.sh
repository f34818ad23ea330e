#!/usr/bin/env bash
# CI job for a kernel upgrade: run a corpus sample on the new kernel (QEMU
# guest, --backend vm) and on the runner's own kernel, and diff the verdicts
# and latency; a short fuzz campaign on the new kernel. Exit 1 if a verdict
# differs or the campaign found something, 2 on an error.
#   KERNEL   the kernel to test, e.g. debian:linux-image-6.12-amd64 (required)
#   ENTRIES  corpus entries, comma-separated globs (default: make's sample)
#   ROWS     matrix rows (default ext4-ordered)
#   OUT      output directory (default out/ci-kernel): host/, kernel/, diff.md, fuzz-*/
#   PREV_KERNEL  the kernel before the upgrade (debian:PACKAGE of the same series): if a
#            verdict changed, `powercut bisect` finds the first kernel between them (bisect.txt)
#   COORDINATOR, CAMPAIGN  join the fuzz step to a campaign shared with other jobs
#            (redis://HOST:PORT/N and a name; docs/scale-out.md): the jobs of one
#            kernel share one exhaustive space instead of each running its start
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KERNEL:-}" ]; then
    echo "kernel-upgrade-job: set KERNEL=debian:PACKAGE, e.g. debian:linux-image-6.12-amd64" >&2
    exit 2
fi
OUT=${OUT:-out/ci-kernel}
args=(KERNEL="$KERNEL" OUT="$OUT")
[ -n "${ENTRIES:-}" ] && args+=(ENTRIES="$ENTRIES")
[ -n "${ROWS:-}" ] && args+=(ROWS="$ROWS")
[ -n "${PREV_KERNEL:-}" ] && args+=(PREV_KERNEL="$PREV_KERNEL")
if [ -n "${COORDINATOR:-}" ]; then
    [ -n "${CAMPAIGN:-}" ] || { echo "kernel-upgrade-job: COORDINATOR needs CAMPAIGN=NAME" >&2; exit 2; }
    args+=(CI_FUZZ_ARGS="--coordinator $COORDINATOR --campaign $CAMPAIGN")
fi
make ci-kernel "${args[@]}"
rc=$?
# make exits 2 on any failure; the steps' own statuses say what happened:
# 2 if one failed (the bisection included), else 1 if the diff changed or the campaign found something.
[ "$rc" = 0 ] && exit 0
[ -f "$OUT/diff.rc" ] && [ -f "$OUT/fuzz.rc" ] || exit 2
status=0
for step in fuzz diff bisect; do
    [ -f "$OUT/$step.rc" ] || continue
    s=$(cat "$OUT/$step.rc")
    if [ "$s" -ge 2 ]; then exit 2; fi
    if [ "$step" != bisect ] && [ "$s" = 1 ]; then status=1; fi
done
exit "$status"

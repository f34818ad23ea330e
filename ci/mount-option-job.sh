#!/usr/bin/env bash
# CI job for a mount-option change: run the corpus across the matrix and
# compare with the last good run. Exit 1 on an unexpected verdict or a
# latency regression; JUnit XML for the CI system.
#   MATRIX    matrix file (default corpus/matrix.json, the one in this checkout)
#   BASELINE  results.json of the last good run (optional)
#   FS        only these file systems, e.g. ext4 (optional)
#   OUT       output directory (default out/ci-mount-options)
set -euo pipefail
cd "$(dirname "$0")/.."
MATRIX=${MATRIX:-corpus/matrix.json}
OUT=${OUT:-out/ci-mount-options}
make deps
args=(--matrix "$MATRIX" --out "$OUT" --junit "$OUT.junit.xml")
[ -n "${BASELINE:-}" ] && args+=(--baseline "$BASELINE")
[ -n "${FS:-}" ] && args+=(--fs "$FS")
exec .venv/bin/powercut corpus run "${args[@]}"

#!/usr/bin/env bash
# The README's second command: install, build, and run the whole test suite with ctest.
#   scripts/test.sh [ctest args...]     e.g. scripts/test.sh -L unit
# On failure it ends with a digest of the failing tests' first error lines (the full output
# is above, and in <build>/Testing/Temporary/LastTest.log).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
# vlm_hf_parity_test writes about 8 GB of reference tensors (real-width layers) under
# test_tmp/ while it runs; the rest of the suite needs little.
free_gb=$(df -Pk . | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
if [ "$free_gb" -lt 12 ]; then
  echo "test.sh: warning: only ${free_gb} GB free in $(pwd); vlm_hf_parity_test needs about 8 GB of scratch" >&2
fi
set +e
ctest --output-on-failure --timeout 1200 -j "${CTEST_JOBS:-2}" "$@"
rc=$?
set -e
if [ "$rc" -ne 0 ] && [ -f Testing/Temporary/LastTest.log ]; then
  echo "=== test.sh: first error lines of the failing tests (full output above) ==="
  # Each test's block in LastTest.log runs from "Testing: <name>" to "<name> end time"; keep
  # the error lines of the blocks that did not pass, 12 per test.
  awk '/ Testing: /{name=$3; n=0; buf=""; next}
       /^(Test Failed|Test Timeout|Test Killed)/ || /Test time .*Failed/ {bad=1}
       /Failure$|Error|error:|\[  FAILED  \]|No space left|Timeout|timed out|Expected|Actual|Which is/ {
         if (n < 12) { buf = buf "  " $0 "\n"; n++ } }
       / end time: /{ if (bad) printf "%s:\n%s", name, buf; bad=0 }' Testing/Temporary/LastTest.log || true
fi
exit "$rc"

#!/usr/bin/env bash
# The README's second command: install, build, and run the whole test suite with ctest.
#   scripts/test.sh [ctest args...]     e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 1200 -j "${CTEST_JOBS:-2}" "$@"

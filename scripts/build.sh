#!/usr/bin/env bash
# Installs dependencies (idempotent) and builds vlmtrain into build/ (or $BUILD_DIR).
#   scripts/build.sh [ninja targets...]      e.g. scripts/build.sh vlmtrain   (default: all)
# Extra CMake options: CMAKE_ARGS="-DVLMTRAIN_UNITY=OFF ..." scripts/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

bash scripts/install-deps.sh
start=$(date +%s)
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" ${1:+--target "$@"}
echo "build: done in $(( $(date +%s) - start )) s ($BUILD_DIR${1:+: $*})"

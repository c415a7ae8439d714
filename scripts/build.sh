#!/usr/bin/env bash
# Installs dependencies (apt, idempotent) and builds vlmtrain into build/ (or $BUILD_DIR).
#   scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

bash scripts/install-deps.sh
start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
echo "build: done in $(( $(date +%s) - start )) s ($BUILD_DIR)"

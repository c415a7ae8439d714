#!/usr/bin/env bash
# ASan + UBSan: builds vlmtrain and its tests with clang-14 into build-asan/ and runs the
# `unit` tests under the sanitizers.
#   scripts/sanitize.sh [ctest args...]      e.g. scripts/sanitize.sh -R safetensors
# Environment: BUILD_DIR (default build-asan), JOBS (default 2), CTEST_JOBS (default 1).
#
# Not part of CI (.ci/run): a cold clang build of everything takes ~20 min of CPU on the
# 2-core CI machine and the instrumented tests run 2-3x slower, which does not fit the
# 30-minute budget next to the normal GCC build. Run it before merging parser changes.
#
# The same build directory carries the libFuzzer targets (-DVLMTRAIN_FUZZ=ON adds coverage
# instrumentation, inert in the tests), so scripts/fuzz.sh reuses it without a second cold
# build. Sentencepiece (.model) tokenizers cannot load under ASan (dlopen RTLD_DEEPBIND,
# see vlm/text/sp_tokenizer.h): the tests that need one skip with that reason.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-asan}

bash scripts/clang-deps.sh
start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DVLMTRAIN_FUZZ=ON -DVLMTRAIN_BUILD_BENCH=OFF >/dev/null
# The test executables (one per folder; `ctest -L unit` below picks the unit entries) and
# the vlmtrain binary some of them start.
targets=(vlmtrain vlm_tests sharding_tests collate_tests data_tests app_tests)
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${targets[@]}"
echo "sanitize: build done in $(( $(date +%s) - start )) s ($BUILD_DIR)"

# Sanitizer settings (docs/hardening.md explains each choice).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$ROOT/tests/sanitize/ubsan.supp"
export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitize/lsan.supp:print_suppressions=0"
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)}
cd "$BUILD_DIR"
ctest -L unit --output-on-failure --timeout 1800 -j "${CTEST_JOBS:-1}" "$@"

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan, tests/fuzz/*_fuzz.cpp) and runs each
# one for SECONDS (default 60) on its seed corpus and dictionary, one after the other.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 300, scripts/fuzz.sh 30 safetensors
# Environment: BUILD_DIR (default build-asan, shared with scripts/sanitize.sh), JOBS (2),
# FUZZ_ARGS (extra libFuzzer flags), FUZZ_SKIP_BUILD=1 (run the targets already built).
#
# Layout under $BUILD_DIR:
#   corpus/seeds/<kind>/   small valid files written by the build (fuzz_seeds; never committed)
#   corpus/<kind>/         the growing corpus (kept between runs, so coverage accumulates)
#   fuzz-logs/<kind>.log   libFuzzer's output of the last run
#   fuzz-artifacts/<kind>/ crash-*, leak-*, timeout-*, oom-* inputs when a run fails
# Prints a table: target, seconds, execs/s, coverage (cov: edges, ft: features), corpus
# size, result. A failing target makes the script exit non-zero (after running the rest).
# Reproduce a finding: $BUILD_DIR/tests/fuzz/fuzz_<kind> <artifact>.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-asan}
SECONDS_PER_TARGET=${1:-60}
shift || true
ALL_TARGETS=(safetensors hf_index config_json tokenizer_json recipe_toml jsonl_record image_decode)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")

if [ -z "${FUZZ_SKIP_BUILD:-}" ]; then  # FUZZ_SKIP_BUILD=1: run what is built
  set -e
  bash scripts/clang-deps.sh
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++-14 -DVLMTRAIN_FUZZ=ON -DVLMTRAIN_BUILD_BENCH=OFF >/dev/null
  exes=()
  for t in "${TARGETS[@]}"; do exes+=("fuzz_$t"); done
  cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target fuzz_corpus "${exes[@]}"
  set +e
fi

# OpenCV's decoder-side pixel cap, read once when libopencv_imgcodecs loads: keeps one
# image_decode input far below libFuzzer's RSS limit (our own cap, kMaxImagePixels, is higher).
export OPENCV_IO_MAX_IMAGE_PIXELS=${OPENCV_IO_MAX_IMAGE_PIXELS:-4194304}
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$ROOT/tests/sanitize/ubsan.supp"
export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitize/lsan.supp:print_suppressions=0"
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)}

mkdir -p "$BUILD_DIR/fuzz-logs"
rows=()
failed=0
for t in "${TARGETS[@]}"; do
  exe="$BUILD_DIR/tests/fuzz/fuzz_$t"
  corpus="$BUILD_DIR/corpus/$t"
  seeds="$BUILD_DIR/corpus/seeds/$t"
  arts="$BUILD_DIR/fuzz-artifacts/$t"
  log="$BUILD_DIR/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$arts"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  echo "fuzz: $t for ${SECONDS_PER_TARGET} s (log: $log)"
  start=$(date +%s)
  # -timeout: one input may take at most 10 s (LibTorch under ASan is slow, not that slow);
  # -rss_limit_mb: the 2 GB default; -max_len: big enough for the tokenizer.json seeds.
  "$exe" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$arts/" "${dict[@]}" ${FUZZ_ARGS:-} \
    "$corpus" "$seeds" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  eps=$(sed -n "s/^stat::average_exec_per_sec: *//p" "$log" | tail -1)
  [ -z "$eps" ] && eps=$(( ${runs:-0} / (secs > 0 ? secs : 1) ))
  if [ $rc -eq 0 ]; then
    result=ok
  else
    failed=1
    kind=$(grep -oE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [a-z-]+|runtime error|deadly signal|timeout|out-of-memory' "$log" | head -1)
    result="FAIL (${kind:-exit $rc}; see $arts)"
  fi
  rows+=("$(printf '%-15s %6s %9s %7s %7s %12s  %s' "$t" "$secs" "$eps" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result")")
done

echo
printf '%-15s %6s %9s %7s %7s %12s  %s\n' target seconds "execs/s" cov ft "corpus" result
for r in "${rows[@]}"; do echo "$r"; done
exit $failed

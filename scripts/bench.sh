#!/usr/bin/env bash
# Performance harness (issue #12), CPU part: builds the bench targets, renders a synthetic
# OCR set, runs every benchmark and prints one table, also written to bench/RESULTS.md.
# Not part of CI. Takes ~30-60 minutes on a quiet 2-core machine.
#
#   scripts/bench.sh                          everything
#   BENCH_SKIP=matrix,train scripts/bench.sh  skip sections (matrix, ratios, train, data, packing)
#   BENCH_REPEATS=5 BENCH_STEPS=5 scripts/bench.sh
#
# Speed is reported as ratios measured within one run (configurations interleaved,
# repeated, medians): compare them, not absolute times, across machines.
# The PyTorch DDP reference runs with the project's environment (.venv/bin/python, made by
# scripts/install-deps.sh; or set TORCH_PYTHON). The GPU part lives in scripts/gpu/ (run_bench.sh on a CUDA machine).
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-$PWD/build}
export BENCH_OUT=${BENCH_OUT:-$BUILD_DIR/bench-out}
export TORCH_PYTHON=${TORCH_PYTHON:-$PWD/.venv/bin/python}
JOBS=${JOBS:-2}

echo "bench: load average at start: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >&2
if [[ ! -f "$BUILD_DIR/build.ninja" && ! -f "$BUILD_DIR/Makefile" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} >/dev/null
fi
nice -n 5 cmake --build "$BUILD_DIR" -j "$JOBS" --target vlmtrain step_bench image_bench tokenizer_bench optimizer_bench loss_memory_bench lora_bench packing_bench

"$TORCH_PYTHON" -c 'import torch' 2>/dev/null || {
  echo "bench: $TORCH_PYTHON has no torch (run scripts/install-deps.sh)" >&2; exit 1; }
mkdir -p "$BENCH_OUT"
if [[ ! -f "$BENCH_OUT/synth/train.jsonl" ]]; then
  "$BUILD_DIR/vlmtrain" synth-ocr --out "$BENCH_OUT/synth" --train 400 --val 20 >&2
fi
python3 scripts/bench/bench.py

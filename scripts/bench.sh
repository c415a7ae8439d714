#!/usr/bin/env bash
# Performance harness (issues #12, #30), CPU part: builds the bench targets, renders a
# synthetic OCR set, runs every benchmark, vlmtrain next to what users would run instead
# (HF transformers + torch DDP / FSDP2, HF image processors and tokenizers), and writes one
# report, bench/RESULTS.md (every section, regenerated; see scripts/bench/bench.py).
# Not part of CI (.ci/run does not call it).
#
#   scripts/bench.sh            everything: ~50-60 minutes on the shared 2-core machine
#   scripts/bench.sh --quick    no step matrix (sections 2-3 kept from the report it replaces),
#                               fewer rounds elsewhere: ~30-35 minutes
#   BENCH_SKIP=matrix,train scripts/bench.sh   skip sections (ratios, matrix, train, data,
#                               hf_step, image_hf, tokenizer_hf, hf_dist, loader, packing); a skipped
#                               section keeps its earlier text, marked as such
#   BENCH_REPEATS=5 BENCH_STEPS=5 scripts/bench.sh
#
# Speed is reported as ratios measured within one run (configurations interleaved,
# repeated, medians): compare them, not absolute times, across machines.
# The PyTorch DDP reference runs with the project's environment (.venv/bin/python, made by
# scripts/install-deps.sh; or set TORCH_PYTHON). The GPU part lives in scripts/gpu/ (docs/gpu_run.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-$PWD/build}
export BENCH_OUT=${BENCH_OUT:-$BUILD_DIR/bench-out}
export TORCH_PYTHON=${TORCH_PYTHON:-$PWD/.venv/bin/python}
JOBS=${JOBS:-2}
if [[ "${1:-}" == "--quick" ]]; then export BENCH_QUICK=1; shift; fi
[[ $# -eq 0 ]] || { echo "usage: scripts/bench.sh [--quick]" >&2; exit 2; }

echo "bench: load average at start: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >&2
if [[ ! -f "$BUILD_DIR/build.ninja" && ! -f "$BUILD_DIR/Makefile" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} >/dev/null
fi
nice -n 5 cmake --build "$BUILD_DIR" -j "$JOBS" --target vlmtrain step_bench image_bench image_file_bench \
  tokenizer_bench loader_bench optimizer_bench loss_memory_bench lora_bench packing_bench

"$TORCH_PYTHON" -c 'import torch' 2>/dev/null || {
  echo "bench: $TORCH_PYTHON has no torch (run scripts/install-deps.sh)" >&2; exit 1; }
mkdir -p "$BENCH_OUT"
if [[ ! -f "$BENCH_OUT/synth/train.jsonl" ]]; then
  "$BUILD_DIR/vlmtrain" synth-ocr --out "$BENCH_OUT/synth" --train 400 --val 20 >&2
fi
python3 scripts/bench/bench.py

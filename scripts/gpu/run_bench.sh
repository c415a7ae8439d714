#!/usr/bin/env bash
# GPU side of issue #12, run ON the lent GPU machine from the repository root:
#   scripts/gpu/run_bench.sh            (writes $OUT/gpu_results.jsonl and $OUT/gpu_results.md)
# Through the device run tool (the machine cannot reach the internet; nlohmann-json and
# GoogleTest travel in build-gpu/deps, see vendor_deps.sh):
#   scripts/gpu/vendor_deps.sh                                    # here, once
#   run(command="scripts/gpu/run_bench.sh", carry=["build-gpu/deps"])
#
# What it measures (qwen2-vl-2b preset, random weights, world 1, bf16 params + fp32
# masters / reduce, SDPA attention, seq 2048 = 1 sample of 1790 text + 256 image tokens +
# 2 markers, image grid (1, 2, 512) = 1024 patches):
#   vlmtrain   build-gpu/build/bench/step_bench --device cuda --dtype bf16 (all ddp)
#   HF         scripts/gpu/hf_qwen2vl_bench.py (transformers Qwen2VLForConditionalGeneration,
#              random init from the same config.json, fp32 params + autocast bf16, sdpa)
# interleaved, ROUNDS rounds (default 2): tokens/s, MFU, peak CUDA memory (allocator peak).
# MFU convention (both): PaLM, 6 x P_trained per token/patch + 12 x layers x ctx x width
# for attention, no recompute, peak VLMTRAIN_PEAK_TFLOPS (default 989 = H100/H200 SXM
# dense bf16 spec). World 1 creates no process group (ParallelDims: nothing to talk to),
# so NCCL is compiled in and exercised only at world >= 2 (WORLD=2 runs that too when 2
# GPUs are present).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build-gpu/out}
ROUNDS=${ROUNDS:-2}
PEAK=${VLMTRAIN_PEAK_TFLOPS:-989}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"

scripts/gpu/build.sh step_bench
BENCH=build-gpu/build/bench/step_bench
"$BENCH" --preset qwen2-vl-2b --dump-config "$OUT/qwen2-vl-2b.json"

SHAPE=(--samples 1 --text 1790 --image-tokens 256)
res="$OUT/gpu_results.jsonl"
: > "$res"
for r in $(seq 1 "$ROUNDS"); do
  "$BENCH" --json --preset qwen2-vl-2b --device cuda --dtype bf16 --mix ddp --world 1 "${SHAPE[@]}" \
    --steps 10 --warmup 3 --peak-tflops "$PEAK" | tee -a "$res"
  "$PY" scripts/gpu/hf_qwen2vl_bench.py --config "$OUT/qwen2-vl-2b.json" "${SHAPE[@]}" \
    --steps 10 --warmup 3 --peak-tflops "$PEAK" | tee -a "$res"
done
if [[ "${WORLD:-1}" -ge 2 && $(nvidia-smi -L | wc -l) -ge 2 ]]; then
  "$BENCH" --json --preset qwen2-vl-2b --device cuda --dtype bf16 --mix ddp --world "$WORLD" "${SHAPE[@]}" \
    --steps 10 --warmup 3 --peak-tflops "$PEAK" | tee -a "$res"
fi

"$PY" - "$res" "$OUT/gpu.txt" > "$OUT/gpu_results.md" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
gpu = open(sys.argv[2]).read().strip()
def med(impl, key):
    v = [r[key] for r in rows if (r.get("impl") or "vlmtrain") == impl and r.get("world", 1) == 1]
    return statistics.median(v) if v else float("nan")
print(f"GPU: {gpu}\n")
print("| implementation | step s | tokens/s | MFU % (PaLM, 989 TFLOP/s) | peak CUDA memory GiB |")
print("|---|---|---|---|---|")
for impl in ("vlmtrain", "hf-transformers"):
    print(f"| {impl} | {med(impl, 'step_s'):.3f} | {med(impl, 'tokens_per_s'):.0f} | "
          f"{100 * med(impl, 'mfu'):.1f} | {med(impl, 'peak_device_bytes') / 2**30:.1f} |")
print(f"\nvlmtrain / HF step time: {med('vlmtrain', 'step_s') / med('hf-transformers', 'step_s'):.2f}x")
PYEOF
cat "$OUT/gpu_results.md"

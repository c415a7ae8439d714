#!/usr/bin/env bash
# Run ON the lent GPU machine (device tool), from the repository root, after
# scripts/gpu/pack.sh here. Nothing is built there: the packed binaries run against the
# device's own PyTorch 2.11.0 (its torch/lib and nvidia/*/lib), the packed lib/ for the rest.
#
#   run(command="scripts/gpu/device_run.sh env tests", carry=["build-gpu/pack"], timeout_s=600)
#   run(command="scripts/gpu/device_run.sh tiny", carry=["build-gpu/pack"], timeout_s=600)
#   run(command="scripts/gpu/device_run.sh bench", carry=["build-gpu/pack"], timeout_s=600)
#
# Phases (env always runs first; the files a call returns sit flat in $OUT, 8 at most, as
# the device tool brings back even when a call runs out of time; a failed phase stops the
# script with a non-zero exit code):
#   env    GPU, driver, torch; every packed binary's libraries resolve; vlmtrain --version
#          -> env.txt
#   tests  the `cuda` label: TrainCuda.* (app_tests), VarlenCuda.* (vlm_tests), OffloadCuda.*
#          (sharding_tests), each under a hard timeout; fails if a test fails or skips
#          -> tests.log (gtest output), tests.txt (counts)
#   tiny   the README's main job on CUDA (recipes/ocr_tiny.toml: 2000 steps, evals) and the
#          same recipe on the device's CPU for TINY_CPU_S seconds (default 120; TINY_STEPS=N
#          shortens both runs' schedule to N steps): the losses at
#          the steps both reached side by side, and the CUDA run's evals
#          -> tiny.log, tiny_curves.md, tiny_cuda.jsonl, tiny_cpu.jsonl (metrics)
#   bench  Qwen2-VL-2B (preset, random init), bf16, world 1, 2,048 tokens a step (1 sample of
#          1,022 text + 1,024 image tokens = 4,096 patches): vlmtrain (bench/step_bench) and HF
#          transformers (scripts/gpu/hf_qwen2vl_bench.py) interleaved (BENCH_SAMPLES=2: two such
#          samples a step; `vlmtrain plan` puts the full fine-tune at 52 GB for one sample without
#          checkpointing, 47 GB with, 37 GB of it persistent), BENCH_ROUNDS rounds
#          (default 1) of the rows BENCH_ROWS (default "full full-ckpt lora"), then one
#          profiled vlmtrain step (PROFILE=0 skips it)
#          -> bench.log (stderr), bench.jsonl, bench.md, profile.md, trace.json.gz
# Environment: OUT (the device tool sets it; default build-gpu/out), PYTHON (default python3,
# the device's PyTorch), VLMTRAIN_PEAK_TFLOPS (default 989: H100 SXM dense bf16).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build-gpu/out}
PY=${PYTHON:-python3}
RUN=$ROOT/build-gpu/run
PACK=$ROOT/build-gpu/pack/vlmtrain-gpu.tar.xz
PEAK=${VLMTRAIN_PEAK_TFLOPS:-989}
mkdir -p "$OUT"

# --check (here, on the dev machine): a copy of the tree and the pack at another path, run
# there with this machine's .venv as "the device's PyTorch": every phase's CPU part.
if [[ "${1:-}" == --check ]]; then
  rm -rf /tmp/vlmtrain-devcheck.*   # earlier checks (each holds an unpacked pack)
  dst=$(mktemp -d /tmp/vlmtrain-devcheck.XXXXXX)
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$dst" -xf -
  mkdir -p "$dst/build-gpu/pack" && cp "$PACK" "$dst/build-gpu/pack/"
  echo "device_run --check: in $dst"
  CHECK=1 OUT=$dst/out PYTHON=${PYTHON:-$ROOT/.venv/bin/python} bash "$dst/scripts/gpu/device_run.sh" check ||
    { echo "device_run --check: FAILED (files in $dst/out)" >&2; exit 1; }
  echo "device_run --check: passed ($dst/out: $(ls "$dst/out" | tr '\n' ' '))"
  exit 0
fi

# ---------------------------------------------------------------- the pack and its libraries
[[ -f "$PACK" ]] || { echo "device_run: no $PACK: run scripts/gpu/pack.sh here and carry build-gpu/pack" >&2; exit 2; }
if [[ ! -f "$RUN/MANIFEST" || "$PACK" -nt "$RUN/MANIFEST" ]]; then
  rm -rf "$RUN" && mkdir -p "$RUN"
  if command -v xz >/dev/null; then xz -dc "$PACK" | tar -C "$RUN" -xf -
  else "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$PACK" "$RUN"; fi
fi
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
SITE=$(dirname "$(dirname "$TORCH_LIB")")
NV=$(find "$SITE/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | sort | tr '\n' ':')
LD=$RUN/lib:$TORCH_LIB:$NV
# Debian bookworm's libstdc++ (GLIBCXX_3.4.30) built the binaries; the device's is used when
# it is as new, else the packed one.
sys_cxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {p = $NF} END {print p}')
if [[ -z "$sys_cxx" ]] || ! grep -qa GLIBCXX_3.4.30 "$sys_cxx"; then LD=$RUN/stdcxx:$LD; fi
export LD_LIBRARY_PATH=$LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export VLMTRAIN_TEST_SOURCE_DIR=$ROOT VLMTRAIN_TEST_BINARY_DIR=$RUN/tests VLMTRAIN_TEST_VLMTRAIN_BIN=$RUN/bin/vlmtrain
export VLMTRAIN_TEST_PYTHON=$(command -v "$PY")
mkdir -p "$RUN/tests" "$RUN/work"
BIN=$RUN/bin

phase_env() {
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
    "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "| gpu visible:", torch.cuda.is_available(), "| transformers", transformers.__version__)'
    echo "uname $(uname -srm); nproc $(nproc); libstdc++ ${sys_cxx:-none}"
    head -3 "$RUN/MANIFEST"
    "$BIN/vlmtrain" --version
  } 2>&1 | tee "$OUT/env.txt"
  if ldd "$BIN"/* | grep "not found"; then echo "device_run: unresolved libraries (above)" >&2; return 1; fi
}

phase_tests() {
  local rc=0 exe filter
  for spec in app_tests:TrainCuda.* vlm_tests:VarlenCuda.* sharding_tests:OffloadCuda.*; do
    exe=${spec%%:*} filter=${spec#*:}
    echo "== $exe --gtest_filter=$filter" >> "$OUT/tests.log"
    (cd "$RUN/tests" && OMP_WAIT_POLICY=PASSIVE timeout 540 "$BIN/$exe" --gtest_color=no "--gtest_filter=$filter") \
      >> "$OUT/tests.log" 2>&1 || { rc=$?; echo "== $exe exited with $rc" >> "$OUT/tests.log"; }
  done
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]" "$OUT/tests.log" | sed 's/ (.*//' | tee "$OUT/tests.txt"
  if grep -q "SKIPPED" "$OUT/tests.txt"; then echo "device_run: cuda tests skipped (no GPU visible?)" >&2; rc=1; fi
  return $rc
}

phase_tiny() {
  local w=$RUN/work/tiny && rm -rf "$w" && mkdir -p "$w"
  # The README's main job on CUDA, logging every step.
  "$BIN/vlmtrain" train recipes/ocr_tiny.toml --set "run.output_dir=$w/cuda" --set dist.device=cuda \
    --set log.every=1 ${TINY_STEPS:+--set "schedule.steps=$TINY_STEPS"} > "$OUT/tiny.log" 2>&1 || { echo "device_run: tiny CUDA run failed (tiny.log)" >&2; return 1; }
  # The same recipe on the CPU for a while: its first steps next to CUDA's.
  timeout "${TINY_CPU_S:-120}" "$BIN/vlmtrain" train recipes/ocr_tiny.toml --set "run.output_dir=$w/cpu" \
    ${TINY_STEPS:+--set "schedule.steps=$TINY_STEPS"} --set dist.device=cpu --set log.every=1 --set eval.every=0 > "$w/cpu.log" 2>&1 || true
  tail -n 5 "$w/cpu.log" >> "$OUT/tiny.log"
  cp "$w/cuda/metrics.jsonl" "$OUT/tiny_cuda.jsonl"
  cp "$w/cpu/metrics.jsonl" "$OUT/tiny_cpu.jsonl" || { echo "device_run: the CPU run logged nothing" >&2; return 1; }
  "$PY" scripts/gpu/compare_curves.py "$OUT/tiny_cuda.jsonl" "$OUT/tiny_cpu.jsonl" | tee "$OUT/tiny_curves.md"
}

bench_row() {  # bench_row ROW ROUND: vlmtrain, then HF transformers, on the row's setting
  local row=$1 r=$2 vl=() hf=()
  case $row in
    full) vl=(--mix full_shard) ;;
    full-ckpt) vl=(--mix full_shard --ckpt) hf=(--ckpt) ;;
    lora) vl=(--mix lora --lora-r 8) hf=(--lora 8) ;;
    *) echo "device_run: unknown bench row $row (full, full-ckpt, lora)" >&2; return 2 ;;
  esac
  local shape=(--samples "${BENCH_SAMPLES:-1}" --text 1022 --image-tokens 1024 --steps "${BENCH_STEPS:-10}" --warmup 3
               --peak-tflops "$PEAK")
  local tag="{\"row\": \"$row\", \"round\": $r, "
  echo "== vlmtrain $row round $r" >> "$OUT/bench.log"
  "$BIN/step_bench" --json --preset qwen2-vl-2b --device cuda --dtype bf16 "${vl[@]}" "${shape[@]}" \
    2>> "$OUT/bench.log" | sed "s/^{/$tag/" | tee -a "$OUT/bench.jsonl"
  echo "== hf $row round $r" >> "$OUT/bench.log"
  "$PY" scripts/gpu/hf_qwen2vl_bench.py --config "$RUN/work/qwen2-vl-2b.json" "${hf[@]}" "${shape[@]}" \
    2>> "$OUT/bench.log" | sed "s/^{/$tag/" | tee -a "$OUT/bench.jsonl"
}

phase_bench() {
  mkdir -p "$RUN/work"
  "$BIN/step_bench" --preset qwen2-vl-2b --dump-config "$RUN/work/qwen2-vl-2b.json"
  for r in $(seq 1 "${BENCH_ROUNDS:-1}"); do
    for row in ${BENCH_ROWS:-full full-ckpt lora}; do bench_row "$row" "$r"; done
  done
  if [[ "${PROFILE:-1}" == 1 ]]; then
    echo "== vlmtrain full, profiled" >> "$OUT/bench.log"
    "$BIN/step_bench" --json --preset qwen2-vl-2b --device cuda --dtype bf16 --mix full_shard --samples 1 \
      --text 1022 --image-tokens 1024 --steps 2 --warmup 2 --peak-tflops "$PEAK" --profile "$RUN/work/trace.json" \
      >> "$OUT/bench.log" 2>&1
    "$PY" scripts/gpu/trace_summary.py "$RUN/work/trace.json" | tee "$OUT/profile.md"
    gzip -c "$RUN/work/trace.json" > "$OUT/trace.json.gz"
  fi
  "$PY" scripts/gpu/bench_table.py "$OUT/bench.jsonl" "$OUT/env.txt" | tee "$OUT/bench.md"
}

phase_check() {  # CHECK=1 only (device_run.sh --check): the CPU parts of every phase
  [[ "${CHECK:-0}" == 1 ]] || { echo "device_run: the check phase runs under --check only" >&2; return 2; }
  # tests: the cuda suite skips without a GPU (saying why); Plan.* runs through the path overrides.
  (cd "$RUN/tests" && "$BIN/app_tests" --gtest_color=no "--gtest_filter=TrainCuda.Fp32StepsEqualCpu:Plan.*") \
    > "$OUT/tests.log" 2>&1 || { cat "$OUT/tests.log"; return 1; }
  grep -q "no CUDA device visible" "$OUT/tests.log" || { echo "check: TrainCuda did not skip" >&2; return 1; }
  # tiny: two short CPU runs of the README's recipe on a small synthetic set, compared.
  local w=$RUN/work/tiny && rm -rf "$w" && mkdir -p "$w"
  local small=(--set data.synth.train=64 --set data.synth.val=0 --set schedule.steps=4 --set schedule.warmup_steps=1 --set batch.samples_per_rank=2
               --set eval.every=0 --set eval.at_end=false --set log.every=1 --set checkpoint.every=0)
  for run in a b; do
    # Run a with the loader's log: every library any process loads must come from the pack, the
    # PyTorch environment, or glibc / libstdc++ (what the device has); dlopen()ed ones included.
    [[ $run == a ]] && export LD_DEBUG=libs LD_DEBUG_OUTPUT=$w/ld || unset LD_DEBUG LD_DEBUG_OUTPUT
    "$BIN/vlmtrain" train recipes/ocr_tiny.toml --set "run.output_dir=$w/$run" --set dist.device=cpu \
      --set "data.train=$w/data/train.jsonl" --set "data.eval=[]" --set "model.tokenizer=$w/data/tokenizer.model" \
      "${small[@]}" >> "$OUT/tiny.log" 2>&1 || { tail -20 "$OUT/tiny.log"; return 1; }
  done
  local foreign
  foreign=$(grep -h "calling init:" "$w"/ld.* | awk '{print $NF}' | sort -u |
            grep -vE "^$RUN/|^$TORCH_LIB/|/nvidia/|/ld-linux|/lib(c|m|dl|rt|pthread|util|resolv|stdc\+\+|gcc_s)\.so" || true)
  [[ -z "$foreign" ]] || { echo "check: loaded from outside the pack (missing on the device):" >&2; echo "$foreign" >&2; return 1; }
  grep -q "libsentencepiece" <(grep -h "calling init:" "$w"/ld.*) || { echo "check: sentencepiece was not loaded" >&2; return 1; }
  "$PY" scripts/gpu/compare_curves.py "$w/a/metrics.jsonl" "$w/b/metrics.jsonl" --names=CPU,CPU > "$OUT/tiny_curves.md"
  grep -q "max rel diff, steps 1-10: 0.00e+00" "$OUT/tiny_curves.md" || { cat "$OUT/tiny_curves.md"; return 1; }
  # bench: the small preset on the CPU, each row of both sides, and a profiled step.
  "$BIN/step_bench" --preset small --dump-config "$RUN/work/small.json"
  local shape=(--samples 1 --text 32 --image-tokens 16 --steps 2 --warmup 1)
  for row in "--mix full_shard" "--mix full_shard --ckpt" "--mix lora --lora-r 4"; do
    # shellcheck disable=SC2086
    "$BIN/step_bench" --json --preset small --device cpu $row "${shape[@]}" --peak-tflops 1 2>> "$OUT/bench.log" \
      | sed 's/^{/{"row": "check", /' >> "$OUT/bench.jsonl"
  done
  for hf in "" "--ckpt" "--lora 4"; do
    # shellcheck disable=SC2086
    "$PY" scripts/gpu/hf_qwen2vl_bench.py --device cpu --config "$RUN/work/small.json" $hf "${shape[@]}" \
      --peak-tflops 1 2>> "$OUT/bench.log" | sed 's/^{/{"row": "check", /' >> "$OUT/bench.jsonl"
  done
  [[ $(grep -c '^{' "$OUT/bench.jsonl") == 6 ]] || { cat "$OUT/bench.log"; return 1; }
  "$BIN/step_bench" --json --preset small --device cpu --mix full_shard "${shape[@]}" --profile "$RUN/work/trace.json" \
    >> "$OUT/bench.log" 2>&1
  "$PY" scripts/gpu/trace_summary.py "$RUN/work/trace.json" > "$OUT/profile.md"
  "$PY" scripts/gpu/bench_table.py "$OUT/bench.jsonl" "$OUT/env.txt" > "$OUT/bench.md"
  # Plan.RuleMatchingNothingFailsNamingTheRule writes its recipe into binary_dir(): the override must have moved it here.
  [[ -f "$RUN/tests/plan_bad_rule.toml" ]] || { echo "check: VLMTRAIN_TEST_BINARY_DIR was not used" >&2; return 1; }
  head -5 "$OUT/profile.md"; cat "$OUT/bench.md"
}

phase_env
for phase in "$@"; do
  [[ $phase == env ]] && continue
  echo "=== device_run: $phase ($(date -u +%T))"
  case $phase in
    tests|tiny|bench|check) "phase_$phase" ;;
    *) echo "device_run: unknown phase $phase (env, tests, tiny, bench)" >&2; exit 2 ;;
  esac
done
echo "=== device_run: done ($(date -u +%T))"

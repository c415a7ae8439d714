#!/usr/bin/env bash
# Run ON the lent GPU machine (device tool), from the repository root, after
# scripts/gpu/pack.sh here. Nothing is built there: the packed binaries run against the
# device's own PyTorch 2.11.0 (its torch/lib and nvidia/*/lib), the packed lib/ for the rest.
#
# One call does the whole GPU run (docs/gpu_run.md; 15 minutes of device time per task,
# machine start included; give the machine back right after):
#   run(command="scripts/gpu/device_run.sh all", carry=["build-gpu/pack"], timeout_s=560)
# The single phases stay available for a longer session:
#   run(command="scripts/gpu/device_run.sh tests", carry=["build-gpu/pack"], timeout_s=600)
#   run(command="scripts/gpu/device_run.sh tiny", carry=["build-gpu/pack"], timeout_s=600)
#   run(command="scripts/gpu/device_run.sh bench", carry=["build-gpu/pack"], timeout_s=600)
# Here, before any device call: scripts/gpu/device_run.sh --check (below).
#
# Contract: env always runs first; every file a call returns sits flat in $OUT (the device
# tool brings back 8 at most, also when a call runs out of time). A single phase that fails
# stops the script with a non-zero exit code; `all` reports a failure and goes on, and
# exits 1 at the end when any phase failed (0 otherwise, also when a phase was skipped
# for lack of time: all.txt says which).
#   env    GPU, driver, torch; every packed binary's libraries resolve; vlmtrain --version
#          -> env.txt
#   tests  the `cuda` label: TrainCuda.*, CheckpointCuda*, StartupMemoryCuda.* (app_tests), VarlenCuda.*, HostSyncCuda, ChunkedCrossEntropyCuda.* (vlm_tests), OffloadCuda.*
#          (sharding_tests), each under a hard timeout; fails if a test fails or skips
#          -> tests.log (gtest output), tests.txt (results and counts)
#   tiny   the README's main job on CUDA (recipes/ocr_tiny.toml: 2000 steps, evals) and the
#          same recipe on the device's CPU for TINY_CPU_S seconds (default 120; TINY_STEPS=N
#          shortens both runs' schedule to N steps): the losses at
#          the steps both reached side by side, and the CUDA run's evals
#          -> tiny.log, tiny_curves.md, tiny_cuda.jsonl, tiny_cpu.jsonl (metrics)
#   bench  Qwen2-VL-2B (preset, random init), bf16, world 1, 2,048 tokens a step (1 sample of
#          1,022 text + 1,024 image tokens = 4,096 patches): vlmtrain (bench/step_bench) and HF
#          transformers (scripts/gpu/hf_vlm_bench.py) interleaved (BENCH_SAMPLES=2: two such
#          samples a step; `vlmtrain plan` puts the full fine-tune at 52 GB for one sample without
#          checkpointing, 47 GB with, 37 GB of it persistent), BENCH_ROUNDS rounds
#          (default 1) of the rows BENCH_ROWS (default "full full-ckpt lora"), then one
#          profiled vlmtrain step (PROFILE=0 skips it). BENCH_PRESET: another preset of the
#          same shape (e.g. qwen3.5-2b; the HF side is AutoModelForImageTextToText of its
#          config, its MFU from vlmtrain's FLOPs); BENCH_LABEL: appended to the rows' names, so
#          that several settings can share one bench.jsonl (rows are appended to it)
#          -> bench.log (stderr), bench.jsonl, bench.md, profile.md, trace.json.gz
#   all    env, tests, tiny, bench in one call, against a deadline of ALL_BUDGET_S seconds
#          (default 500) from this script's start (the unpack included):
#          - tests as above, not fatal: failures and skips are reported in all.txt and the
#            script goes on; the three executables share at most ALL_TESTS_S (240) seconds and
#            leave ALL_TINY_S (150) for tiny; skipped when that leaves under 30 s;
#          - tiny with TINY_STEPS (default 300 here) on CUDA and, at the same time (started
#            once the CUDA run logged its first step), the CPU run for TINY_CPU_S (default 60
#            here) on nproc - 2 threads; both end by ALL_TINY_S; skipped under 60 s left;
#          - bench rows (BENCH_ROWS, one round) while at least ALL_BENCH_ROW_S (90) seconds are
#            left, then the profiled step while ALL_PROFILE_S (45) are left, each command under
#            a timeout that ends by the deadline; every phase or row left out says so
#          -> 8 files: all.txt (timeline, each phase's status and skip lines, the test results
#             and counts), env.txt, tests.log, tiny.log, tiny_curves.md, tiny.jsonl (both tiny
#             runs' metrics, each line tagged "run": "cuda" or "cpu"), bench.log, bench.md (the
#             table, then the profile summary and the raw bench.jsonl rows). Not returned by
#             `all`: trace.json.gz (run `bench` alone for it).
# Environment: OUT (the device tool sets it; default build-gpu/out), PYTHON (default python3,
# the device's PyTorch), VLMTRAIN_PEAK_TFLOPS (default 989: H100 SXM dense bf16).
#
# --check (HERE, on the dev machine; needs build-gpu/pack from scripts/gpu/pack.sh): copies the
# tree and the pack to /tmp, points the binaries at this machine's .venv torch as the device
# points them at its own, and runs `all` there with CHECK=1: its CPU part (the cuda tests skip
# and are reported, the tiny runs are two short CPU runs on a small synthetic set, the bench is
# the small preset on the CPU), plus the checks that the pack is self-contained; then `all`
# again with ALL_BUDGET_S=1 (every phase skipped, saying so). Exit 0 when all of it passed.
set -euo pipefail
T0=$(date +%s)   # `all`'s deadline counts from here
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build-gpu/out}
PY=${PYTHON:-python3}
RUN=$ROOT/build-gpu/run
PACK=$ROOT/build-gpu/pack/vlmtrain-gpu.tar.xz
PEAK=${VLMTRAIN_PEAK_TFLOPS:-989}
CHECK=${CHECK:-0}
mkdir -p "$OUT"

if [[ "${1:-}" == --check ]]; then
  [[ -f "$PACK" ]] || { echo "device_run --check: no $PACK: run scripts/gpu/pack.sh first" >&2; exit 2; }
  rm -rf /tmp/vlmtrain-devcheck.*   # earlier checks (each holds an unpacked pack)
  dst=$(mktemp -d /tmp/vlmtrain-devcheck.XXXXXX)
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$dst" -xf -
  mkdir -p "$dst/build-gpu/pack" && cp "$PACK" "$dst/build-gpu/pack/"
  echo "device_run --check: in $dst"
  py=${PYTHON:-$ROOT/.venv/bin/python}
  CHECK=1 OUT=$dst/out PYTHON=$py bash "$dst/scripts/gpu/device_run.sh" check ||
    { echo "device_run --check: FAILED (files in $dst/out)" >&2; exit 1; }
  # The deadline: with a 1 s budget every phase after env is skipped, each saying so.
  CHECK=1 OUT=$dst/out-late PYTHON=$py ALL_BUDGET_S=1 bash "$dst/scripts/gpu/device_run.sh" all > "$dst/late.log" 2>&1 ||
    { cat "$dst/late.log"; echo "device_run --check: FAILED (the 1 s budget run exited non-zero)" >&2; exit 1; }
  for p in tests tiny bench; do
    grep -q "^== $p: skipped" "$dst/out-late/all.txt" ||
      { cat "$dst/late.log"; echo "device_run --check: FAILED (no skip line for $p with a 1 s budget)" >&2; exit 1; }
  done
  echo "device_run --check: passed ($dst/out: $(cd "$dst/out" && echo *))"
  exit 0
fi

# ---------------------------------------------------------------- the pack and its libraries
[[ -f "$PACK" ]] || { echo "device_run: no $PACK: run scripts/gpu/pack.sh here and carry build-gpu/pack" >&2; exit 2; }
if [[ ! -f "$RUN/MANIFEST" || "$PACK" -nt "$RUN/MANIFEST" ]]; then
  rm -rf "$RUN" && mkdir -p "$RUN"
  if command -v xz >/dev/null; then xz -dc "$PACK" | tar -C "$RUN" -xf -
  else "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$PACK" "$RUN"; fi
  touch "$RUN/MANIFEST"   # newer than the pack now: a later call with the same pack keeps this unpack
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
VLMTRAIN_TEST_PYTHON=$(command -v "$PY")
export VLMTRAIN_TEST_PYTHON
mkdir -p "$RUN/tests" "$RUN/work"
BIN=$RUN/bin

# What runs where: the GPU's settings, or (CHECK=1, here) their CPU stand-ins.
if [[ $CHECK == 1 ]]; then
  DEV=cpu
  TEST_SPECS=("app_tests:TrainCuda.*:CheckpointCuda*:StartupMemoryCuda.*:Plan.*" "vlm_tests:VarlenCuda.*:*HostSyncCuda*:ChunkedCrossEntropyCuda.*" "sharding_tests:OffloadCuda.*")
  BPRESET=small
  BSHAPE=(--samples 1 --text 32 --image-tokens 16 --steps 2 --warmup 1 --peak-tflops 1)
  PSHAPE=(--samples 1 --text 32 --image-tokens 16 --steps 2 --warmup 1)
  BVL_DEV=(--device cpu) BHF_DEV=(--device cpu)
else
  DEV=cuda
  TEST_SPECS=("app_tests:TrainCuda.*:CheckpointCuda*:StartupMemoryCuda.*" "vlm_tests:VarlenCuda.*:*HostSyncCuda*:ChunkedCrossEntropyCuda.*" "sharding_tests:OffloadCuda.*")
  BPRESET=${BENCH_PRESET:-qwen2-vl-2b}
  BSHAPE=(--samples "${BENCH_SAMPLES:-1}" --text 1022 --image-tokens 1024 --steps "${BENCH_STEPS:-10}" --warmup 3
          --peak-tflops "$PEAK")
  PSHAPE=(--samples 1 --text 1022 --image-tokens 1024 --steps 2 --warmup 2 --peak-tflops "$PEAK")
  BVL_DEV=(--device cuda --dtype bf16) BHF_DEV=()
fi

now() { date +%s; }
# A timeout for `timeout`: the seconds from now until the epoch second $1, at most $2 when
# $2 > 0, at least 1; without $1, $2 (0: no limit).
until_s() {
  local t cap=${2:-0}
  [[ -n "${1:-}" ]] || { echo "$cap"; return; }
  t=$(( $1 - $(now) ))
  (( cap <= 0 || t <= cap )) || t=$cap
  (( t >= 1 )) || t=1
  echo "$t"
}
# Processes of the packed binaries still running after a timeout (a killed test leaves the
# vlmtrain runs it started, each in its own process group): ended by their pids.
reap_strays() {
  local pids
  command -v pgrep >/dev/null || return 0
  pids=$(pgrep -f "^$BIN/" | grep -vx "$$" || true)
  [[ -n "$pids" ]] || return 0
  echo "device_run: ending leftover processes $(echo "$pids" | tr '\n' ' ')" >&2
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null || true
  sleep 3
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
}

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

# TESTS_UNTIL (epoch seconds; `all` sets it): the executables share the time until then,
# each at most 540 s. TESTS_TXT: where the results go (default $OUT/tests.txt).
phase_tests() {
  local rc=0 exe filter t code txt=${TESTS_TXT:-$OUT/tests.txt} ok failed skipped
  : > "$OUT/tests.log"
  for spec in "${TEST_SPECS[@]}"; do
    exe=${spec%%:*} filter=${spec#*:}
    t=$(until_s "${TESTS_UNTIL:-}" 540)
    if (( t < 15 )); then
      echo "== $exe --gtest_filter=$filter: not run (${t} s left of the tests' time)" >> "$OUT/tests.log"
      rc=1
      continue
    fi
    echo "== $exe --gtest_filter=$filter (timeout $t s)" >> "$OUT/tests.log"
    code=0
    (cd "$RUN/tests" && OMP_WAIT_POLICY=PASSIVE timeout -k 10 "$t" "$BIN/$exe" --gtest_color=no "--gtest_filter=$filter") \
      >> "$OUT/tests.log" 2>&1 || code=$?
    if (( code != 0 )); then
      rc=1
      if (( code == 124 || code == 137 )); then
        echo "== $exe timed out after $t s" >> "$OUT/tests.log"
        reap_strays
      else
        echo "== $exe exited with $code" >> "$OUT/tests.log"
      fi
    fi
  done
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]|^== .*(not run|timed out|exited)" "$OUT/tests.log" |
    sed 's/ ([0-9]* ms)$//' | awk '!seen[$0]++' > "$txt" || true
  ok=$(grep -c "^\[ *OK" "$txt" || true) failed=$(grep -c "^\[ *FAILED" "$txt" || true)
  skipped=$(grep -c "^\[ *SKIPPED" "$txt" || true)
  echo "tests: $ok passed, $failed failed, $skipped skipped" >> "$txt"
  cat "$txt"
  if (( skipped > 0 )); then echo "device_run: cuda tests skipped (no GPU visible?)" >&2; rc=1; fi
  return $rc
}

# The README's main job on $DEV (CUDA; the CPU under CHECK) and the same recipe on the CPU
# for TINY_CPU_S seconds, compared. TINY_UNTIL (epoch seconds): both runs end by then.
# TINY_TOGETHER=1: the CPU run starts once the first has logged a step (the data is rendered
# by then) and runs beside it. TINY_MERGE=1: both runs' metrics in one tiny.jsonl.
phase_tiny() {
  local w=$RUN/work/tiny && rm -rf "$w" && mkdir -p "$w"
  local common=(--set log.every=1) pre=() cpu_env=() names=CUDA,CPU tmain tcpu pid rc=0 cpu_rc=0
  if [[ $CHECK == 1 ]]; then
    # Two short CPU runs on a small synthetic set; the first under the loader's log: every
    # library any process loads must come from the pack, the PyTorch environment, or glibc /
    # libstdc++ (what the device has), dlopen()ed ones included (checked in phase_check).
    common+=(--set "data.train=$w/data/train.jsonl" --set "data.eval=[]" --set "model.tokenizer=$w/data/tokenizer.model"
             --set data.synth.train=64 --set data.synth.val=0 --set schedule.steps=4 --set schedule.warmup_steps=1
             --set batch.samples_per_rank=2 --set eval.every=0 --set eval.at_end=false --set checkpoint.every=0)
    pre=(env LD_DEBUG=libs "LD_DEBUG_OUTPUT=$w/ld")
    names=CPU,CPU
  else
    [[ -z "${TINY_STEPS:-}" ]] || common+=(--set "schedule.steps=$TINY_STEPS")
    [[ "${TINY_TOGETHER:-0}" != 1 ]] || cpu_env=(env "OMP_NUM_THREADS=$(( $(nproc) > 4 ? $(nproc) - 2 : $(nproc) ))")
  fi
  tmain=$(until_s "${TINY_UNTIL:-}" 0)
  "${pre[@]}" timeout -k 10 "$tmain" "$BIN/vlmtrain" train recipes/ocr_tiny.toml --set "run.output_dir=$w/main" \
    --set "dist.device=$DEV" "${common[@]}" > "$OUT/tiny.log" 2>&1 &
  pid=$!
  if [[ "${TINY_TOGETHER:-0}" == 1 ]]; then
    while [[ ! -s "$w/main/metrics.jsonl" ]] && kill -0 "$pid" 2>/dev/null; do sleep 1; done
    if [[ ! -s "$w/main/metrics.jsonl" ]]; then
      wait "$pid" || rc=$?
      echo "device_run: the tiny $DEV run ended (exit $rc) before its first step: tiny.log" >&2
      return 1
    fi
  else
    wait "$pid" || rc=$?
  fi
  tcpu=$(until_s "${TINY_UNTIL:-}" "${TINY_CPU_S:-120}")
  "${cpu_env[@]}" timeout -k 10 "$tcpu" "$BIN/vlmtrain" train recipes/ocr_tiny.toml --set "run.output_dir=$w/cpu" \
    --set dist.device=cpu "${common[@]}" --set eval.every=0 --set eval.at_end=false > "$w/cpu.log" 2>&1 || cpu_rc=$?
  [[ "${TINY_TOGETHER:-0}" != 1 ]] || wait "$pid" || rc=$?
  echo "== the CPU run (exit $cpu_rc; 124 = stopped after $tcpu s as planned), its last lines:" >> "$OUT/tiny.log"
  tail -n 5 "$w/cpu.log" >> "$OUT/tiny.log"
  (( rc == 0 )) || echo "device_run: tiny $DEV run failed (exit $rc$( (( rc == 124 )) && echo ": out of time")): tiny.log" >&2
  [[ -s "$w/main/metrics.jsonl" ]] || { echo "device_run: the tiny $DEV run logged nothing" >&2; return 1; }
  [[ -s "$w/cpu/metrics.jsonl" ]] || { echo "device_run: the CPU run logged nothing" >&2; return 1; }
  if [[ "${TINY_MERGE:-0}" == 1 ]]; then
    { sed 's/^{/{"run": "cuda", /' "$w/main/metrics.jsonl"; sed 's/^{/{"run": "cpu", /' "$w/cpu/metrics.jsonl"; } > "$OUT/tiny.jsonl"
  else
    cp "$w/main/metrics.jsonl" "$OUT/tiny_cuda.jsonl"
    cp "$w/cpu/metrics.jsonl" "$OUT/tiny_cpu.jsonl"
  fi
  "$PY" scripts/gpu/compare_curves.py "$w/main/metrics.jsonl" "$w/cpu/metrics.jsonl" "--names=$names" | tee "$OUT/tiny_curves.md"
  return $rc
}

# BENCH_UNTIL (epoch seconds; `all` sets it): every command ends by then. BENCH_JSONL: where
# the rows go (default $OUT/bench.jsonl).
bench_row() {  # bench_row ROW ROUND: vlmtrain, then HF transformers, on the row's setting
  local row=$1 r=$2 vl=() hf=() rc=0 jsonl=${BENCH_JSONL:-$OUT/bench.jsonl}
  case $row in
    full) vl=(--mix full_shard) ;;
    full-ckpt) vl=(--mix full_shard --ckpt) hf=(--ckpt) ;;
    lora) vl=(--mix lora --lora-r 8) hf=(--lora 8) ;;
    *) echo "device_run: unknown bench row $row (full, full-ckpt, lora)" >&2; return 2 ;;
  esac
  # BENCH_LABEL (e.g. "qwen3.5-2b" or "x4"): the table's row name is "$row $BENCH_LABEL", so the
  # rows of several settings appended to one bench.jsonl stay apart.
  local tag="{\"row\": \"$row${BENCH_LABEL:+ $BENCH_LABEL}\", \"round\": $r, "
  echo "== vlmtrain $row round $r" >> "$OUT/bench.log"
  timeout -k 5 "$(until_s "${BENCH_UNTIL:-}" 0)" "$BIN/step_bench" --json --preset "$BPRESET" "${BVL_DEV[@]}" "${vl[@]}" \
    "${BSHAPE[@]}" 2>> "$OUT/bench.log" | sed "s/^{/$tag/" | tee -a "$jsonl" || { rc=1; echo "== vlmtrain $row failed" >> "$OUT/bench.log"; }
  echo "== hf $row round $r" >> "$OUT/bench.log"
  # The HF side's MFU counts vlmtrain's FLOPs of the same batch (its own formula is Qwen2-VL's).
  local flops
  flops=$(tail -n 1 "$jsonl" | "$PY" -c 'import json, sys; r = json.loads(sys.stdin.read() or "{}"); print(r.get("flops_per_rank_step", 0) if r.get("impl", "vlmtrain") == "vlmtrain" else 0)' 2>/dev/null || echo 0)
  timeout -k 5 "$(until_s "${BENCH_UNTIL:-}" 0)" "$PY" scripts/gpu/hf_vlm_bench.py --config "$RUN/work/$BPRESET.json" \
    --flops-per-step "$flops" "${BHF_DEV[@]}" "${hf[@]}" "${BSHAPE[@]}" 2>> "$OUT/bench.log" | sed "s/^{/$tag/" | tee -a "$jsonl" ||
    { rc=1; echo "== hf $row failed" >> "$OUT/bench.log"; }
  return $rc
}

bench_profile() {  # one profiled vlmtrain step; its summary on stdout
  echo "== vlmtrain full, profiled" >> "$OUT/bench.log"
  timeout -k 5 "$(until_s "${BENCH_UNTIL:-}" 0)" "$BIN/step_bench" --json --preset "$BPRESET" "${BVL_DEV[@]}" \
    --mix full_shard "${PSHAPE[@]}" --profile "$RUN/work/trace.json" \
    >> "$OUT/bench.log" 2>&1
  "$PY" scripts/gpu/trace_summary.py "$RUN/work/trace.json"
}

phase_bench() {
  "$BIN/step_bench" --preset "$BPRESET" --dump-config "$RUN/work/$BPRESET.json"
  for r in $(seq 1 "${BENCH_ROUNDS:-1}"); do
    for row in ${BENCH_ROWS:-full full-ckpt lora}; do bench_row "$row" "$r"; done
  done
  if [[ "${PROFILE:-1}" == 1 ]]; then
    bench_profile | tee "$OUT/profile.md"
    gzip -c "$RUN/work/trace.json" > "$OUT/trace.json.gz"
  fi
  "$PY" scripts/gpu/bench_table.py "$OUT/bench.jsonl" "$OUT/env.txt" | tee "$OUT/bench.md"
}

# ---------------------------------------------------------------- all: one call, one deadline
say() { echo "$*" | tee -a "$OUT/all.txt"; }
phase_all() {
  local end=$(( T0 + ${ALL_BUDGET_S:-500} )) tests_s=${ALL_TESTS_S:-240} tiny_s=${ALL_TINY_S:-150}
  local row_s=${ALL_BENCH_ROW_S:-90} prof_s=${ALL_PROFILE_S:-45} failed=() skipped=() rem t ran=0
  local work=$RUN/work steps=${TINY_STEPS:-300}
  [[ $CHECK == 1 ]] && steps="4 (CHECK)"
  left() { echo $(( end - $(now) )); }
  say "all: started $(date -u -d "@$T0" +%T) UTC; budget ${ALL_BUDGET_S:-500} s from the script's start; $(left) s left after env"

  # tests: not fatal; they leave tiny its time.
  t=$(( end - tiny_s - $(now) )); (( t < tests_s )) || t=$tests_s
  if (( t >= 30 )); then
    say "== tests: up to $t s ($(date -u +%T))"
    if TESTS_UNTIL=$(( $(now) + t )) TESTS_TXT=$work/tests.txt phase_tests; then say "== tests: ok"
    else say "== tests: failed (failures, skips or timeouts below and in tests.log)"; failed+=(tests); fi
    cat "$work/tests.txt" >> "$OUT/all.txt"
  else
    say "== tests: skipped, $(left) s left and tiny keeps $tiny_s (needs 30 s for the tests)"; skipped+=(tests)
  fi

  # tiny: the CUDA run and the CPU run side by side.
  rem=$(left)
  if (( rem >= 60 )); then
    t=$(( rem - 5 )); (( t < tiny_s )) || t=$tiny_s
    say "== tiny: up to $t s, $steps steps on $DEV, the CPU run for ${TINY_CPU_S:-60} s beside it ($(date -u +%T))"
    if TINY_UNTIL=$(( $(now) + t )) TINY_STEPS=${TINY_STEPS:-300} TINY_CPU_S=${TINY_CPU_S:-60} TINY_TOGETHER=1 \
         TINY_MERGE=1 phase_tiny > "$work/tiny.out" 2>&1; then say "== tiny: ok"
    else say "== tiny: failed ($(grep "^device_run:" "$work/tiny.out" | tr '\n' ' '))"; failed+=(tiny); fi
    cat "$work/tiny.out"
    grep "^max rel diff" "$OUT/tiny_curves.md" >> "$OUT/all.txt" || true
    reap_strays
  else
    say "== tiny: skipped, $rem s left (needs 60)"; skipped+=(tiny)
  fi

  # bench: the rows that fit, then the profiled step if there is time.
  rem=$(left)
  if (( rem >= row_s )); then
    say "== bench: $rem s left, a row starts with $row_s s left ($(date -u +%T))"
    rm -f "$work/bench.jsonl"
    "$BIN/step_bench" --preset "$BPRESET" --dump-config "$work/$BPRESET.json" ||
      say "== bench: step_bench --dump-config failed: the HF side has no config"
    for row in ${BENCH_ROWS:-full full-ckpt lora}; do
      rem=$(left)
      if (( rem < row_s )); then say "== bench row $row: skipped, $rem s left (needs $row_s)"; skipped+=("bench:$row"); continue; fi
      if BENCH_UNTIL=$(( end - 5 )) BENCH_JSONL=$work/bench.jsonl bench_row "$row" 1; then say "== bench row $row: ok"; ran=1
      else say "== bench row $row: failed (bench.log)"; failed+=("bench:$row"); fi
    done
    rem=$(left)
    : > "$work/profile.md"
    if [[ "${PROFILE:-1}" != 1 ]]; then say "== bench profile: skipped (PROFILE=0)"
    elif (( rem < prof_s )); then say "== bench profile: skipped, $rem s left (needs $prof_s)"; skipped+=(bench:profile)
    elif BENCH_UNTIL=$(( end - 5 )) bench_profile > "$work/profile.md"; then say "== bench profile: ok"
    else say "== bench profile: failed (bench.log)"; failed+=(bench:profile); fi
    if [[ -s "$work/bench.jsonl" ]]; then
      {
        "$PY" scripts/gpu/bench_table.py "$work/bench.jsonl" "$OUT/env.txt"
        if [[ -s "$work/profile.md" ]]; then echo; echo "## Profile (one vlmtrain full_shard step)"; echo; cat "$work/profile.md"; fi
        echo; echo "## Raw rows (bench.jsonl)"; echo; echo '```'; cat "$work/bench.jsonl"; echo '```'
      } > "$OUT/bench.md"
      cat "$OUT/bench.md"
    elif (( ran == 1 )); then say "== bench: the rows wrote no JSON line (bench.log)"; failed+=(bench)
    fi
    reap_strays
  else
    say "== bench: skipped, $rem s left (a row needs $row_s)"; skipped+=(bench)
  fi

  local files
  files=$(cd "$OUT" && find . -maxdepth 1 -type f | sed 's|^\./||' | sort | tr '\n' ' ')
  say "all: done in $(( $(now) - T0 )) s; failed: ${failed[*]:-none}; skipped for time: ${skipped[*]:-none}"
  say "all: files in \$OUT ($(wc -w <<< "$files")): $files"
  (( $(wc -w <<< "$files") <= 8 )) || say "all: more than 8 files: the device tool brings back 8, the others are lost"
  (( ${#failed[@]} == 0 ))
}

# CHECK=1 only (device_run.sh --check): `all`'s CPU part, then what proves the pack runs from
# another place with the device's kind of environment.
phase_check() {
  [[ $CHECK == 1 ]] || { echo "device_run: the check phase runs under --check only" >&2; return 2; }
  phase_all || true   # the cuda tests skip here: `all` reports them as a failure, expected
  local w=$RUN/work/tiny fail=0
  ck() { echo "check: $*" >&2; fail=1; }
  grep -q "^== tests: failed" "$OUT/all.txt" || ck "the skipped cuda tests were not reported as a failure"
  grep -q "no CUDA device visible" "$OUT/tests.log" || ck "TrainCuda did not skip"
  grep -q "^\[ *OK *\] Plan\." "$OUT/all.txt" || ck "the Plan tests did not pass (tests.log)"
  # Plan.RuleMatchingNothingFailsNamingTheRule writes its recipe into binary_dir(): the override must have moved it here.
  [[ -f "$RUN/tests/plan_bad_rule.toml" ]] || ck "VLMTRAIN_TEST_BINARY_DIR was not used"
  grep -q "^== tiny: ok" "$OUT/all.txt" || ck "tiny did not pass (tiny.log)"
  local foreign
  foreign=$(grep -h "calling init:" "$w"/ld.* | awk '{print $NF}' | sort -u |
            grep -vE "^$RUN/|^$TORCH_LIB/|/nvidia/|/ld-linux|/lib(c|m|dl|rt|pthread|util|resolv|stdc\+\+|gcc_s)\.so" || true)
  [[ -z "$foreign" ]] || ck "loaded from outside the pack (missing on the device): $foreign"
  grep -q "libsentencepiece" <(grep -h "calling init:" "$w"/ld.*) || ck "sentencepiece was not loaded"
  grep -q "max rel diff, steps 1-10: 0.00e+00" "$OUT/tiny_curves.md" || ck "two equal CPU runs differ (tiny_curves.md)"
  for r in cuda cpu; do grep -q "\"run\": \"$r\"" "$OUT/tiny.jsonl" || ck "tiny.jsonl has no $r run"; done
  [[ $(grep -c '^{' "$RUN/work/bench.jsonl") == 6 ]] || ck "not 6 bench rows (bench.log)"
  grep -q "^## Profile" "$OUT/bench.md" || ck "no profile summary in bench.md"
  local n
  n=$(find "$OUT" -maxdepth 1 -type f | wc -l)
  (( n == 8 )) || ck "all wrote $n files, not 8"
  (( fail == 0 )) && echo "check: all's CPU part passed ($(( $(now) - T0 )) s)"
  return "$fail"
}

phase_env
rc=0
for phase in "$@"; do
  [[ $phase == env ]] && continue
  echo "=== device_run: $phase ($(date -u +%T))"
  case $phase in
    # set -e: in a single phase the first failing command stops the script
    tests) phase_tests ;;
    tiny) phase_tiny ;;
    bench) phase_bench ;;
    check) phase_check ;;
    all) phase_all || rc=1 ;;                    # guards every step itself and goes on
    *) echo "device_run: unknown phase $phase (env, tests, tiny, bench, all)" >&2; exit 2 ;;
  esac
done
echo "=== device_run: done ($(date -u +%T))"
exit $rc

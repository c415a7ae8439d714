#!/usr/bin/env bash
# The first thing to run on a new machine or cluster node with 2 or more GPUs: vlmtrain's
# multi-GPU path (NCCL) against its own world-1 run, then a dead rank (docs/launch.md,
# "First run on a new cluster").
#
#   scripts/gpu/nccl_check.sh              # from the repository root, on a node with 2+ GPUs
#   scripts/gpu/nccl_check.sh --dry-run    # prints the commands, runs nothing (no GPU needed)
#   scripts/gpu/nccl_check.sh --gpus 2     # as if only 2 GPUs were visible (no hybrid step)
#   scripts/gpu/nccl_check.sh --cpu [--gpus 4]   # the same steps on the CPU over Gloo, fp32:
#                                          # a test of this script where there is no GPU, not of NCCL
#
# Contract. Every run is the tiny recipe (recipes/ocr_tiny.toml, changed only by --set) on
# CUDA in PRECISION (bf16), STEPS (20) steps, 16 samples a step in all, on a synthetic set
# rendered into $WORK/data by the first run (no downloads), NCCL_DEBUG=WARN unless set:
#   1. world 1: `vlmtrain train`, 16 samples per rank                            -> $WORK/w1
#   2. 2 ranks: `torchrun --standalone --nproc_per_node=2 --no-python vlmtrain train`,
#      dist.backend nccl, 8 samples per rank                                      -> $WORK/w2
#      passes when it logged steps 1..STEPS and every step's loss is within TOL (relative;
#      default 0.02 in bf16, 1e-3 in fp32) of world 1's (scripts/gpu/compare_curves.py)
#   3. 4+ GPUs only: 4 ranks as a 2 x 2 hybrid_shard mesh (dist.dp_shard=2; the vision
#      blocks' and the LLM layers' rules hybrid_shard), 4 samples per rank, same test -> $WORK/h4
#   4. a dead rank, twice: 2 ranks started directly with torchrun's variables (RANK,
#      WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; not torchrun, whose
#      agent would stop the survivor itself), dist.timeout_s=FAULT_TIMEOUT_S (30):
#      a. VLMTRAIN_FAULT_EXIT=3:1: rank 1 exits with 3 before step 3        -> $WORK/fault-exit
#      b. rank 1 killed (SIGKILL) once rank 0 has logged step 5, mid-run: on a GPU most likely
#         inside NCCL ops, which do not block the host: the watchdog's case -> $WORK/fault-kill
#      each passes when both ranks end within FAULT_TIMEOUT_S + 90 s, rank 1 with 3 (a) or
#      137 (b), rank 0 non-zero, and rank 0's error names the op ("comm: <op> #<seq> ...
#      failed on rank 0 of 2 (<plane>, <backend>, ..."); b's line says when the Gloo control
#      plane met the dead peer before the NCCL watchdog (then rerun to exercise the watchdog).
# Exit: 0 every check passed; 1 a check failed (the summary says which); 2 refused: fewer
# than 2 GPUs visible (as `vlmtrain --version` counts them, else `nvidia-smi -L`), or no
# vlmtrain / torchrun / python. The summary also goes to $WORK/summary.md.
# Environment: VLMTRAIN (default build/vlmtrain, else vlmtrain on PATH), TORCHRUN (default
# torchrun on PATH, else .venv/bin/torchrun), PYTHON (python3, for compare_curves.py), WORK
# (default runs/nccl_check; emptied first), STEPS, PRECISION (bf16|fp32), TOL,
# FAULT_TIMEOUT_S, RUN_TIMEOUT_S (600: the bound on each training run).
set -euo pipefail
cd "$(dirname "$0")/../.."

DRY=0 GPUS='' CPU=0
while (( $# )); do
  case $1 in
    --dry-run) DRY=1 ;;
    --cpu) CPU=1 ;;
    --gpus) GPUS=${2:?--gpus needs a count}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "nccl_check: unknown argument $1 (--dry-run, --gpus N, --cpu, --help)" >&2; exit 2 ;;
  esac
  shift
done

pick() { for c in "$@"; do [[ -n "$c" && -x "$c" ]] && { echo "$c"; return; }; done; return 0; }
VLMTRAIN=${VLMTRAIN:-$(pick build/vlmtrain "$(command -v vlmtrain || true)")}
TORCHRUN=${TORCHRUN:-$(pick "$(command -v torchrun || true)" .venv/bin/torchrun)}
PY=${PYTHON:-python3}
WORK=${WORK:-runs/nccl_check}
STEPS=${STEPS:-20}
DEVICE=cuda BACKEND=nccl
(( ! CPU )) || { DEVICE=cpu BACKEND=gloo; PRECISION=${PRECISION:-fp32}; }
PRECISION=${PRECISION:-bf16}
if [[ $PRECISION == fp32 ]]; then TOL=${TOL:-1e-3}; else TOL=${TOL:-0.02}; fi
FAULT_TIMEOUT_S=${FAULT_TIMEOUT_S:-30}
FAULT_BOUND_S=$(( FAULT_TIMEOUT_S + 90 ))
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-600}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# The GPUs this vlmtrain sees ("..., NCCL 2.28.9, 2 GPUs)"; CUDA_VISIBLE_DEVICES applies),
# else nvidia-smi's list.
gpu_count() {
  local n=
  [[ -z "$VLMTRAIN" ]] || n=$("$VLMTRAIN" --version 2>/dev/null | sed -n 's/.*, \([0-9][0-9]*\) GPUs\{0,1\})$/\1/p')
  if [[ -z "$n" ]] && command -v nvidia-smi >/dev/null; then n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true); fi
  echo "${n:-0}"
}

if (( DRY )); then
  seen=$(gpu_count)
  N=${GPUS:-4}
  echo "# nccl_check --dry-run: $seen GPU(s) visible here$( (( seen < 2 )) && echo " (a real run refuses: exit 2)");" \
       "the commands for $N GPUs"
  echo "# vlmtrain: ${VLMTRAIN:-<not found: set VLMTRAIN>}; torchrun: ${TORCHRUN:-<not found: set TORCHRUN>}; NCCL_DEBUG=$NCCL_DEBUG"
  VLMTRAIN=${VLMTRAIN:-vlmtrain} TORCHRUN=${TORCHRUN:-torchrun}
else
  [[ -n "$VLMTRAIN" ]] || { echo "nccl_check: no vlmtrain (build/vlmtrain or on PATH): set VLMTRAIN" >&2; exit 2; }
  [[ -n "$TORCHRUN" ]] || { echo "nccl_check: no torchrun (on PATH or .venv/bin): set TORCHRUN" >&2; exit 2; }
  command -v "$PY" >/dev/null || { echo "nccl_check: no $PY (compare_curves.py needs it): set PYTHON" >&2; exit 2; }
  if (( CPU )); then N=2; echo "# nccl_check --cpu: every step on the CPU over Gloo in $PRECISION (tests this script, not NCCL)"
  else N=$(gpu_count); fi
  if (( N < 2 )); then
    echo "nccl_check: $N GPU(s) visible ($("$VLMTRAIN" --version 2>&1 | head -1)); this check needs 2 or more." >&2
    echo "nccl_check: NCCL refuses two ranks on one GPU; on one GPU run the cuda tests instead (docs/gpu_run.md)." >&2
    exit 2
  fi
  [[ -z "$GPUS" ]] || (( GPUS > N && ! CPU )) || N=$GPUS
  rm -rf "$WORK" && mkdir -p "$WORK"
fi

# One command: printed (quoted, as a shell would read it back), then run unless --dry-run.
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
run() { show "$@"; (( DRY )) || "$@"; }

COMMON=(--set "dist.device=$DEVICE" --set "dist.backend=$BACKEND" --set "precision.param_dtype=$PRECISION"
        --set "schedule.steps=$STEPS" --set schedule.warmup_steps=2 --set log.every=1
        --set eval.every=0 --set eval.at_end=false --set checkpoint.every=0 --set checkpoint.save_final=false
        --set "data.train=$WORK/data/train.jsonl" --set "data.eval=[]" --set "model.tokenizer=$WORK/data/tokenizer.model"
        --set data.synth.train=512 --set data.synth.val=0)
# The runs after the first read the set it rendered.
READ=(--set data.synth.generate_if_missing=false)
HYBRID=(--set dist.dp_shard=2 --set sharding.module.0.strategy=hybrid_shard --set sharding.module.2.strategy=hybrid_shard)
RESULTS=()
fail=0
result() { RESULTS+=("$1"); echo "== $1"; [[ $1 == *": ok"* ]] || fail=1; }

compare() {  # compare NAME RUN_DIR: its losses against world 1's
  local name=$1 dir=$2
  if (( DRY )); then
    show "$PY" scripts/gpu/compare_curves.py "$WORK/w1/metrics.jsonl" "$dir/metrics.jsonl" "--names=world 1,$name" \
      "--max-rel=$TOL" "--expect-steps=$STEPS"
    return
  fi
  if "$PY" scripts/gpu/compare_curves.py "$WORK/w1/metrics.jsonl" "$dir/metrics.jsonl" "--names=world 1,$name" \
       "--max-rel=$TOL" "--expect-steps=$STEPS" > "$dir.curves.md" 2>&1; then
    result "$name vs world 1: ok ($(grep '^verdict' "$dir.curves.md" | cut -d: -f3-))"
  else
    result "$name vs world 1: FAILED ($(grep -h '^verdict\|Error' "$dir.curves.md" | tr '\n' ' ')) see $dir.curves.md"
  fi
}

echo "# 1. world 1 on $DEVICE ($PRECISION, $STEPS steps, 16 samples a step)"
if run timeout -k 10 "$RUN_TIMEOUT_S" "$VLMTRAIN" train recipes/ocr_tiny.toml --set "run.output_dir=$WORK/w1" "${COMMON[@]}" \
     --set batch.samples_per_rank=16; then
  (( DRY )) || result "world 1: ok"
else
  result "world 1: FAILED (exit $?): nothing to compare against"
  printf '%s\n' "${RESULTS[@]}" > "$WORK/summary.md"
  exit 1
fi

echo "# 2. 2 ranks under torchrun, $BACKEND, 8 samples per rank"
if run timeout -k 30 "$RUN_TIMEOUT_S" "$TORCHRUN" --standalone --nproc_per_node=2 --no-python "$VLMTRAIN" train \
     recipes/ocr_tiny.toml --set "run.output_dir=$WORK/w2" "${COMMON[@]}" "${READ[@]}" --set batch.samples_per_rank=8; then
  compare "2 ranks ($BACKEND)" "$WORK/w2"
else
  result "2 ranks ($BACKEND): FAILED (exit $?): see the output above"
fi

if (( N >= 4 )); then
  echo "# 3. 4 ranks as a 2 x 2 hybrid_shard mesh, 4 samples per rank"
  if run timeout -k 30 "$RUN_TIMEOUT_S" "$TORCHRUN" --standalone --nproc_per_node=4 --no-python "$VLMTRAIN" train \
       recipes/ocr_tiny.toml --set "run.output_dir=$WORK/h4" "${COMMON[@]}" "${READ[@]}" "${HYBRID[@]}" \
       --set batch.samples_per_rank=4; then
    compare "2 x 2 hybrid ($BACKEND)" "$WORK/h4"
  else
    result "2 x 2 hybrid ($BACKEND): FAILED (exit $?): see the output above"
  fi
else
  echo "# 3. the 2 x 2 hybrid layout: skipped ($N GPUs; it needs 4)"
fi

# A dead rank: 2 ranks started directly; rank 1 dies, rank 0 must end by itself.
#   dead_rank exit: VLMTRAIN_FAULT_EXIT=3:1, rank 1 exits with 3 before step 3 (at a step's
#                   start, so the first op to meet the dead peer is usually the step's first
#                   control-plane (Gloo) op)
#   dead_rank kill: rank 1 is sent SIGKILL once rank 0 has logged step 5 (schedule.steps 1000:
#                   mid-run; on a GPU rank 0 is then most likely inside the NCCL data plane's
#                   ops, which do not block the host: what the watchdog is for)
dead_rank() {
  local mode=$1 dir=$WORK/fault-$1 port r p code took op via pids=() codes=() t0 env1=() steps=$STEPS
  port=$(( 20000 + RANDOM % 20000 ))
  if command -v "$PY" >/dev/null; then
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' || echo "$port")
  fi
  [[ $mode == exit ]] && env1=(VLMTRAIN_FAULT_EXIT=3:1) || steps=1000
  (( DRY )) || mkdir -p "$dir"
  for r in 0 1; do
    local cmd=(env "RANK=$r" WORLD_SIZE=2 "LOCAL_RANK=$r" LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "MASTER_PORT=$port"
               OMP_NUM_THREADS=1 "${env1[@]}" "TORCHELASTIC_ERROR_FILE=$dir/rank$r.error.json"
               timeout -k 10 "$FAULT_BOUND_S" "$VLMTRAIN" train recipes/ocr_tiny.toml --set "run.output_dir=$dir/run"
               "${COMMON[@]}" "${READ[@]}" --set batch.samples_per_rank=8 --set "schedule.steps=$steps"
               --set "dist.timeout_s=$FAULT_TIMEOUT_S")
    show "${cmd[@]}"
    echo "  (in the background, output to $dir/rank$r.log)"
    if (( ! DRY )); then "${cmd[@]}" > "$dir/rank$r.log" 2>&1 & pids+=($!); fi
  done
  if (( DRY )); then
    [[ $mode == exit ]] || echo "  then, once $dir/run/metrics.jsonl has 5 lines: kill -KILL <rank 1's vlmtrain, the child of its timeout>"
    echo "  then: both ranks end within $FAULT_BOUND_S s, rank 1 with $([[ $mode == exit ]] && echo 3 || echo 137)," \
         "rank 0 non-zero (not 124: the bound) with 'comm: <op> #<seq> ... failed on rank 0 of 2 (<plane>, <backend>, ...)'"
    return 0
  fi
  t0=$(date +%s)
  if [[ $mode == kill ]]; then
    while (( $(wc -l 2>/dev/null < "$dir/run/metrics.jsonl" || echo 0) < 5 )) && kill -0 "${pids[1]}" 2>/dev/null; do sleep 0.2; done
    p=$(pgrep -P "${pids[1]}" || true)   # rank 1's vlmtrain (its timeout's child)
    if [[ -n "$p" ]]; then echo "  rank 0 logged step 5: kill -KILL $p (rank 1)"; kill -KILL "$p"; fi
  fi
  for p in "${pids[@]}"; do code=0; { wait "$p"; } 2>/dev/null || code=$?; codes+=("$code"); done
  took=$(( $(date +%s) - t0 ))
  # "comm: all_gather #41 ... (context: step 3 ...) failed on rank 0 of 2 (data plane, nccl, timeout 30 s): ..."
  op=$(grep -m1 -oE "comm: (all_reduce|all_gather|reduce_scatter|broadcast|barrier) #[0-9]+.* failed on rank 0 of 2 \([^)]*\)" \
         "$dir/rank0.log" || true)
  local want1=3
  [[ $mode == exit ]] || want1=137
  if (( codes[0] != 0 && codes[0] != 124 && codes[0] != 137 && codes[1] == want1 )) && [[ -n "$op" ]]; then
    # Which plane reported it: the NCCL data plane (the watchdog) or the Gloo control plane.
    via=$(sed -E 's/.* failed on rank 0 of 2 \(([^,]*), ([^,]*),.*/\1, \2/' <<< "$op")
    local note=""
    [[ $mode == exit || $BACKEND != nccl || $via == *nccl* ]] ||
      note="; the NCCL watchdog was not reached (the control plane met the dead peer first): rerun to exercise it"
    result "dead rank ($mode): ok (exit codes ${codes[*]} after $took s; reported on the $via$note: $op)"
  else
    result "dead rank ($mode): FAILED (exit codes ${codes[*]} after $took s, want rank 0 non-zero within $FAULT_BOUND_S s" \
           "and rank 1 $want1; rank 0's error: ${op:-no 'comm: <op> ... failed on rank 0' line}) see $dir/rank0.log"
  fi
}

echo "# 4a. rank 1 exits before step 3 (VLMTRAIN_FAULT_EXIT); rank 0 must end within $FAULT_BOUND_S s naming the op"
dead_rank exit
echo "# 4b. rank 1 killed mid-run (SIGKILL after step 5); rank 0 must end within $FAULT_BOUND_S s naming the op"
dead_rank kill
(( ! DRY )) || exit 0

{
  echo "# nccl_check: $N $( (( CPU )) && echo "CPU ranks (--cpu)" || echo GPUs), $PRECISION, $STEPS steps, tolerance $TOL, $(date -u +%FT%TZ)"
  "$VLMTRAIN" --version
  printf -- '- %s\n' "${RESULTS[@]}"
} | tee "$WORK/summary.md"
exit $fail

#!/bin/bash
# One convergence probe (docs/notes/tiny_convergence.md): trains recipes/ocr_tiny.toml on other
# data for STEPS steps, evaluating every 50, and prints the loss every 10 steps and the CER
# at each eval.
#   scripts/convergence/probe.sh NAME TRAIN_JSONL VAL_JSONL TOKENIZER STEPS [--set K=V]...
# FREEZE_VISION=1 freezes visual.patch_embed and visual.blocks (random features).
set -euo pipefail
name=$1; train=$2; val=$3; tok=$4; steps=$5; shift 5
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${PROBE_DIR:-/tmp/vlmtrain_probes}
mkdir -p "$out"
cat > "$out/$name.toml" <<TOML
$(sed -e "s#^train = \[.*#train = [\"$train\"]#" -e "s#^eval = \[.*#eval = [\"$val\"]#" \
      -e "s#^tokenizer = .*#tokenizer = \"$tok\"#" -e "s#^output_dir = .*#output_dir = \"$out/$name\"#" \
      "$root/recipes/ocr_tiny.toml" |
  awk -v freeze="${FREEZE_VISION:-0}" '
    freeze == "1" && /^match = "visual.patch_embed\|visual.blocks/ { print; hit = 1; next }
    hit == 1 && /^policy/ { print "policy = \"freeze\""; next }
    hit == 1 && /^strategy/ { hit = 0; next }
    { print }')
TOML
"${VLMTRAIN:-$root/build/vlmtrain}" train "$out/$name.toml" --set schedule.steps="$steps" \
  --set data.synth.generate_if_missing=false --set eval.every=50 --set checkpoint.every=100000 \
  --set checkpoint.resume=none --set checkpoint.save_final=false "$@" > "$out/$name.log" 2>&1
echo "$name loss: $(grep -o 'step  *[0-9]*/[0-9]* .*loss [0-9.]*' "$out/$name.log" | awk '{print $NF}' | tr '\n' ' ')"
echo "$name cer:  $(grep -o 'eval (.*cer [0-9.]*' "$out/$name.log" | sed 's/.*step \([0-9]*\).*cer \([0-9.]*\)/\1:\2/' | tr '\n' ' ')"

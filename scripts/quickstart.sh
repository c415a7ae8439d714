#!/usr/bin/env bash
# The README's first command: install, build, and run the main job on the built-in tiny
# default (recipes/ocr_tiny.toml). Extra arguments go to vlmtrain (e.g. --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
VLMTRAIN="$BUILD_DIR/vlmtrain"
# Until the trainer (issue #9) lands, the main job validates the tiny recipe, prints the
# tiny model's unit table, and renders the synthetic OCR set the recipe trains on.
"$VLMTRAIN" train recipes/ocr_tiny.toml --dry-run "$@"
"$VLMTRAIN" plan recipes/ocr_tiny.toml
if [ ! -f runs/synth_ocr/train.jsonl ]; then
  "$VLMTRAIN" synth-ocr --out runs/synth_ocr --train 4000 --val 200 --seed 1234
fi
echo "quickstart: synthetic OCR data in runs/synth_ocr; training lands with issue #9"

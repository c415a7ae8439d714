#!/usr/bin/env bash
# The README's first command: install, build, and run the main job on the built-in tiny
# default (recipes/ocr_tiny.toml): it renders the synthetic OCR set if missing, trains,
# checkpoints, evaluates on the val split, and writes the run's report.
# Extra arguments go to `vlmtrain train` (e.g. --set schedule.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh vlmtrain   # only the binary: tests and benchmarks are built by scripts/test.sh
BUILD_DIR=${BUILD_DIR:-build}
VLMTRAIN="$BUILD_DIR/vlmtrain"
"$VLMTRAIN" train recipes/ocr_tiny.toml "$@"
"$VLMTRAIN" report runs/ocr_tiny
echo "quickstart: run directory runs/ocr_tiny (metrics.jsonl, checkpoints, report.html)"

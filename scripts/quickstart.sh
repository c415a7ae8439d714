#!/usr/bin/env bash
# The README's first command: install, build, and run the main job on the built-in
# tiny default (recipes/ocr_tiny.toml). Extra arguments go to vlmtrain (e.g. --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
# Until the trainer (issue #9) lands, the main job is the plan of the tiny model.
"$BUILD_DIR/vlmtrain" plan recipes/ocr_tiny.toml "$@"

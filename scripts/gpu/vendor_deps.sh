#!/usr/bin/env bash
# Run HERE (the Debian dev machine), before sending the tree to a GPU machine that cannot
# reach the internet: copies the header-only / source-only dependencies that the
# LibTorch-only core build needs into build-gpu/deps (ignored by git, so it travels as a
# `carry` path of the device run tool: carry = ["build-gpu/deps"]).
#   build-gpu/deps/include/nlohmann/   nlohmann-json headers (Debian nlohmann-json3-dev)
#   build-gpu/deps/googletest-src/     GoogleTest sources (Debian libgtest-dev), built on
#                                      the device by build.sh with torch's C++ ABI
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=${DEPS:-build-gpu/deps}
mkdir -p "$DEPS/include"
[[ -f /usr/include/nlohmann/json.hpp ]] || { echo "vendor_deps: apt-get install nlohmann-json3-dev" >&2; exit 1; }
rm -rf "$DEPS/include/nlohmann" "$DEPS/googletest-src"
cp -r /usr/include/nlohmann "$DEPS/include/"
if [[ -d /usr/src/googletest ]]; then
  cp -r /usr/src/googletest "$DEPS/googletest-src"
else
  echo "vendor_deps: no /usr/src/googletest (apt-get install libgtest-dev): the GPU build will skip tests" >&2
fi
du -sh "$DEPS"

#!/usr/bin/env bash
# The layout's rules, checked on the source tree (a ctest entry, tests/CMakeLists.txt):
#   1. dependencies point down only: vlm/ includes only vlm/; collate/ and data/ include
#      vlm/ and themselves; sharding/ includes vlm/ and itself (docs/design.md, "Layers");
#   2. the model-family registry is sealed: no family identifier (a model_type) in code
#      outside vlm/families/ (adding a family touches no shared file but the registry);
#   3. the repository stands alone: nothing reads or cites a ../shared folder beside it;
#   4. the model's forward moves host tensors to its device only through
#      vlm::stage_to_device (vlm/runtime/device_staging.h: pinned, non-blocking), never with a
#      plain .to(device), which makes the host wait on a GPU (generation and the rope index,
#      host-side by design, are exempt).
# Prints every offending line and exits 1 when a rule is broken.
set -uo pipefail
cd "${1:-$(dirname "$0")/..}"
fail=0
check_includes() {  # FOLDER ALLOWED_REGEX
  local bad
  bad=$(grep -rnE '^#include "[a-z_]+/' --include=*.h --include=*.cpp "$1" |
        grep -vE "#include \"($2)/" || true)
  if [ -n "$bad" ]; then
    echo "layering: $1/ may include only $2/ (dependencies point down: app -> sharding, collate, data -> vlm):"
    echo "$bad"
    fail=1
  fi
}
check_includes vlm 'vlm'
check_includes collate 'vlm|collate'
check_includes data 'vlm|data'
check_includes sharding 'vlm|sharding'
families=$(grep -rnE 'qwen2_vl|qwen2_5_vl|qwen3_vl|qwen3_5|Family::' --include=*.h --include=*.cpp \
           app vlm sharding data collate | grep -v '^vlm/families/' || true)
if [ -n "$families" ]; then
  echo "registry: family identifiers outside vlm/families/ (read an architecture feature of the config instead):"
  echo "$families"
  fail=1
fi
pattern='\.\./shared|shared/(reference|DESIGN|spec|REFERENCE)'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  refs=$(git grep -nE "$pattern" -- . ':!scripts/check_layout.sh' || true)
else  # an unpacked source archive
  refs=$(grep -rnE "$pattern" --exclude-dir=.git --exclude-dir='build*' --exclude-dir=.venv --exclude-dir=runs \
         --exclude=check_layout.sh . || true)
fi
if [ -n "$refs" ]; then
  echo "stand-alone: these lines read or cite ../shared, which a clone of the repository does not have:"
  echo "$refs"
  fail=1
fi
copies=$(grep -nE '\.to\(([a-z_]+\.)?device(\(\))?[,)]|\.to\([a-z_.]+\.device\(\)' vlm/model/*.cpp vlm/families/*.cpp |
         grep -vE '^vlm/model/(generation|rope_index)\.cpp:' || true)
if [ -n "$copies" ]; then
  echo "host syncs: a plain .to(device) in the forward (use vlm::stage_to_device, vlm/runtime/device_staging.h):"
  echo "$copies"
  fail=1
fi
[ $fail -eq 0 ] && echo "layout: ok"
exit $fail

#!/usr/bin/env bash
# The layout's rules, checked on the source tree (a ctest entry, tests/CMakeLists.txt):
#   1. dependencies point down only: vlm/ includes only vlm/; collate/ and data/ include
#      vlm/ and themselves; sharding/ includes vlm/ and itself (docs/design.md, "Layers");
#   2. the model-family registry is sealed: no family identifier (a model_type) in code
#      outside vlm/families/ (adding a family touches no shared file but the registry);
#   3. the repository stands alone: nothing reads or cites a ../shared folder beside it.
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
[ $fail -eq 0 ] && echo "layout: ok"
exit $fail

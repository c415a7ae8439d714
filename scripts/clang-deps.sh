#!/usr/bin/env bash
# Installs what the sanitizer and fuzz builds need on top of scripts/install-deps.sh:
# Debian's clang-14 and its compiler-rt (ASan, UBSan, LSan, libFuzzer runtimes).
# Idempotent; used by scripts/sanitize.sh and scripts/fuzz.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in clang-14 libclang-rt-14-dev llvm-14; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "clang-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

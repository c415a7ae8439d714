#!/usr/bin/env bash
# Installs every build and test dependency of vlmtrain from Debian bookworm packages.
# Idempotent and quiet; run as root (or with sudo available) on a fresh machine.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev            # LibTorch 1.13.1 (CPU) + c10d Gloo headers
  libopenblas0-pthread                # fast BLAS for LibTorch (Debian defaults to netlib's reference BLAS)
  libopencv-dev                       # image decode / resize, synthetic OCR rendering
  libsentencepiece-dev sentencepiece  # .model tokenizers (+ spm_encode for tests)
  libtoml11-dev                       # recipes
  libspdlog-dev libfmt-dev            # logging
  nlohmann-json3-dev                  # config.json, tokenizer.json, safetensors headers
  libgtest-dev libgmock-dev           # tests
  libpcre2-dev libutf8proc-dev        # tokenizer pre-tokenizer regex, NFC
  python3-torch                       # torchrun (launch tests)
  iproute2                            # network namespaces (multi-node tests)
  nodejs npm                          # tokenizer conformance reference (npm package)
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian (e.g. a preinstalled Node.js): accept a working npm.
if command -v npm >/dev/null 2>&1; then
  filtered=(); for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

#!/usr/bin/env bash
# Installs every build and test dependency of vlmtrain, idempotent and quiet:
#   1. Debian bookworm packages (compiler, CMake, OpenCV, toml11, CLI11, spdlog, GoogleTest, ...);
#   2. a Python environment, .venv/ (or $VLMTRAIN_VENV), with the pinned packages of
#      scripts/requirements.txt: torch 2.11.0 (its LibTorch, CUDA 13 + NCCL, is what vlmtrain
#      links; its torchrun launches the multi-process tests) and the test references
#      (transformers, tokenizers, Pillow, torchvision, peft, numpy).
# Run as root (or with sudo available) on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  python3 python3-venv                # the environment for torch and the test references
  libgloo-dev                         # Gloo headers for c10d's ProcessGroupGloo.hpp (LibTorch ships none)
  libopencv-dev                       # image decode / resize, synthetic OCR rendering
  libjpeg-dev                         # CMYK JPEGs decoded as Pillow does (data/image.cpp)
  libsentencepiece-dev sentencepiece  # .model tokenizers (+ spm_encode for tests)
  libtoml11-dev                       # recipes
  libcli11-dev                        # command line (header-only CLI11)
  libspdlog-dev libfmt-dev            # logging
  nlohmann-json3-dev                  # config.json, tokenizer.json, safetensors headers
  libgtest-dev libgmock-dev           # tests
  libpcre2-dev libutf8proc-dev        # tokenizer pre-tokenizer regex, NFC
  iproute2                            # network namespaces (multi-node tests)
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------- Python environment
VENV=${VLMTRAIN_VENV:-.venv}
REQ=scripts/requirements.txt
stamp="$VENV/.vlmtrain-requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$REQ"; then
  echo "install-deps: $VENV up to date with $REQ"
  exit 0
fi
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "install-deps: creating $VENV with $($PY --version 2>&1)"
  "$PY" -m venv "$VENV"
fi
echo "install-deps: pip install -r $REQ into $VENV (torch 2.11.0 with CUDA 13: ~4.5 GB on first install)"
start=$(date +%s)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
"$VENV/bin/python" -c 'import torch; assert torch.__version__.startswith("2.11.0"), torch.__version__' || {
  echo "install-deps: $VENV has torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), expected 2.11.0" >&2
  exit 1
}
cp "$REQ" "$stamp"
echo "install-deps: Python environment ready in $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# Device-side build (GPU machine) against the CUDA LibTorch inside the installed PyTorch.
# NOT RUN SINCE THE TOOLCHAIN MOVED TO TORCH 2.11 (issue #21): the LibTorch-only "core"
# build it was written for is gone (one build for CPU and GPU now), so the device needs the
# Debian-only dependencies (OpenCV, toml11, spdlog, PCRE2, utf8proc, Gloo headers) carried
# in build-gpu/deps, or the binaries built here (same torch 2.11.0+cu130) carried with the
# shared libraries they need. Redoing this is part of the GPU-run issue (#23).
#
#   scripts/gpu/vendor_deps.sh          # on the dev machine first (offline GPU machines)
#   scripts/gpu/build.sh [targets...]   # on the GPU machine; default: step_bench + core tests
#   CONFIGURE_ONLY=1 PYTHON=/usr/bin/python3 BUILD_DIR=/tmp/x scripts/gpu/build.sh   # check the
#                                       # configure logic on a CPU machine (Debian torch)
#
# Finds: LibTorch from `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'`;
# nlohmann-json from the system or build-gpu/deps/include; GoogleTest from the system or
# built from build-gpu/deps/googletest-src with torch's _GLIBCXX_USE_CXX11_ABI (pip wheels
# before 2.7 use the old ABI; a mismatch shows as undefined std::string symbols at link).
# Torch's CMake config needs the CUDA toolkit (nvcc) at configure time: CUDA_HOME or
# /usr/local/cuda. Tests need no GPU except the ones that ask for one.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEPS=${DEPS:-$PWD/build-gpu/deps}
BUILD_DIR=${BUILD_DIR:-build-gpu/build}
TESTS=${VLMTRAIN_GPU_TESTS:-ON}

TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_ABI=$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)')
echo "gpu build: torch $TORCH_VERSION, cmake prefix $TORCH_PREFIX, cxx11 abi $TORCH_ABI" >&2

CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
[[ -x "$CUDA_HOME/bin/nvcc" ]] || echo "gpu build: warning: no nvcc under $CUDA_HOME (torch's CMake config may fail: set CUDA_HOME)" >&2
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"

args=(-DCMAKE_BUILD_TYPE=Release -DVLMTRAIN_BUILD_BENCH=ON "-DVLMTRAIN_PYTHON=$(command -v "$PY")"
      "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$TORCH_ABI"
      "-DCMAKE_CUDA_COMPILER=$CUDA_HOME/bin/nvcc" "-DCUDAToolkit_ROOT=$CUDA_HOME")
prefix="$TORCH_PREFIX"
if [[ ! -f /usr/include/nlohmann/json.hpp ]]; then
  [[ -f "$DEPS/include/nlohmann/json.hpp" ]] || { echo "gpu build: no nlohmann-json: run scripts/gpu/vendor_deps.sh on the dev machine and carry build-gpu/deps" >&2; exit 1; }
  args+=("-DVLMTRAIN_NLOHMANN_INCLUDE=$DEPS/include")
fi
if [[ "$TESTS" == ON ]] && ! ls /usr/lib/*/libgtest.a /usr/lib/libgtest.a >/dev/null 2>&1; then
  if [[ -d "$DEPS/googletest-src" ]]; then
    if [[ ! -f "$DEPS/gtest/lib/cmake/GTest/GTestConfig.cmake" && ! -f "$DEPS/gtest/lib64/cmake/GTest/GTestConfig.cmake" ]]; then
      cmake -S "$DEPS/googletest-src" -B "$DEPS/gtest-build" -DCMAKE_BUILD_TYPE=Release \
        "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$TORCH_ABI" -DCMAKE_INSTALL_PREFIX="$DEPS/gtest" \
        -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON >/dev/null
      cmake --build "$DEPS/gtest-build" -j "$(nproc)" --target install >/dev/null
    fi
    prefix="$prefix;$DEPS/gtest"
  else
    echo "gpu build: no GoogleTest (system or build-gpu/deps/googletest-src): tests off" >&2
    TESTS=OFF
  fi
fi
args+=("-DCMAKE_PREFIX_PATH=$prefix" "-DVLMTRAIN_BUILD_TESTS=$TESTS")
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${gen[@]}" "${args[@]}"
[[ "${CONFIGURE_ONLY:-0}" == 1 ]] && { echo "gpu build: configured only ($BUILD_DIR)" >&2; exit 0; }
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(step_bench)
  [[ "$TESTS" == ON ]] && targets=(all)
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"
echo "gpu build: done ($BUILD_DIR)" >&2

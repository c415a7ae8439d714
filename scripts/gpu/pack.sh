#!/usr/bin/env bash
# Run HERE (the Debian dev machine). Packs what the GPU run (issue #23) executes on the lent
# GPU machine, so that no device time goes into building: the binaries of this build (one
# build for CPU and GPU, linked against PyTorch 2.11.0's LibTorch with CUDA 13 and NCCL, the
# device's own version) and the shared libraries they need that the device lacks.
#
#   scripts/gpu/pack.sh                # builds the targets below, writes build-gpu/pack/
#   BUILD_DIR=build-q35 SKIP_BUILD=1 scripts/gpu/pack.sh   # packs an existing build as it is
#   run(command="scripts/gpu/device_run.sh all", carry=["build-gpu/pack"], timeout_s=560)
#
# build-gpu/pack/ (ignored by git; a `carry` path of the device run tool, 64 MiB at most
# with the source tree):
#   vlmtrain-gpu.tar.xz   bin/    vlmtrain, app_tests, vlm_tests, sharding_tests, step_bench
#                                 (stripped)
#                         lib/    every shared library they load that is neither LibTorch's
#                                 nor CUDA's (the device's PyTorch provides those) nor glibc's
#                                 (OpenCV and its codecs, spdlog, fmt, PCRE2, utf8proc, ...),
#                                 found with ldd, and the sentencepiece libraries vlmtrain
#                                 dlopen()s. Debian's libopencv_imgcodecs also links the
#                                 GDAL and DICOM (GDCM) decoders, whose libraries come to ~150 MB
#                                 (libgdal alone pulls in 100 others): the pack holds stubs of
#                                 those (lib/libgdal.so.32, libgdcm*.so.3.0) that define the 25
#                                 functions imgcodecs imports from them, each returning 0
#                                 ("could not open"), so a GeoTIFF or DICOM file fails to decode
#                                 there with vlmtrain's usual corrupt-image error. vlmtrain reads
#                                 JPEG, PNG, WebP, TIFF and BMP; none of them goes through those.
#                         stdcxx/ this machine's libstdc++ and libgcc_s, used only where the
#                                 device's are older (device_run.sh checks GLIBCXX_3.4.30)
#                         MANIFEST  commit, date, torch, sizes
# The test executables carry their build's absolute paths; device_run.sh points them at the
# device's tree with VLMTRAIN_TEST_SOURCE_DIR / VLMTRAIN_TEST_BINARY_DIR / VLMTRAIN_TEST_VLMTRAIN_BIN /
# VLMTRAIN_TEST_PYTHON (tests/testing.h).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
PACK=${PACK:-build-gpu/pack}
BINS=(vlmtrain app_tests vlm_tests sharding_tests step_bench)

[[ "${SKIP_BUILD:-0}" == 1 ]] || bash scripts/build.sh vlmtrain app_tests vlm_tests sharding_tests step_bench
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/stdcxx"
for b in "${BINS[@]}"; do
  src=$(find "$BUILD_DIR" -maxdepth 3 -type f -name "$b" -perm -u+x | head -1)
  [[ -n "$src" ]] || { echo "pack: $b not found under $BUILD_DIR (build it first)" >&2; exit 1; }
  cp "$src" "$stage/bin/$b"
  strip --strip-debug "$stage/bin/$b"
done

# Stubs of the GDAL and GDCM libraries Debian's imgcodecs links (see above).
STUBBED=(libgdal.so.32 libgdcmMSFF.so.3.0 libgdcmDSED.so.3.0)
codecs=$(ldd "$stage/bin/vlmtrain" | awk '/libopencv_imgcodecs/ {print $3}')
[[ -n "$codecs" ]] || { echo "pack: vlmtrain does not link libopencv_imgcodecs" >&2; exit 1; }
nm -D --undefined-only "$codecs" | awk '{print $2}' | sort -u > "$stage/undefined.txt"
for so in "${STUBBED[@]}"; do
  real=$(ldd "$codecs" | awk -v n="$so" '$1 == n {print $3}')
  [[ -f "$real" ]] || { echo "pack: $(basename "$codecs") no longer links $so: update STUBBED" >&2; exit 1; }
  {
    echo '#include <stdio.h>'
    # shellcheck disable=SC2028  # the \\n is C source, printed as is
    echo "static void called(const char* f) { static int once; if (!once++) fprintf(stderr, \"vlmtrain pack: $so is a stub (%s called): this format is not readable in the packed build\\n\", f); }"
    nm -D --defined-only "$real" | awk '$2 == "T" {print $3}' | sort -u | comm -12 - "$stage/undefined.txt" |
      while read -r f; do
        if [[ $f == GDALAllRegister ]]; then echo "void $f(void) {}"; else echo "long $f(void) { called(\"$f\"); return 0; }"; fi
      done
  } > "$stage/stub.c"
  gcc -shared -fPIC -O1 -Wl,-soname,"$so" -o "$stage/lib/$so" "$stage/stub.c"
done
rm -f "$stage/stub.c" "$stage/undefined.txt"
export LD_LIBRARY_PATH=$stage/lib   # ldd below then resolves the stubs, not the real libraries

# Libraries vlmtrain dlopen()s (ldd cannot see them): sentencepiece (vlm/text/sp_tokenizer.cpp).
for so in libsentencepiece.so.0 libsentencepiece_train.so.0; do
  real=$(ldconfig -p | awk -v n="$so" '$1 == n && /x86-64/ {p = $NF} END {print p}')
  [[ -f "$real" ]] || { echo "pack: $so not installed here (scripts/install-deps.sh installs it)" >&2; exit 1; }
  cp -L "$real" "$stage/lib/$so"
done

# The libraries the device provides itself: LibTorch and its bundled runtime (torch/lib),
# NVIDIA's (nvidia/*/lib of the device's PyTorch), the kernel driver's, and glibc's.
provided='/torch/lib/|/nvidia/|libcuda\.so|libcudart\.so|libnvidia-|/ld-linux|lib(c|m|dl|rt|pthread|util|resolv)\.so'
ldd "$stage"/bin/* "$stage"/lib/libsentencepiece* | awk '/=>/ {print $3}' | sort -u | while read -r so; do
  [[ -f "$so" ]] || continue
  if [[ "$so" =~ $provided || "$so" == "$stage/lib/"* ]]; then continue; fi
  case "$(basename "$so")" in
    libstdc++.so*|libgcc_s.so*) cp -L "$so" "$stage/stdcxx/" ;;
    *) cp -L "$so" "$stage/lib/" ;;
  esac
done
missing=$(ldd "$stage"/bin/* | grep "not found" || true)
[[ -z "$missing" ]] || { echo "pack: unresolved libraries here:" >&2; echo "$missing" >&2; exit 1; }
"$stage/bin/vlmtrain" --version >/dev/null || { echo "pack: the packed vlmtrain does not start" >&2; exit 1; }
unset LD_LIBRARY_PATH

torch_version=$(.venv/bin/python -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!build-gpu' || echo ' + uncommitted changes')"
  echo "packed $(date -u +%FT%TZ) on $(uname -m)"
  echo "torch $torch_version"
  (cd "$stage" && du -b bin/* lib/* stdcxx/* | sort -k2)
} > "$stage/MANIFEST"
mkdir -p "$PACK"
rm -f "$PACK/vlmtrain-gpu.tar.xz"
tar -C "$stage" -cf - MANIFEST bin lib stdcxx | xz -T0 -6 > "$PACK/vlmtrain-gpu.tar.xz"
echo "pack: $PACK/vlmtrain-gpu.tar.xz $(du -h "$PACK/vlmtrain-gpu.tar.xz" | cut -f1)" \
     "($(du -sh "$stage" | cut -f1) unpacked: $(find "$stage/lib" -mindepth 1 -maxdepth 1 | wc -l) libraries)"

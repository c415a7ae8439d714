// Fuzz target: arbitrary bytes as an image file through our pipeline: header probing
// (parse_image_header, EXIF orientation), decode_image_rgb (OpenCV + orientation + alpha),
// then smart_resize + bicubic resize + patchify (process_image) under a small token cap so
// one input costs milliseconds. Our own limits (kMaxImagePixels in data/image.h) must
// refuse absurd dimensions before anything is allocated.
#include <cstdint>
#include <optional>
#include <vector>

#include "data/image.h"
#include "data/pixel_pipeline.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Real images up to kMaxImagePixels are legitimate but take seconds under ASan; the fuzzer
// skips headers above this many pixels (scripts/fuzz.sh also sets OpenCV's own cap,
// OPENCV_IO_MAX_IMAGE_PIXELS, which OpenCV reads once when its library loads).
constexpr int64_t kFuzzMaxPixels = int64_t(1) << 22;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  const std::optional<vlm::data::ImageInfo> info = vlm::data::parse_image_header(bytes);
  (void)vlm::data::exif_orientation(bytes);
  const double pixels = info ? double(info->width) * double(info->height) : 0.0;
  if (pixels > double(kFuzzMaxPixels) && pixels <= double(vlm::data::kMaxImagePixels))
    return 0;  // legitimate but slow: see kFuzzMaxPixels
  vlm::fuzz::expect_only_vlm_errors([&] {
    cv::Mat rgb = vlm::data::decode_image_rgb(bytes, "<fuzz>");
    if (rgb.type() != CV_8UC3) __builtin_trap();
    vlm::data::PixelConfig cfg;
    cfg.max_image_tokens = 16;  // <= 16 merged tokens: 64 patches of 1176 values
    vlm::data::PixelImage px = vlm::data::process_image(rgb, cfg);
    if (px.pixel_values.size(0) != px.grid_thw[0] * px.grid_thw[1] * px.grid_thw[2]) __builtin_trap();
  });
  return 0;
}

// `vlmtrain inspect`: inspect a dataset or an image as the pipeline sees it.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "data/image.h"
#include "data/pixel_pipeline.h"
#include "vlm/check.h"
#include "vlm/image_geometry.h"

namespace vlmtrain {

const char* help_inspect() {
  return R"(usage: vlmtrain inspect data RECIPE [--set KEY=VALUE]...
       vlmtrain inspect image FILE [--min-pixels N] [--max-pixels N | --max-image-tokens N] [--json]

inspect image: decodes FILE as training does (EXIF orientation, RGB), applies smart_resize
and prints the original and resized size, grid_thw (patches) and the merged image tokens.
  --min-pixels N        default 3136 (56x56)
  --max-pixels N        default 12845056 (28x28x16384)
  --max-image-tokens N  per-image cap in merged tokens (max_pixels = N x 784)
  --json                one JSON object: original_height, original_width, resized_height,
                        resized_width, grid_thw [t,h,w], tokens, patches
)";
}

namespace {

int inspect_image(Args& args) {
  const bool as_json = args.flag("json");
  vlm::data::PixelConfig cfg;
  if (auto v = args.integer("min-pixels")) cfg.limits.min_pixels = *v;
  auto max_pixels = args.integer("max-pixels");
  auto max_tokens = args.integer("max-image-tokens");
  VLM_CHECK(!(max_pixels && max_tokens), "vlmtrain inspect image: give --max-pixels or ",
            "--max-image-tokens, not both (a token cap N is max_pixels = N x 784)");
  if (max_pixels) cfg.limits.max_pixels = *max_pixels;
  if (max_tokens) {
    VLM_CHECK(*max_tokens > 0, "vlmtrain inspect image: --max-image-tokens must be > 0, got ",
              *max_tokens);
    cfg.max_image_tokens = *max_tokens;
  }
  const std::string file = args.positional(1, "FILE");
  VLM_CHECK(args.positionals().size() == 2, "vlmtrain inspect image: expected one FILE, got ",
            args.positionals().size() - 1, " arguments");
  args.finish();

  cv::Mat rgb = vlm::data::decode_image_rgb(file);
  vlm::data::PixelImage img = vlm::data::process_image(rgb, cfg);
  const auto& g = img.grid_thw;
  if (as_json) {
    nlohmann::json j = {{"file", file},
                        {"original_height", rgb.rows},
                        {"original_width", rgb.cols},
                        {"resized_height", img.resized_height},
                        {"resized_width", img.resized_width},
                        {"grid_thw", {g[0], g[1], g[2]}},
                        {"tokens", img.merged_tokens()},
                        {"patches", img.pixel_values.size(0)}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    const vlm::PixelLimits lim = cfg.effective_limits();
    std::printf("file:           %s\n", file.c_str());
    std::printf("original:       %d x %d (h x w, after EXIF orientation)\n", rgb.rows, rgb.cols);
    std::printf("pixel limits:   min %lld, max %lld\n", static_cast<long long>(lim.min_pixels),
                static_cast<long long>(lim.max_pixels));
    std::printf("resized:        %lld x %lld\n", static_cast<long long>(img.resized_height),
                static_cast<long long>(img.resized_width));
    std::printf("grid_thw:       [%lld, %lld, %lld]\n", static_cast<long long>(g[0]),
                static_cast<long long>(g[1]), static_cast<long long>(g[2]));
    std::printf("pixel_values:   [%lld, %lld]\n",
                static_cast<long long>(img.pixel_values.size(0)),
                static_cast<long long>(img.pixel_values.size(1)));
    std::printf("merged tokens:  %lld\n", static_cast<long long>(img.merged_tokens()));
  }
  return 0;
}

}  // namespace

int cmd_inspect(Args& args) {
  const std::string what = args.positional(0, "what to inspect (data or image)");
  if (what == "image") return inspect_image(args);
  if (what == "data") not_yet("inspect data", "issue #5 (needs the recipe)");
  throw vlm::Error(vlm::str("vlmtrain inspect: unknown target '", what,
                            "'; expected `data` or `image` (see `vlmtrain inspect --help`)"));
}

}  // namespace vlmtrain

// ImageHfParity: vlmtrain's image pipeline (decode -> smart_resize -> resize -> normalise ->
// patchify) against HF transformers' Qwen2-VL image processors, produced at test time.
//
// scripts/image_reference.py (run once per process with the build's Python) writes image
// files with Pillow, one per behaviour (EXIF orientations, CMYK / progressive JPEG, alpha,
// palette transparency, 16-bit, grayscale, WebP, tiny, aspect ~200, above the pixel caps),
// and runs on each path both HF processors (tv: Qwen2VLImageProcessor, the default
// AutoImageProcessor picks; pil: Qwen2VLImageProcessorPil) plus, where both loaders are
// wrong by our judgement, the reference docs/image_parity.md names (pil_image, high_byte).
// Each case is then processed here through the C++ API (process_image_file, the loader's
// steps) and a few through `vlmtrain inspect image --pixels`.
//
// Checks: image_grid_thw equal to every processor that ran; pixel_values equal to the case's
// reference within kTol (0: bit-identical); an HF error (aspect > 200) is an error here too,
// naming the file. Measured max |diff| per processor is printed for docs/image_parity.md.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/pixel_pipeline.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/io/safetensors.h"

namespace imgparity {

// Bound on max |ours - reference| in pixel_values (normalised units; one 8-bit level is
// 1 / (255 x std) = 0.0142 to 0.0150). 0: bit-identical decode, resize and normalisation.
constexpr double kTol = 0.0;

// Cases the torchvision processor's loader decodes differently (docs/image_parity.md): it
// drops alpha and palette transparency, passes 16-bit samples through unscaled and ignores
// EXIF orientation in WebP (torchvision.io applies it to JPEG and PNG only). Elsewhere only
// its bicubic (float, one 2-D pass) differs, bounded by kTvTol.
const std::set<std::string> kTvDiverges = {"rgba_png", "la_png", "palette_trns_png",
                                           "palette_alpha_png", "gray16_png", "rgb16_png",
                                           "rgba16_png", "exif_8_webp"};
// torchvision vs Pillow bicubic: the intermediate 8-bit rounding and fixed-point weights
// differ, a few levels at most (measured 2 levels = 0.030 at most, bound 4 levels).
constexpr double kTvTol = 0.06;

struct Reference {
  std::unique_ptr<vlm::test::TempDir> dir;
  nlohmann::json manifest;
  std::string error;  // why there is none
};

Reference& reference() {
  static Reference ref = [] {
    Reference r;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const std::string python = vlm::test::python_tool("python");
      r.dir = std::make_unique<vlm::test::TempDir>("image_reference");
      const std::string script = vlm::test::source_dir() + "/scripts/image_reference.py";
      auto run = vlm::test::run({python, script, "--out", r.dir->path()}, std::chrono::seconds(240));
      if (run.exit_code != 0) {
        r.error = python + " " + script + " failed (exit " + std::to_string(run.exit_code) +
                  "; hint: the build's Python environment needs transformers, torch, "
                  "torchvision, Pillow and safetensors: scripts/install-deps.sh):\n" + run.output;
      } else {
        std::cout << run.output;
        r.manifest = nlohmann::json::parse(vlm::test::read_file(*r.dir / "manifest.json"));
      }
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    std::cout << "image_reference: "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << " s\n";
    return r;
  }();
  return ref;
}

vlm::data::PixelConfig config_of(const nlohmann::json& c) {
  vlm::data::PixelConfig cfg;
  cfg.limits.min_pixels = c["min_pixels"].get<int64_t>();
  if (c["max_image_tokens"].get<int64_t>() > 0) cfg.max_image_tokens = c["max_image_tokens"];
  else cfg.limits.max_pixels = c["max_pixels"].get<int64_t>();
  return cfg;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

std::array<int64_t, 3> grid_of(const torch::Tensor& thw) {
  auto t = thw.to(torch::kInt64).reshape({-1});
  return {t[0].item<int64_t>(), t[1].item<int64_t>(), t[2].item<int64_t>()};
}

// One case through the C++ API; returns the printed summary line.
std::string check_case(const nlohmann::json& c, const std::string& dir) {
  const std::string name = c["name"], file = dir + "/" + c["file"].get<std::string>();
  const std::string ref_name = c["reference"];
  const auto& errors = c["errors"];
  if (errors.contains(ref_name)) {  // HF refuses the image: so must we, naming the file
    EXPECT_TRUE(errors.contains("tv") && errors.contains("pil")) << errors.dump();
    try {
      vlm::data::process_image_file(file, config_of(c));
      ADD_FAILURE() << name << ": HF raised (" << errors[ref_name] << ") but vlmtrain did not";
    } catch (const vlm::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c["file"].get<std::string>()), std::string::npos) << msg;
      EXPECT_NE(msg.find("aspect ratio"), std::string::npos) << msg;
    }
    return name + ": error in HF (" + errors[ref_name].get<std::string>() + ") and vlmtrain";
  }
  EXPECT_TRUE(errors.empty()) << name << ": " << errors.dump();
  const vlm::data::PixelImage ours = vlm::data::process_image_file(file, config_of(c));
  const auto st = vlm::SafetensorsFile::open(dir + "/" + name + ".ref.safetensors");
  std::string line = name + " (" + std::to_string(ours.source_height) + "x" +
                     std::to_string(ours.source_width) + " -> grid [1, " +
                     std::to_string(ours.grid_thw[1]) + ", " + std::to_string(ours.grid_thw[2]) +
                     "], reference " + ref_name + "): max|diff|";
  std::vector<std::string> procs = {"pil", "tv"};
  if (ref_name != "pil" && ref_name != "tv") procs.push_back(ref_name);
  for (const std::string& proc : procs) {
    if (!(proc == "tv" && name == "exif_8_webp")) {  // tv leaves the WebP unrotated
      EXPECT_EQ(grid_of(st.get(proc + ".image_grid_thw")), ours.grid_thw) << name << " vs " << proc;
    }
    const double d = max_abs_diff(ours.pixel_values, st.get(proc + ".pixel_values"));
    line += " " + proc + " " + std::to_string(d);
    if (proc == ref_name) {
      EXPECT_LE(d, kTol) << name << " vs " << proc << " (reference)";
    }
    if (proc == "tv" && !kTvDiverges.count(name)) {
      EXPECT_LE(d, kTvTol) << name << " vs tv";
    }
  }
  return line;
}

TEST(ImageHfParity, EveryCaseMatchesTheReferenceProcessor) {
  Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  EXPECT_EQ(ref.manifest["transformers"], "5.23.0") << "the pinned transformers changed: "
                                                       "re-check docs/image_parity.md";
  const auto& cases = ref.manifest["cases"];
  ASSERT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::cout << check_case(c, ref.dir->path()) << "\n";
  }
}

// The command users debug their data with writes the same tensors (bit for bit) as HF's
// Pillow processor, token cap and EXIF rotation included.
TEST(ImageHfParity, InspectPixelsWritesTheReferenceTensors) {
  Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  for (const auto& c : ref.manifest["cases"]) {
    const std::string name = c["name"];
    if (name != "exif_6" && name != "over_token_cap" && name != "rgba_png") continue;
    SCOPED_TRACE(name);
    const std::string out = *ref.dir / (name + ".vlmtrain.safetensors");
    std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "inspect", "image",
                                     *ref.dir / c["file"].get<std::string>(), "--pixels", out,
                                     "--min-pixels", std::to_string(c["min_pixels"].get<int64_t>())};
    if (c["max_image_tokens"].get<int64_t>() > 0) {
      argv.insert(argv.end(), {"--max-image-tokens", std::to_string(c["max_image_tokens"].get<int64_t>())});
    } else {
      argv.insert(argv.end(), {"--max-pixels", std::to_string(c["max_pixels"].get<int64_t>())});
    }
    auto r = vlm::test::run(argv);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto ours = vlm::SafetensorsFile::open(out);
    const auto hf = vlm::SafetensorsFile::open(*ref.dir / (name + ".ref.safetensors"));
    const std::string proc = c["reference"];
    EXPECT_EQ(ours.info("pixel_values").dtype, torch::kFloat32);
    EXPECT_EQ(ours.info("image_grid_thw").dtype, torch::kInt64);
    EXPECT_EQ(ours.get("image_grid_thw").sizes(), (std::vector<int64_t>{1, 3}));
    EXPECT_TRUE(torch::equal(ours.get("image_grid_thw"), hf.get(proc + ".image_grid_thw")));
    EXPECT_EQ(max_abs_diff(ours.get("pixel_values"), hf.get(proc + ".pixel_values")), 0.0);
  }
}

}  // namespace imgparity

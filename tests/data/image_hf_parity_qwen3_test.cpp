// ImageHfParityQwen3: the image pipeline under Qwen3-VL's processor settings against HF
// transformers' Qwen2VLImageProcessorPil (the class Qwen3-VL's processor uses) built with
// Qwen3-VL's hub preprocessor_config.json values: patch 16, merge 2, temporal 2, mean/std
// 0.5, size {shortest_edge 65536, longest_edge 16777216}, bicubic.
//
// scripts/image_reference.py --processor qwen3_vl (run once per process with the build's
// Python) writes the image files and the references (see the script); a missing reference is
// a failure. Here the PixelConfig is not written by hand: it is the one vlmtrain builds for
// the qwen3-vl-2b preset (family_pixel_config: the registry's processor defaults with the
// preset's vision geometry), and the first test checks it equals what HF was given.
//
// Checks: image_grid_thw equal to both HF processors; pixel_values equal to the case's
// reference bit for bit (kTol3 = 0) and within kTvTol3 of the torchvision processor
// (decoding differences aside); an HF error (aspect > 200) is an error here too; the
// `inspect image --preset qwen3-vl-2b` and `--model DIR` (config.json + a size-style
// preprocessor_config.json) commands write the same tensors.
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
#include "data/processor_config.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/io/safetensors.h"

namespace imgparity3 {

// Bound on max |ours - reference| in pixel_values: 0, bit-identical.
constexpr double kTol3 = 0.0;
// torchvision's bicubic vs Pillow's: a few 8-bit levels; one level is 1 / (255 x 0.5) =
// 0.0078 here, so the Qwen2 bound of 4 levels becomes 0.032.
constexpr double kTvTol3 = 0.032;
// Cases whose torchvision decode differs from Pillow's (alpha dropped).
const std::set<std::string> kTvDiverges3 = {"rgba_png"};

struct Reference3 {
  std::unique_ptr<vlm::test::TempDir> dir;
  nlohmann::json manifest;
  std::string error;  // why there is none
};

Reference3& reference3() {
  static Reference3 ref = [] {
    Reference3 r;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const std::string python = vlm::test::python_tool("python");
      r.dir = std::make_unique<vlm::test::TempDir>("image_reference_qwen3");
      const std::string script = vlm::test::source_dir() + "/scripts/image_reference.py";
      auto run = vlm::test::run({python, script, "--out", r.dir->path(), "--processor", "qwen3_vl"},
                              std::chrono::seconds(240));
      if (run.exit_code != 0) {
        r.error = python + " " + script + " --processor qwen3_vl failed (exit " +
                  std::to_string(run.exit_code) +
                  "; hint: the build's Python environment needs transformers, torch, "
                  "torchvision, Pillow and safetensors: scripts/install-deps.sh):\n" + run.output;
      } else {
        std::cout << run.output;
        r.manifest = nlohmann::json::parse(vlm::test::read_file(*r.dir / "manifest.json"));
      }
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    std::cout << "image_reference (qwen3_vl): "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
    return r;
  }();
  return ref;
}

// vlmtrain's Qwen3-VL processor (from the registry), with the case's limits.
vlm::data::PixelConfig qwen3_config(const nlohmann::json& c) {
  vlm::data::PixelConfig cfg = vlm::data::family_pixel_config(vlm::preset("qwen3-vl-2b"));
  cfg.limits.min_pixels = c["min_pixels"].get<int64_t>();
  if (c["max_image_tokens"].get<int64_t>() > 0) cfg.max_image_tokens = c["max_image_tokens"];
  else cfg.limits.max_pixels = c["max_pixels"].get<int64_t>();
  return cfg;
}

double max_abs_diff3(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

std::array<int64_t, 3> grid_of3(const torch::Tensor& thw) {
  auto t = thw.to(torch::kInt64).reshape({-1});
  return {t[0].item<int64_t>(), t[1].item<int64_t>(), t[2].item<int64_t>()};
}

TEST(ImageHfParityQwen3, RegistryProcessorIsTheOneHfWasGiven) {
  Reference3& ref = reference3();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const auto& p = ref.manifest["processor"];
  const vlm::data::PixelConfig cfg = vlm::data::family_pixel_config(vlm::preset("qwen3-vl-2b"));
  EXPECT_EQ(cfg.geometry.patch_size, p["patch_size"].get<int64_t>());
  EXPECT_EQ(cfg.geometry.merge_size, p["merge_size"].get<int64_t>());
  EXPECT_EQ(cfg.geometry.temporal_patch_size, p["temporal_patch_size"].get<int64_t>());
  EXPECT_EQ(cfg.geometry.factor(), 32);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(cfg.mean[c], p["image_mean"][c].get<double>());
    EXPECT_EQ(cfg.std[c], p["image_std"][c].get<double>());
  }
  EXPECT_EQ(cfg.limits.min_pixels, 65536);
  EXPECT_EQ(cfg.limits.max_pixels, 16777216);
}

TEST(ImageHfParityQwen3, EveryCaseMatchesThePillowProcessor) {
  Reference3& ref = reference3();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  EXPECT_EQ(ref.manifest["transformers"], "5.23.0");
  const auto& cases = ref.manifest["cases"];
  ASSERT_GE(cases.size(), 12u);
  int64_t capped = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"], file = *ref.dir / c["file"].get<std::string>();
    SCOPED_TRACE(name);
    const std::string ref_name = c["reference"];
    const auto& errors = c["errors"];
    if (errors.contains(ref_name)) {  // HF refuses the image: so must we, naming the file
      try {
        vlm::data::process_image_file(file, qwen3_config(c));
        ADD_FAILURE() << "HF raised (" << errors[ref_name] << ") but vlmtrain did not";
      } catch (const vlm::Error& e) {
        EXPECT_NE(std::string(e.what()).find(c["file"].get<std::string>()), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("aspect ratio"), std::string::npos) << e.what();
      }
      continue;
    }
    ASSERT_TRUE(errors.empty()) << errors.dump();
    const vlm::data::PixelImage ours = vlm::data::process_image_file(file, qwen3_config(c));
    EXPECT_EQ(ours.pixel_values.size(1), 3 * 2 * 16 * 16);
    EXPECT_EQ(ours.resized_height % 32, 0);
    EXPECT_EQ(ours.resized_width % 32, 0);
    const auto st = vlm::SafetensorsFile::open(*ref.dir / (name + ".ref.safetensors"));
    std::string line = name + " grid [1, " + std::to_string(ours.grid_thw[1]) + ", " +
                       std::to_string(ours.grid_thw[2]) + "], " + std::to_string(ours.merged_tokens()) +
                       " tokens, max|diff|";
    std::vector<std::string> procs = {"pil", "tv"};
    if (ref_name != "pil") procs.push_back(ref_name);
    for (const std::string& proc : procs) {
      const auto hf_grid = grid_of3(st.get(proc + ".image_grid_thw"));
      EXPECT_EQ(hf_grid, ours.grid_thw) << "vs " << proc;
      EXPECT_EQ(ours.merged_tokens(), hf_grid[0] * hf_grid[1] * hf_grid[2] / 4);
      const double d = max_abs_diff3(ours.pixel_values, st.get(proc + ".pixel_values"));
      line += " " + proc + " " + std::to_string(d);
      if (proc == ref_name) {
        EXPECT_LE(d, kTol3) << "vs " << proc << " (reference)";
      }
      if (proc == "tv" && !kTvDiverges3.count(name)) {
        EXPECT_LE(d, kTvTol3) << "vs tv";
      }
    }
    if (c["max_image_tokens"].get<int64_t>() > 0) {
      ++capped;
      EXPECT_LE(ours.merged_tokens(), c["max_image_tokens"].get<int64_t>());
    }
    std::cout << line << "\n";
  }
  EXPECT_GE(capped, 2);  // the token-cap cases ran
}

// `inspect image` with the model's processor: --preset (registry defaults) and --model (an HF
// directory whose preprocessor_config.json uses the newer `size` keys) give HF's tensors.
TEST(ImageHfParityQwen3, InspectWithPresetOrModelWritesTheReferenceTensors) {
  Reference3& ref = reference3();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  vlm::test::TempDir model("qwen3_model");
  vlm::test::write_file(model / "config.json", vlm::to_hf_json(vlm::preset("qwen3-vl-2b")).dump());
  vlm::test::write_file(model / "preprocessor_config.json",
                      R"({"size": {"shortest_edge": 65536, "longest_edge": 16777216},
                          "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                          "processor_class": "Qwen3VLProcessor",
                          "image_processor_type": "Qwen2VLImageProcessorFast"})");
  int64_t checked = 0;
  for (const auto& c : ref.manifest["cases"]) {
    const std::string name = c["name"];
    if (name != "over_token_cap" && name != "exif_6" && name != "mid_png") continue;
    for (const std::string& source : {std::string("--preset"), std::string("--model")}) {
      SCOPED_TRACE(name + " " + source);
      const std::string out = *ref.dir / (name + source + ".vlmtrain.safetensors");
      std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "inspect", "image",
                                       *ref.dir / c["file"].get<std::string>(), "--pixels", out, source,
                                       source == "--preset" ? std::string("qwen3-vl-2b") : model.path()};
      if (c["max_image_tokens"].get<int64_t>() > 0)
        argv.insert(argv.end(), {"--max-image-tokens", std::to_string(c["max_image_tokens"].get<int64_t>())});
      auto r = vlm::test::run(argv);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("patch 16, merge 2 (factor 32)"), std::string::npos) << r.output;
      const auto ours = vlm::SafetensorsFile::open(out);
      const auto hf = vlm::SafetensorsFile::open(*ref.dir / (name + ".ref.safetensors"));
      EXPECT_TRUE(torch::equal(ours.get("image_grid_thw"), hf.get("pil.image_grid_thw")));
      EXPECT_EQ(max_abs_diff3(ours.get("pixel_values"), hf.get("pil.pixel_values")), 0.0);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);
}

}  // namespace imgparity3

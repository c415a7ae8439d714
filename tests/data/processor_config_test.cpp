// ProcessorConfig: the PixelConfig of a model (data/processor_config.h): the family's
// processor defaults with config.json's geometry, overridden by the model directory's
// preprocessor_config.json in both key styles, with errors that name the file.
// The expected values are the families' hub preprocessor_config.json values (Qwen2-VL-2B-
// Instruct: CLIP mean/std, min_pixels 3136, max_pixels 12845056, patch 14; Qwen3-VL-2B-
// Instruct: mean/std 0.5, size {65536, 16777216}, patch 16), written out here by hand.
#include <gtest/gtest.h>

#include <string>

#include "data/processor_config.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"

namespace {

using vlm::data::PixelConfig;

// The vlm::Error message of `f`, or "" when it does not throw.
template <class F>
std::string pc_error_of(F f) {
  try {
    f();
  } catch (const vlm::Error& e) {
    return e.what();
  }
  return "";
}

void pc_expect_contains(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty()) << "expected an error";
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(ProcessorConfig, FamilyDefaultsFollowTheRegistryAndTheVisionConfig) {
  const PixelConfig q2 = vlm::data::family_pixel_config(vlm::preset("qwen2-vl-2b"));
  EXPECT_EQ(q2.geometry.patch_size, 14);
  EXPECT_EQ(q2.geometry.factor(), 28);
  EXPECT_EQ(q2.mean, (std::array<double, 3>{0.48145466, 0.4578275, 0.40821073}));
  EXPECT_EQ(q2.std, (std::array<double, 3>{0.26862954, 0.26130258, 0.27577711}));
  EXPECT_EQ(q2.limits.min_pixels, 3136);
  EXPECT_EQ(q2.limits.max_pixels, 12845056);
  // Qwen2's registry values are the ones PixelConfig{} always had: unchanged behaviour.
  const PixelConfig plain;
  EXPECT_EQ(q2.mean, plain.mean);
  EXPECT_EQ(q2.std, plain.std);
  EXPECT_EQ(q2.limits.min_pixels, plain.limits.min_pixels);
  EXPECT_EQ(q2.limits.max_pixels, plain.limits.max_pixels);
  EXPECT_EQ(q2.geometry.factor(), plain.geometry.factor());

  const PixelConfig q25 = vlm::data::family_pixel_config(vlm::preset("qwen2.5-vl-3b"));
  EXPECT_EQ(q25.geometry.patch_size, 14);
  EXPECT_EQ(q25.mean, plain.mean);

  for (const char* name : {"qwen3-vl-2b", "qwen3-vl-8b", "tiny-qwen3"}) {
    SCOPED_TRACE(name);
    const vlm::VlmConfig cfg = vlm::preset(name);
    const PixelConfig q3 = vlm::data::family_pixel_config(cfg);
    EXPECT_EQ(q3.geometry.patch_size, cfg.vision.patch_size);
    EXPECT_EQ(q3.geometry.merge_size, cfg.vision.spatial_merge_size);
    EXPECT_EQ(q3.geometry.temporal_patch_size, cfg.vision.temporal_patch_size);
    EXPECT_EQ(q3.mean, (std::array<double, 3>{0.5, 0.5, 0.5}));
    EXPECT_EQ(q3.std, (std::array<double, 3>{0.5, 0.5, 0.5}));
    EXPECT_EQ(q3.limits.min_pixels, 65536);
    EXPECT_EQ(q3.limits.max_pixels, 16777216);
  }
  EXPECT_EQ(vlm::data::family_pixel_config(vlm::preset("qwen3-vl-2b")).geometry.factor(), 32);
  // No directory (a preset) or no file: the family's defaults.
  const vlm::VlmConfig q3cfg = vlm::preset("qwen3-vl-2b");
  vlm::test::TempDir dir("pp_none");
  for (const std::string& d : {std::string(), dir.path()}) {
    const PixelConfig px = vlm::data::model_pixel_config(q3cfg, d);
    EXPECT_EQ(px.limits.min_pixels, 65536);
    EXPECT_EQ(px.geometry.patch_size, 16);
  }
}

TEST(ProcessorConfig, ReadsBothKeyStyles) {
  const vlm::VlmConfig q3 = vlm::preset("qwen3-vl-2b");
  // Newer transformers: size {shortest_edge, longest_edge}.
  vlm::test::TempDir a("pp_size");
  vlm::test::write_file(a / "preprocessor_config.json",
                      R"({"size": {"longest_edge": 1003520, "shortest_edge": 50176},
                          "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                          "image_mean": [0.25, 0.5, 0.75], "image_std": [0.1, 0.2, 0.3],
                          "do_rescale": true, "image_processor_type": "Qwen2VLImageProcessorFast"})");
  PixelConfig px = vlm::data::model_pixel_config(q3, a.path());
  EXPECT_EQ(px.limits.min_pixels, 50176);
  EXPECT_EQ(px.limits.max_pixels, 1003520);
  EXPECT_EQ(px.mean, (std::array<double, 3>{0.25, 0.5, 0.75}));
  EXPECT_EQ(px.std, (std::array<double, 3>{0.1, 0.2, 0.3}));
  EXPECT_EQ(px.geometry.factor(), 32);

  // Older files (Qwen2-VL hub): min_pixels / max_pixels at the top level; a file with only
  // some keys keeps the family's other values.
  const vlm::VlmConfig q2 = vlm::preset("qwen2-vl-2b");
  vlm::test::TempDir b("pp_minmax");
  vlm::test::write_file(b / "preprocessor_config.json",
                      R"({"min_pixels": 6272, "max_pixels": 401408, "patch_size": 14,
                          "merge_size": 2, "temporal_patch_size": 2})");
  px = vlm::data::model_pixel_config(q2, b.path());
  EXPECT_EQ(px.limits.min_pixels, 6272);
  EXPECT_EQ(px.limits.max_pixels, 401408);
  EXPECT_EQ(px.mean, PixelConfig{}.mean);
  EXPECT_EQ(px.geometry.patch_size, 14);

  // Both present: min_pixels / max_pixels win over size, as in HF's processor.
  vlm::test::TempDir c("pp_both");
  vlm::test::write_file(c / "preprocessor_config.json",
                      R"({"min_pixels": 3136, "max_pixels": 802816,
                          "size": {"shortest_edge": 56, "longest_edge": 28}})");
  px = vlm::data::model_pixel_config(q2, c.path());
  EXPECT_EQ(px.limits.min_pixels, 3136);
  EXPECT_EQ(px.limits.max_pixels, 802816);
}

TEST(ProcessorConfig, GeometryThatDisagreesWithConfigJsonIsAnError) {
  const vlm::VlmConfig q3 = vlm::preset("qwen3-vl-2b");
  vlm::test::TempDir d("pp_patch");
  const std::string file = d / "preprocessor_config.json";
  // A Qwen2-VL preprocessor config beside a Qwen3-VL model.
  vlm::test::write_file(file, R"({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14})");
  pc_expect_contains(pc_error_of([&] { vlm::data::model_pixel_config(q3, d.path()); }),
                     {file, "'patch_size' is 14", "patch_size = 16", "hint"});
  vlm::test::write_file(file, R"({"merge_size": 4})");
  pc_expect_contains(pc_error_of([&] { vlm::data::model_pixel_config(q3, d.path()); }),
                     {file, "'merge_size' is 4", "spatial_merge_size = 2", "hint"});
  vlm::test::write_file(file, R"({"temporal_patch_size": 1})");
  pc_expect_contains(pc_error_of([&] { vlm::data::model_pixel_config(q3, d.path()); }),
                     {file, "'temporal_patch_size' is 1", "temporal_patch_size = 2"});
}

TEST(ProcessorConfig, MalformedFilesNameTheFile) {
  const vlm::VlmConfig q3 = vlm::preset("qwen3-vl-2b");
  vlm::test::TempDir d("pp_bad");
  const std::string file = d / "preprocessor_config.json";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"image_mean": [0.5, 0.5, )", "not valid JSON"},
      {R"([1, 2, 3])", "expected a JSON object"},
      {R"({"image_mean": [0.5, 0.5]})", "'image_mean': expected a list of 3 numbers"},
      {R"({"image_std": [0.5, 0, 0.5]})", "'image_std'[1]: expected a positive number"},
      {R"({"image_mean": [0.5, "x", 0.5]})", "'image_mean'[1]: expected a number"},
      {R"({"size": 224})", "'size': expected an object"},
      {R"({"size": {"shortest_edge": -1}})", "'shortest_edge': expected a positive integer"},
      {R"({"max_pixels": 1.5})", "'max_pixels': expected a positive integer"},
      {R"({"min_pixels": 1000000, "max_pixels": 65536})", "is larger than max_pixels"},
  };
  for (const auto& [text, what] : bad) {
    SCOPED_TRACE(text);
    vlm::test::write_file(file, text);
    pc_expect_contains(pc_error_of([&] { vlm::data::model_pixel_config(q3, d.path()); }), {file, what});
  }
}

}  // namespace

// DataOptions: the recipe + the model -> data/'s options (app/config/data_options.h). The pixel
// config and the default system turn follow the model's family (registry) and its HF
// directory's preprocessor_config.json; the recipe's data.min_pixels / max_pixels (0 = the
// model's), max_image_tokens and system_prompt apply on top. Expected values are the hub
// files' (Qwen2-VL: CLIP, 3136 .. 12845056, patch 14, "You are a helpful assistant.";
// Qwen3-VL: 0.5, 65536 .. 16777216, patch 16, no system turn), written out by hand.
#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>

#include <algorithm>

#include "app/config/data_options.h"
#include "data/processor_config.h"
#include "data/sample_builder.h"
#include "tests/app/eval/eval_fixture.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"

namespace {

// recipes/ocr_tiny.toml with data.system_prompt unset ("": the family's default) unless an
// override sets it.
vlm::app::Recipe data_options_recipe(std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.begin(), "data.system_prompt=\"\"");
  return vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/ocr_tiny.toml", overrides);
}

TEST(DataOptions, Qwen2ModelKeepsTheQwen2Processor) {
  const vlm::app::Recipe r = data_options_recipe();
  EXPECT_EQ(r.data.min_pixels, 0);  // unset: the model's
  EXPECT_EQ(r.data.max_pixels, 0);
  const vlm::data::PixelConfig px = vlm::app::pixel_config(r, vlm::preset("tiny"));
  const vlm::data::PixelConfig plain;  // what every command used before families
  EXPECT_EQ(px.geometry.factor(), 28);
  EXPECT_EQ(px.mean, plain.mean);
  EXPECT_EQ(px.std, plain.std);
  EXPECT_EQ(px.limits.min_pixels, 3136);
  EXPECT_EQ(px.limits.max_pixels, 12845056);
  EXPECT_EQ(px.max_image_tokens, r.data.max_image_tokens);
  const vlm::data::SampleOptions so = vlm::app::sample_options(r, vlm::preset("tiny"));
  EXPECT_EQ(so.default_system, "You are a helpful assistant.");
  EXPECT_EQ(vlm::data::chat_options(so).default_system, vlm::ChatOptions{}.default_system);
}

TEST(DataOptions, Qwen3PresetGetsPatch16HalfMeanAndNoSystemTurn) {
  const vlm::app::Recipe r = data_options_recipe({"data.max_image_tokens=100"});
  const vlm::VlmConfig cfg = vlm::preset("qwen3-vl-2b");
  const vlm::data::PixelConfig px = vlm::app::pixel_config(r, cfg);
  EXPECT_EQ(px.geometry.patch_size, 16);
  EXPECT_EQ(px.geometry.factor(), 32);
  EXPECT_EQ(px.mean, (std::array<double, 3>{0.5, 0.5, 0.5}));
  EXPECT_EQ(px.std, (std::array<double, 3>{0.5, 0.5, 0.5}));
  EXPECT_EQ(px.limits.min_pixels, 65536);
  EXPECT_EQ(px.limits.max_pixels, 16777216);
  EXPECT_EQ(px.effective_limits().max_pixels, 100 * 32 * 32);
  const vlm::data::SampleOptions so = vlm::app::sample_options(r, cfg);
  EXPECT_EQ(so.default_system, "");
  EXPECT_EQ(vlm::data::chat_options(so).default_system, "");
  // The recipe's system prompt still wins; "none" stays none for Qwen2.
  const vlm::app::Recipe own = data_options_recipe({"data.system_prompt=\"You read text.\""});
  EXPECT_EQ(vlm::data::chat_options(vlm::app::sample_options(own, cfg)).default_system, "You read text.");
  const vlm::app::Recipe none = data_options_recipe({"data.system_prompt=\"none\""});
  EXPECT_EQ(vlm::data::chat_options(vlm::app::sample_options(none, vlm::preset("tiny"))).default_system, "");
}

TEST(DataOptions, HfDirectoryPreprocessorThenRecipeOverrides) {
  vlm::test::TempDir dir("data_options_hf");
  vlm::test::write_file(dir / "config.json", vlm::to_hf_json(vlm::preset("qwen3-vl-2b")).dump());
  vlm::test::write_file(dir / "preprocessor_config.json",
                      R"({"size": {"shortest_edge": 131072, "longest_edge": 1003520},
                          "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})");
  const vlm::VlmConfig cfg = vlm::load_hf_config(dir.path());
  vlm::app::Recipe r = data_options_recipe({"model.preset=\"\"", "model.path=\"" + dir.path() + "\"",
                                            "data.max_image_tokens=1024"});
  vlm::data::PixelConfig px = vlm::app::pixel_config(r, cfg);
  EXPECT_EQ(px.geometry.factor(), 32);
  EXPECT_EQ(px.limits.min_pixels, 131072);
  EXPECT_EQ(px.limits.max_pixels, 1003520);
  // recipe_model_config reads the same directory.
  EXPECT_EQ(vlm::app::recipe_model_config(r).vision.patch_size, 16);
  // The recipe's bounds win over the file's.
  r = data_options_recipe({"model.preset=\"\"", "model.path=\"" + dir.path() + "\"",
                           "data.min_pixels=70000", "data.max_pixels=500000", "data.max_image_tokens=1024"});
  px = vlm::app::pixel_config(r, cfg);
  EXPECT_EQ(px.limits.min_pixels, 70000);
  EXPECT_EQ(px.limits.max_pixels, 500000);
  // A preset ignores model.path's processor (there is none for a preset).
  r = data_options_recipe({"model.preset=\"qwen3-vl-2b\"", "model.path=\"" + dir.path() + "\""});
  EXPECT_EQ(vlm::app::pixel_config(r, cfg).limits.min_pixels, 65536);
}

TEST(DataOptions, TokenCapBelowTheModelsMinPixelsIsAnError) {
  // 10 tokens x 1024 pixels < Qwen3-VL's 65536 (fine for Qwen2-VL: 10 x 784 >= 3136).
  const vlm::app::Recipe r = data_options_recipe({"data.max_image_tokens=10"});
  EXPECT_NO_THROW(vlm::app::pixel_config(r, vlm::preset("tiny")));
  try {
    vlm::app::pixel_config(r, vlm::preset("qwen3-vl-2b"));
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("data.max_image_tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("at least 64"), std::string::npos) << m;
  }
  const vlm::app::Recipe swapped = data_options_recipe({"data.min_pixels=20000000"});
  EXPECT_THROW(vlm::app::pixel_config(swapped, vlm::preset("qwen3-vl-2b")), vlm::Error);
}

// End to end through data/: a Qwen3-VL sample has 32-px merged tokens, 1536-wide patches
// (3 x 2 x 16 x 16) normalised with mean/std 0.5, and no system turn.
TEST(DataOptions, Qwen3SampleThroughTheLoaderPath) {
  vlm::test::TempDir dir("data_options_sample");
  cv::Mat bgr(333, 517, CV_8UC3, cv::Scalar(40, 120, 200));
  ASSERT_TRUE(cv::imwrite(dir / "a.png", bgr));
  vlm::data::Record rec;
  rec.turns = {{"user", "<image>Read."}, {"assistant", "hello"}};
  rec.images = {{dir / "a.png", 517, 333}};
  const vlm::app::Recipe r = data_options_recipe({"data.max_image_tokens=77"});
  ASSERT_EQ(r.data.system_prompt, "");
  const vlm::VlmConfig cfg = vlm::preset("qwen3-vl-2b");
  auto tok = vlm::test::tiny_tokenizer();
  const auto s = vlm::data::load_sample(*tok, rec, vlm::app::pixel_config(r, cfg),
                                        vlm::app::sample_options(r, cfg));
  ASSERT_EQ(s.grid_thw.size(), 1u);
  // HF (Qwen2VLImageProcessorPil, patch 16, cap 77 x 1024 pixels): grid [1, 14, 20], 70 tokens.
  EXPECT_EQ(s.grid_thw[0], (std::array<int64_t, 3>{1, 14, 20}));
  EXPECT_EQ(s.pixel_values.sizes(), (std::vector<int64_t>{280, 1536}));
  // Every pixel is RGB (200, 120, 40) after the resize: (v / 255 - 0.5) / 0.5.
  EXPECT_FLOAT_EQ(s.pixel_values[0][0].item<float>(), (200.0f / 255.0f - 0.5f) / 0.5f);
  const int64_t pad = tok->special_id("<|image_pad|>");
  EXPECT_EQ(std::count(s.input_ids.begin(), s.input_ids.end(), pad), 70);
  const std::string text = tok->decode(s.input_ids);
  EXPECT_EQ(text.rfind("<|im_start|>user\n<|vision_start|>", 0), 0u) << text;
  EXPECT_EQ(text.find("system"), std::string::npos) << text;
}

}  // namespace

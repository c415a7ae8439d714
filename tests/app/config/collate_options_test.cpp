// The recipe's budgets reach the step plan: a recipe-level cap changes the plan.
#include <gtest/gtest.h>

#include "app/config/collate_options.h"
#include "app/config/data_options.h"
#include "tests/testing.h"

namespace {

TEST(CollateOptions, RecipeBudgetsDriveTheStepPlan) {
  auto r = vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/ocr_tiny.toml",
                                 {"data.max_image_tokens=100", "batch.max_tokens=500",
                                  "batch.max_image_tokens=300", "data.max_seq_len=400",
                                  "batch.max_micro_batches=7", "data.min_pixels=1568"});
  auto b = vlm::app::collate_budgets(r, vlm::app::pixel_config(r, vlm::preset("tiny")));
  EXPECT_EQ(b.factor, 28);
  EXPECT_EQ(b.max_image_tokens, 100);
  EXPECT_EQ(b.max_tokens, 500);
  EXPECT_EQ(b.batch_image_tokens, 300);
  EXPECT_EQ(b.max_seq_len, 400);
  EXPECT_EQ(b.max_micro_batches, 7);
  EXPECT_FALSE(b.packing);  // batch.packing defaults to false
  EXPECT_TRUE(vlm::app::collate_budgets(vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/ocr_tiny.toml",
                                                              {"batch.packing=true"}),
                                        vlm::app::pixel_config(r, vlm::preset("tiny")))
                  .packing);
  EXPECT_EQ(b.pixels.min_pixels, 1568);
  EXPECT_EQ(r.data.max_pixels, 0);            // unset: the model's (Qwen2-VL's hub value)
  EXPECT_EQ(b.pixels.max_pixels, 12845056);

  // A 480x640 image is 391 tokens uncapped; under data.max_image_tokens = 100 it is capped.
  auto plan = vlm::collate::plan_step({{0, 20, {{480, 640}}}}, 1, b);
  ASSERT_EQ(plan.ranks[0].micro_batches.size(), 1u);
  const auto& s = plan.ranks[0].micro_batches[0].samples.at(0);
  EXPECT_LE(s.image_tokens, 100);
  EXPECT_GT(s.image_tokens, 80);
}

// A Qwen3-VL model's budgets: its resize factor (32) and pixel defaults reach the plan.
TEST(CollateOptions, Qwen3ModelBudgetsUseItsFactor) {
  auto r = vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/ocr_tiny.toml",
                                 {"data.max_image_tokens=100"});
  auto b = vlm::app::collate_budgets(r, vlm::app::pixel_config(r, vlm::preset("qwen3-vl-2b")));
  EXPECT_EQ(b.factor, 32);
  EXPECT_EQ(b.pixels.min_pixels, 65536);
  EXPECT_EQ(b.pixels.max_pixels, 16777216);
  // 480 x 640 is 15 x 20 = 300 tokens at factor 32; capped at 100: sides multiples of 32.
  auto plan = vlm::collate::plan_step({{0, 20, {{480, 640}}}}, 1, b);
  const auto& s = plan.ranks[0].micro_batches[0].samples.at(0);
  EXPECT_LE(s.image_tokens, 100);
  EXPECT_GT(s.image_tokens, 80);
  EXPECT_EQ(s.images[0].resized.height % 32, 0);
  EXPECT_EQ(s.images[0].resized.width % 32, 0);
  EXPECT_EQ(s.image_tokens, (s.images[0].resized.height / 32) * (s.images[0].resized.width / 32));
}

}  // namespace

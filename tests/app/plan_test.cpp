// `vlmtrain plan --preset` as a real subprocess: parameter totals of the real presets
// against the published figure (REFERENCE.md: Qwen2-VL-2B = 2,208,985,600).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace {

nlohmann::json plan_json(const std::string& preset) {
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "plan", "--preset", preset, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(Plan, Qwen2Vl2bTotalsMatchPublishedCounts) {
  auto j = plan_json("qwen2-vl-2b");
  EXPECT_EQ(j["total_params"].get<int64_t>(), 2208985600LL);
  EXPECT_EQ(j["vision_params"].get<int64_t>(), 665271296LL);
  EXPECT_EQ(j["merger_params"].get<int64_t>(), 34087936LL);
  EXPECT_EQ(j["llm_params"].get<int64_t>(), 1543714304LL);
  // The module rows add up to the total (the tied head owns nothing).
  int64_t sum = 0;
  for (const auto& m : j["modules"]) sum += m["params"].get<int64_t>();
  EXPECT_EQ(sum, 2208985600LL);
  EXPECT_EQ(j["modules"].front()["path"], "visual.patch_embed");
  EXPECT_EQ(j["modules"].back()["path"], "lm_head");
}

TEST(Plan, HumanTableShowsTotal) {
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "plan", "--preset", "qwen2-vl-2b"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2,208,985,600"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.layers.27"), std::string::npos);
}

TEST(Plan, SevenBPresetPlansWithoutMemory) {
  // Building 8B parameters for real would need > 16 GB; on meta it is instant.
  auto j = plan_json("qwen2.5-vl-7b");
  EXPECT_GT(j["total_params"].get<int64_t>(), 8000000000LL);
}

TEST(Plan, UnknownPresetFailsWithList) {
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "plan", "--preset", "nope"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("qwen2-vl-2b"), std::string::npos) << r.output;
}

TEST(Plan, RecipeNotWiredYetIsAClearError) {
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "plan", "some.toml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--preset"), std::string::npos) << r.output;
}

}  // namespace

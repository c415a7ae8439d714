// `vlmtrain inspect image`: sizes, grid and tokens as the spec's smart_resize table says.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "tests/testing.h"
#include "vlm/image_geometry.h"

namespace {

using vlmtest::last_json_line;

TEST(InspectImage, JsonMatchesSpecTable) {
  vlmtest::TempDir dir("inspect");
  ASSERT_TRUE(cv::imwrite(dir / "a.png", cv::Mat(480, 640, CV_8UC3, cv::Scalar(1, 2, 3))));
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "inspect", "image", "--json", dir / "a.png"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["resized_height"], 476);
  EXPECT_EQ(j["resized_width"], 644);
  EXPECT_EQ(j["grid_thw"], nlohmann::json({1, 34, 46}));
  EXPECT_EQ(j["tokens"], 391);
  EXPECT_EQ(j["patches"], 34 * 46);

  r = vlmtest::run({vlmtest::vlmtrain_bin(), "inspect", "image", dir / "a.png",
                    "--max-image-tokens", "100", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = last_json_line(r.output);
  auto want = vlm::smart_resize(480, 640, {3136, 100 * 784});
  EXPECT_EQ(j["resized_height"], want.height);
  EXPECT_EQ(j["resized_width"], want.width);
  EXPECT_LE(j["tokens"].get<int64_t>(), 100);

  r = vlmtest::run({vlmtest::vlmtrain_bin(), "inspect", "image", dir / "a.png",
                    "--min-pixels", "1000000"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto big = vlm::smart_resize(480, 640, {1000000, 12845056});
  EXPECT_NE(r.output.find("resized:        " + std::to_string(big.height) + " x " +
                          std::to_string(big.width)),
            std::string::npos)
      << r.output;
}

TEST(InspectImage, Errors) {
  vlmtest::TempDir dir("inspect");
  ASSERT_TRUE(cv::imwrite(dir / "a.png", cv::Mat(30, 30, CV_8UC3)));
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "inspect", "image", dir / "a.png",
                         "--max-pixels", "100000", "--max-image-tokens", "10"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not both"), std::string::npos) << r.output;
  r = vlmtest::run({vlmtest::vlmtrain_bin(), "inspect", "image", dir / "missing.png"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing.png"), std::string::npos) << r.output;
  r = vlmtest::run({vlmtest::vlmtrain_bin(), "inspect", "data", dir / "no_recipe.toml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no_recipe.toml"), std::string::npos) << r.output;  // inspect_data_test.cpp
}

}  // namespace

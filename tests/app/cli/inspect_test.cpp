// `vlmtrain inspect image`: sizes, grid and tokens as the spec's smart_resize table says.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "data/pixel_pipeline.h"
#include "tests/testing.h"
#include "vlm/model/image_geometry.h"
#include "vlm/io/safetensors.h"

namespace {

using vlm::test::last_json_line;

TEST(InspectImage, JsonMatchesSpecTable) {
  vlm::test::TempDir dir("inspect");
  ASSERT_TRUE(cv::imwrite(dir / "a.png", cv::Mat(480, 640, CV_8UC3, cv::Scalar(1, 2, 3))));
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", "--json", dir / "a.png"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["resized_height"], 476);
  EXPECT_EQ(j["resized_width"], 644);
  EXPECT_EQ(j["grid_thw"], nlohmann::json({1, 34, 46}));
  EXPECT_EQ(j["tokens"], 391);
  EXPECT_EQ(j["patches"], 34 * 46);

  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", dir / "a.png",
                    "--max-image-tokens", "100", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = last_json_line(r.output);
  auto want = vlm::smart_resize(480, 640, {3136, 100 * 784});
  EXPECT_EQ(j["resized_height"], want.height);
  EXPECT_EQ(j["resized_width"], want.width);
  EXPECT_LE(j["tokens"].get<int64_t>(), 100);

  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", dir / "a.png",
                    "--min-pixels", "1000000"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto big = vlm::smart_resize(480, 640, {1000000, 12845056});
  EXPECT_NE(r.output.find("resized:        " + std::to_string(big.height) + " x " +
                          std::to_string(big.width)),
            std::string::npos)
      << r.output;
}

// --pixels writes what the loader's code path (process_image_file) gives the model, with the
// dtypes and shapes the model takes; the values against HF are tests/data/image_hf_parity_test.
TEST(InspectImage, PixelsFileHoldsTheModelInputs) {
  vlm::test::TempDir dir("inspect");
  cv::Mat bgr(150, 100, CV_8UC3);
  cv::randu(bgr, 0, 256);
  ASSERT_TRUE(cv::imwrite(dir / "b.png", bgr));
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", dir / "b.png", "--pixels",
                         dir / "b.safetensors", "--max-image-tokens", "10", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["pixels"], dir / "b.safetensors");
  auto st = vlm::SafetensorsFile::open(dir / "b.safetensors");
  EXPECT_EQ(st.names().size(), 2u);
  EXPECT_EQ(st.info("pixel_values").dtype, torch::kFloat32);
  EXPECT_EQ(st.info("image_grid_thw").dtype, torch::kInt64);
  vlm::data::PixelConfig cfg;
  cfg.max_image_tokens = 10;
  auto want = vlm::data::process_image_file(dir / "b.png", cfg);
  EXPECT_LE(want.merged_tokens(), 10);
  EXPECT_TRUE(torch::equal(st.get("pixel_values"), want.pixel_values));
  EXPECT_EQ(st.get("pixel_values").sizes(), (std::vector<int64_t>{j["patches"].get<int64_t>(), 1176}));
  auto thw = st.get("image_grid_thw");
  ASSERT_EQ(thw.sizes(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(nlohmann::json({thw[0][0].item<int64_t>(), thw[0][1].item<int64_t>(),
                            thw[0][2].item<int64_t>()}),
            j["grid_thw"]);
}

TEST(InspectImage, Errors) {
  vlm::test::TempDir dir("inspect");
  ASSERT_TRUE(cv::imwrite(dir / "a.png", cv::Mat(30, 30, CV_8UC3)));
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", dir / "a.png",
                         "--max-pixels", "100000", "--max-image-tokens", "10"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not both"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", dir / "missing.png"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing.png"), std::string::npos) << r.output;
  // Aspect ratio above 200 is refused, as HF refuses it, naming the file.
  ASSERT_TRUE(cv::imwrite(dir / "thin.png", cv::Mat(10, 2010, CV_8UC3, cv::Scalar(9, 9, 9))));
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", dir / "thin.png", "--pixels",
                    dir / "thin.safetensors"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("thin.png"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("aspect ratio"), std::string::npos) << r.output;
  EXPECT_FALSE(vlm::test::file_exists(dir / "thin.safetensors"));
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", dir / "no_recipe.toml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no_recipe.toml"), std::string::npos) << r.output;  // inspect_data_test.cpp
}

}  // namespace

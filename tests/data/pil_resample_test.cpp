// The fast image paths give the bytes of the plain ones: the AVX2 resampler equals the
// scalar transcription of Pillow's loops, and the direct libjpeg decode equals OpenCV's.
// The reduced-size JPEG decode (opt-in) keeps HF's target size and stays close in value.
#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/pil_resample.h"
#include "data/pixel_pipeline.h"

namespace {

cv::Mat random_rgb(int h, int w, uint64_t seed) {
  cv::Mat m(h, w, CV_8UC3);
  cv::RNG rng(seed);
  rng.fill(m, cv::RNG::UNIFORM, 0, 256);
  return m;
}

bool same_bytes(const cv::Mat& a, const cv::Mat& b) {
  if (a.size() != b.size() || a.type() != b.type()) return false;
  cv::Mat d;
  cv::absdiff(a, b, d);
  return cv::countNonZero(d.reshape(1)) == 0;
}

TEST(PilResample, FastPathEqualsReferenceBitForBit) {
  if (!vlm::data::resize_uses_avx2()) std::puts("no AVX2 here: both calls take the reference");
  // Sides not multiples of the 16-row tiles or 32-byte blocks; down, up, one axis, extreme.
  cv::Mat stripes(97, 211, CV_8UC3);
  for (int y = 0; y < stripes.rows; ++y)
    for (int x = 0; x < stripes.cols; ++x)
      stripes.at<cv::Vec3b>(y, x) = (x + y) % 2 ? cv::Vec3b(255, 0, 255) : cv::Vec3b(0, 255, 0);
  struct Case { cv::Mat img; int h, w; };
  const std::vector<Case> cases = {
      {random_rgb(17, 5, 1), 28, 56},      {random_rgb(33, 47, 2), 28, 28},
      {random_rgb(100, 150, 3), 112, 140}, {random_rgb(301, 419, 4), 56, 420},
      {random_rgb(301, 419, 5), 301, 84},  {random_rgb(1000, 37, 6), 112, 28},
      {random_rgb(640, 480, 7), 476, 644}, {random_rgb(2, 3000, 8), 28, 252},
      {stripes, 28, 56},                   {stripes, 196, 420}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.img.rows) + "x" + std::to_string(c.img.cols) + " -> " +
                 std::to_string(c.h) + "x" + std::to_string(c.w));
    const cv::Mat fast = vlm::data::resize_bicubic_aa(c.img, c.h, c.w);
    const cv::Mat ref = vlm::data::resize_bicubic_aa_reference(c.img, c.h, c.w);
    EXPECT_TRUE(same_bytes(fast, ref));
  }
}

std::string write_temp(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                               static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Gradients and text: smooth areas and edges for JPEG's blocks.
cv::Mat photo_like(int h, int w) {
  cv::Mat img(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      img.at<cv::Vec3b>(y, x) = cv::Vec3b(uchar(x * 255 / w), uchar(y * 255 / h), 96);
  for (int y = 50; y < h; y += 70)
    cv::putText(img, "Quick brown fox 42", {15, y}, cv::FONT_HERSHEY_SIMPLEX, 1.2, {10, 10, 10}, 2);
  return img;
}

TEST(PilResample, DirectJpegDecodeEqualsOpenCv) {
  for (int q : {75, 95}) {
    std::vector<uint8_t> jpg;
    cv::imencode(".jpg", photo_like(123, 301), jpg, {cv::IMWRITE_JPEG_QUALITY, q});
    cv::Mat bgr = cv::imdecode(jpg, cv::IMREAD_COLOR), rgb;
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
    EXPECT_TRUE(same_bytes(vlm::data::decode_image_rgb(jpg, "q" + std::to_string(q)), rgb));
  }
}

TEST(PilResample, ReducedJpegDecodeKeepsTargetAndStaysClose) {
  std::vector<uint8_t> jpg, png;
  const cv::Mat bgr = photo_like(1200, 1600);
  cv::imencode(".jpg", bgr, jpg, {cv::IMWRITE_JPEG_QUALITY, 92});
  cv::imencode(".png", bgr, png);
  const std::string jpg_path = write_temp("reduced_decode.jpg", jpg);
  vlm::data::PixelConfig cfg;
  cfg.max_image_tokens = 256;  // 1200x1600 -> 476x644: at most 1/2 of the source
  const vlm::data::PixelImage full = vlm::data::process_image_file(jpg_path, cfg);
  EXPECT_EQ(vlm::data::jpeg_decode_scale(jpg, cfg), 1);  // off by default
  cfg.jpeg_reduced_decode = true;
  EXPECT_EQ(vlm::data::jpeg_decode_scale(jpg, cfg), 2);
  EXPECT_EQ(vlm::data::jpeg_decode_scale(png, cfg), 1);  // JPEG only
  const vlm::data::PixelImage reduced = vlm::data::process_image_file(jpg_path, cfg);
  EXPECT_EQ(reduced.grid_thw, full.grid_thw);
  EXPECT_EQ(reduced.resized_height, full.resized_height);
  EXPECT_EQ(reduced.source_height, 600);  // what was decoded
  ASSERT_EQ(reduced.pixel_values.sizes(), full.pixel_values.sizes());
  const double mean_abs = (reduced.pixel_values - full.pixel_values).abs().mean().item<double>();
  EXPECT_GT(mean_abs, 0.0);   // not HF's pixels
  EXPECT_LT(mean_abs, 0.05);  // but close: normalised units (1 level = 1/255/std ~ 0.015)
  cfg.max_image_tokens = 0;   // uncapped: 1204x1596 is not under half the source
  EXPECT_EQ(vlm::data::jpeg_decode_scale(jpg, cfg), 1);
  std::remove(jpg_path.c_str());
}

}  // namespace

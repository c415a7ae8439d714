// smart_resize against the spec's table and an independent re-implementation of the
// formula (std::nearbyint under the default round-to-nearest-even mode).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "vlm/runtime/check.h"
#include "vlm/model/image_geometry.h"

namespace {

struct Case { int64_t H, W, max_pixels, h, w, tokens; };

TEST(ImageGeometry, SpecTable) {
  const Case cases[] = {
      {480, 640, 12845056, 476, 644, 391},
      {1080, 1920, 12845056, 1092, 1932, 2691},
      {4000, 6000, 12845056, 2912, 4368, 16224},
      {70, 70, 12845056, 56, 56, 4},
      {350, 350, 12845056, 336, 336, 144},
  };
  for (const Case& c : cases) {
    vlm::PixelLimits lim{3136, c.max_pixels};
    vlm::ImageSize s = vlm::smart_resize(c.H, c.W, lim);
    EXPECT_EQ(s.height, c.h) << c.H << "x" << c.W;
    EXPECT_EQ(s.width, c.w) << c.H << "x" << c.W;
    EXPECT_EQ(vlm::merged_tokens(s.height, s.width), c.tokens);
    EXPECT_EQ(vlm::image_tokens(c.H, c.W, lim), c.tokens);
  }
}

// Independent implementation: Python semantics written the obvious way.
vlm::ImageSize reference(int64_t H, int64_t W, int64_t minp, int64_t maxp) {
  const double f = 28;
  int64_t h = (int64_t)std::nearbyint(H / f) * 28;
  int64_t w = (int64_t)std::nearbyint(W / f) * 28;
  if ((double)h * w > maxp) {
    double beta = std::sqrt((double)H * W / maxp);
    h = std::max<int64_t>(28, (int64_t)std::floor(H / beta / f) * 28);
    w = std::max<int64_t>(28, (int64_t)std::floor(W / beta / f) * 28);
  } else if ((double)h * w < minp) {
    double beta = std::sqrt((double)minp / ((double)H * W));
    h = (int64_t)std::ceil(H * beta / f) * 28;
    w = (int64_t)std::ceil(W * beta / f) * 28;
  }
  return {h, w};
}

TEST(ImageGeometry, RandomSizesMatchIndependentFormula) {
  std::mt19937_64 rng(1234);
  int checked = 0, halves = 0;
  for (int i = 0; i < 600; ++i) {
    int64_t H = 1 + (int64_t)(rng() % 5000), W = 1 + (int64_t)(rng() % 5000);
    if (i % 5 == 0) H = 14 + 28 * (int64_t)(rng() % 100);  // exact .5 cases
    if (std::max(H, W) > 200 * std::min(H, W)) continue;
    int64_t caps[] = {0, 64, 256, 1024, 16384};
    vlm::PixelLimits lim = vlm::limits_with_token_cap({3136, 12845056}, caps[rng() % 5]);
    vlm::ImageSize got = vlm::smart_resize(H, W, lim);
    vlm::ImageSize ref = reference(H, W, lim.min_pixels, lim.max_pixels);
    ASSERT_EQ(got.height, ref.height) << H << "x" << W << " max " << lim.max_pixels;
    ASSERT_EQ(got.width, ref.width) << H << "x" << W << " max " << lim.max_pixels;
    EXPECT_EQ(got.height % 28, 0);
    EXPECT_EQ(got.width % 28, 0);
    EXPECT_LE(got.height * got.width, std::max<int64_t>(lim.max_pixels, 28 * 28 * 200));
    if (H % 28 == 14) ++halves;
    ++checked;
  }
  EXPECT_GT(checked, 400);
  EXPECT_GT(halves, 50);
}

TEST(ImageGeometry, TokenCapIsMaxPixels) {
  EXPECT_EQ(vlm::max_pixels_for_tokens(1024), 1024 * 784);
  // A cap of N merged tokens never yields more than N tokens, except where the short
  // side is clamped to 28 (reference behaviour for very elongated images): then the image
  // is a single row of merged tokens and the long side still shrinks.
  int clamped = 0;
  for (int64_t cap : {4, 16, 100, 391, 1000}) {
    auto lim = vlm::limits_with_token_cap({}, cap);
    for (int64_t H : {100, 480, 1080, 3000})
      for (int64_t W : {100, 640, 1920, 4000}) {
        vlm::ImageSize s = vlm::smart_resize(H, W, lim);
        const int64_t tokens = vlm::image_tokens(H, W, lim);
        if (std::min(s.height, s.width) == 28 && tokens > cap) {
          ++clamped;
          EXPECT_LT(std::max(s.height, s.width), std::max(H, W)) << H << "x" << W;
        } else {
          EXPECT_LE(tokens, cap) << H << "x" << W << " cap " << cap;
        }
      }
  }
  EXPECT_GT(clamped, 0);  // the exception really occurs (e.g. 100x640 with cap 4)
  EXPECT_THROW(vlm::limits_with_token_cap({3136, 12845056}, 3), vlm::Error);
}

TEST(ImageGeometry, RejectsBadInput) {
  EXPECT_THROW(vlm::smart_resize(0, 100), vlm::Error);
  EXPECT_THROW(vlm::smart_resize(10, 2100), vlm::Error);    // aspect 210
  EXPECT_NO_THROW(vlm::smart_resize(10, 2000));             // aspect 200 is allowed
  EXPECT_THROW(vlm::merged_tokens(30, 28), vlm::Error);
}

TEST(ImageGeometry, GridThw) {
  auto g = vlm::image_grid_thw(476, 644);
  EXPECT_EQ(g[0], 1);
  EXPECT_EQ(g[1], 34);
  EXPECT_EQ(g[2], 46);
  EXPECT_EQ(g[0] * g[1] * g[2] / 4, 391);
}

}  // namespace

// LrSchedule against the formulas written out in lr_schedule.h, step by step.
#include <gtest/gtest.h>

#include <cmath>

#include "app/train/lr_schedule.h"

using vlm::app::LrSchedule;

TEST(LrSchedule, WarmupIsLinearAndReachesOne) {
  LrSchedule s{100, 10, "cosine", 0.1};
  for (int64_t k = 0; k < 10; ++k) EXPECT_DOUBLE_EQ(s.factor(k), (k + 1) / 10.0);
  EXPECT_DOUBLE_EQ(s.factor(10), 1.0);  // decay starts at p = 0
}

TEST(LrSchedule, CosineLinearConstantDecay) {
  const double r = 0.1;
  for (int64_t k = 10; k < 100; ++k) {
    const double p = (k - 10) / 90.0;
    EXPECT_NEAR((LrSchedule{100, 10, "cosine", r}.factor(k)), r + (1 - r) * 0.5 * (1 + std::cos(M_PI * p)), 1e-15);
    EXPECT_NEAR((LrSchedule{100, 10, "linear", r}.factor(k)), r + (1 - r) * (1 - p), 1e-15);
    EXPECT_EQ((LrSchedule{100, 10, "constant", r}.factor(k)), 1.0);
  }
  // Past the end the floor holds.
  EXPECT_NEAR((LrSchedule{100, 10, "cosine", r}.factor(150)), r, 1e-15);
}

TEST(LrSchedule, NoWarmupAndBadDecay) {
  EXPECT_DOUBLE_EQ((LrSchedule{10, 0, "cosine", 0.0}.factor(0)), 1.0);
  EXPECT_THROW((LrSchedule{10, 0, "exp", 0.0}.factor(3)), std::exception);
}

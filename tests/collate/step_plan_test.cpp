// Step plan properties over random datasets at world sizes 1-8 (issue #6): equal
// micro-batch counts, budgets respected, every sample exactly once or skipped with a
// reason, balanced cost (LPT bound), images downscaled rather than dropped, and the same
// plan in another process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <random>
#include <sstream>

#include "collate/step_plan.h"

using namespace vlm::collate;

namespace {

// A random sample mix: text-only, 1-8 images, extreme aspect ratios, 100 MP images, long texts.
std::vector<SampleCost> random_samples(std::mt19937_64& rng, int n) {
  std::vector<SampleCost> out;
  auto uni = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % (hi - lo + 1)); };
  for (int i = 0; i < n; ++i) {
    SampleCost s;
    s.index = 1000 + i;
    int kind = static_cast<int>(uni(0, 9));
    s.text_tokens = kind == 9 ? uni(1500, 6000) : uni(8, 300);
    int n_images = kind <= 2 ? 0 : kind <= 6 ? 1 : static_cast<int>(uni(2, 8));
    for (int j = 0; j < n_images; ++j) {
      int shape = static_cast<int>(uni(0, 9));
      if (shape == 0) s.images.push_back({10000, 10000});                 // 100 MP
      else if (shape == 1) s.images.push_back({uni(20, 40), uni(3000, 7000)});  // extreme aspect
      else s.images.push_back({uni(28, 2000), uni(28, 2000)});
    }
    out.push_back(s);
  }
  return out;
}

Budgets default_budgets() {
  Budgets b;
  b.max_image_tokens = 1024;
  b.max_seq_len = 4096;
  b.max_tokens = 8192;
  b.batch_image_tokens = 4096;
  b.max_micro_batches = 1000;
  return b;
}

std::string serialize(const StepPlan& p) {
  std::ostringstream ss;
  ss << p.micro_batches << "|";
  for (const auto& r : p.ranks) {
    ss << "R" << r.cost;
    for (const auto& mb : r.micro_batches) {
      ss << "[";
      for (const auto& s : mb.samples) {
        ss << s.index << ":" << s.seq_len;
        for (const auto& im : s.images) ss << "," << im.resized.height << "x" << im.resized.width;
        ss << ";";
      }
      ss << "]";
    }
  }
  for (const auto& s : p.skipped) ss << "S" << s.index;
  return ss.str();
}

TEST(StepPlan, PropertiesOverRandomDatasets) {
  std::mt19937_64 rng(7);
  int balanced_cases = 0;
  for (int trial = 0; trial < 200; ++trial) {
    int world = 1 + trial % 8;
    int n = 1 + static_cast<int>(rng() % 64);
    auto samples = random_samples(rng, n);
    Budgets b = default_budgets();
    StepPlan plan = plan_step(samples, world, b);
    SCOPED_TRACE("trial " + std::to_string(trial) + " world " + std::to_string(world));

    ASSERT_EQ(static_cast<int>(plan.ranks.size()), world);
    std::map<int64_t, int> seen;
    int64_t total_cost = 0, max_cost = 0;
    for (const auto& rank : plan.ranks) {
      // Same micro-batch count on every rank.
      ASSERT_EQ(static_cast<int64_t>(rank.micro_batches.size()), plan.micro_batches);
      int64_t rank_cost = 0;
      for (const auto& mb : rank.micro_batches) {
        int64_t longest = 0, img = 0;
        for (const auto& s : mb.samples) {
          seen[s.index]++;
          longest = std::max(longest, s.seq_len);
          img += s.image_tokens;
          rank_cost += sample_cost(s);
          max_cost = std::max(max_cost, sample_cost(s));
          EXPECT_LE(s.seq_len, b.max_seq_len);
          int64_t sum = 0;
          for (const auto& im : s.images) {
            EXPECT_EQ(im.resized.height % 28, 0);
            EXPECT_EQ(im.resized.width % 28, 0);
            EXPECT_EQ(im.tokens, (im.resized.height / 28) * (im.resized.width / 28));
            EXPECT_LE(im.tokens, b.max_image_tokens);
            sum += im.tokens;
          }
          EXPECT_EQ(sum, s.image_tokens);
        }
        // Budgets of the micro-batch.
        EXPECT_EQ(longest, mb.padded_len);
        EXPECT_LE(mb.padded_tokens(), b.max_tokens);
        EXPECT_LE(img, b.batch_image_tokens);
        EXPECT_EQ(img, mb.image_tokens);
      }
      EXPECT_EQ(rank_cost, rank.cost);
      total_cost += rank_cost;
    }
    // Every sample exactly once, or skipped with a reason.
    for (const auto& s : plan.skipped) {
      EXPECT_FALSE(s.reason.empty());
      seen[s.index] += 100;
    }
    for (const auto& s : samples) {
      int count = seen.count(s.index) ? seen[s.index] : 0;
      EXPECT_TRUE(count == 1 || count == 100) << "sample " << s.index << " appears " << count;
    }
    EXPECT_EQ(seen.size(), samples.size());
    // Balance: LPT guarantees max load <= ideal + largest sample; whenever the largest
    // sample is at most 10% of the ideal share, every rank is within 10% of it.
    double ideal = static_cast<double>(total_cost) / world;
    if (world > 1 && max_cost <= 0.1 * ideal) {
      ++balanced_cases;
      for (const auto& rank : plan.ranks) EXPECT_LE(rank.cost, 1.1 * ideal);
    }
  }
  // A step with many similar samples is always in the bounded regime.
  Budgets b = default_budgets();
  std::vector<SampleCost> many;
  for (int i = 0; i < 400; ++i) many.push_back({i, 50 + (i * 37) % 200, {{300 + i % 200, 400}}});
  StepPlan p = plan_step(many, 8, b);
  int64_t total = 0;
  for (const auto& r : p.ranks) total += r.cost;
  for (const auto& r : p.ranks) EXPECT_LE(r.cost, 1.1 * total / 8.0);
  std::printf("balance bound exercised in %d random trials\n", balanced_cases);
}

TEST(StepPlan, TextOnlyAndImageHeavyRanksGetSameMicroBatchCount) {
  // Adversarial: 1 sample with 8 large images, 15 text-only samples, world 4.
  std::vector<SampleCost> samples;
  samples.push_back({0, 100, std::vector<vlm::ImageSize>(8, {1500, 1500})});
  for (int i = 1; i < 16; ++i) samples.push_back({i, 20, {}});
  Budgets b = default_budgets();
  b.max_tokens = 2048;
  b.batch_image_tokens = 1024;
  StepPlan plan = plan_step(samples, 4, b);
  EXPECT_TRUE(plan.skipped.empty());
  for (const auto& r : plan.ranks) EXPECT_EQ(static_cast<int64_t>(r.micro_batches.size()), plan.micro_batches);
  // The 8-image sample was downscaled to the micro-batch image budget, not dropped.
  bool found = false;
  for (const auto& r : plan.ranks)
    for (const auto& mb : r.micro_batches)
      for (const auto& s : mb.samples)
        if (s.index == 0) {
          found = true;
          EXPECT_LE(s.image_tokens, 1024);
          EXPECT_EQ(s.images.size(), 8u);
          for (const auto& im : s.images) EXPECT_TRUE(im.downscaled);
        }
  EXPECT_TRUE(found);
}

TEST(StepPlan, FewerSamplesThanRanksGivesFillers) {
  std::vector<SampleCost> samples = {{5, 40, {{56, 56}}}};
  StepPlan plan = plan_step(samples, 3, default_budgets());
  EXPECT_EQ(plan.micro_batches, 1);
  int fillers = 0;
  for (const auto& r : plan.ranks) {
    ASSERT_EQ(r.micro_batches.size(), 1u);
    fillers += r.micro_batches[0].filler();
  }
  EXPECT_EQ(fillers, 2);
  // Empty step: one filler everywhere, so every rank still runs its collectives.
  StepPlan empty = plan_step({}, 2, default_budgets());
  EXPECT_EQ(empty.micro_batches, 1);
  for (const auto& r : empty.ranks) EXPECT_TRUE(r.micro_batches.at(0).filler());
}

TEST(StepPlan, DownscalesHugeImagesKeepingAspectAndNeverBelowMinPixels) {
  Budgets b = default_budgets();
  b.batch_image_tokens = 300;
  PlannedSample p;
  std::string reason;
  ASSERT_TRUE(fit_sample({1, 30, {{10000, 10000}}}, b, &p, &reason)) << reason;
  ASSERT_EQ(p.images.size(), 1u);
  EXPECT_LE(p.image_tokens, 300);
  EXPECT_GE(p.image_tokens, 200);  // the largest square grid under 300 is 17x17 = 289
  EXPECT_EQ(p.images[0].resized.height, p.images[0].resized.width);
  EXPECT_TRUE(p.images[0].downscaled);
  EXPECT_GE(p.images[0].resized.height * p.images[0].resized.width, b.pixels.min_pixels);

  // Without pressure the per-image cap alone applies and nothing is marked downscaled.
  ASSERT_TRUE(fit_sample({2, 30, {{480, 640}}}, default_budgets(), &p, &reason));
  EXPECT_EQ(p.images[0].resized.height, 476);
  EXPECT_EQ(p.images[0].resized.width, 644);
  EXPECT_EQ(p.image_tokens, 391);
  EXPECT_FALSE(p.images[0].downscaled);
  EXPECT_EQ(p.seq_len, 30 + 391);
}

TEST(StepPlan, SkipsWhatCannotFitAndSaysWhy) {
  Budgets b = default_budgets();
  b.batch_image_tokens = 20;  // 8 images need at least 8 x 4 tokens at min_pixels
  PlannedSample p;
  std::string reason;
  EXPECT_FALSE(fit_sample({3, 10, std::vector<vlm::ImageSize>(8, {500, 500})}, b, &p, &reason));
  EXPECT_NE(reason.find("need at least 32 merged tokens"), std::string::npos) << reason;
  EXPECT_FALSE(fit_sample({4, 10, {{0, 100}}}, default_budgets(), &p, &reason));
  EXPECT_FALSE(reason.empty());
  EXPECT_FALSE(fit_sample({5, 10, {{10, 5000}}}, default_budgets(), &p, &reason));  // aspect 500
  EXPECT_NE(reason.find("aspect"), std::string::npos) << reason;
  StepPlan plan = plan_step({{3, 10, std::vector<vlm::ImageSize>(8, {500, 500})}, {6, 10, {}}}, 2, b);
  ASSERT_EQ(plan.skipped.size(), 1u);
  EXPECT_EQ(plan.skipped[0].index, 3);
}

TEST(StepPlan, LongTextIsTruncatedImagesKept) {
  Budgets b = default_budgets();
  b.max_seq_len = 1000;
  PlannedSample p;
  std::string reason;
  ASSERT_TRUE(fit_sample({7, 5000, {{280, 280}}}, b, &p, &reason)) << reason;
  EXPECT_TRUE(p.truncated);
  EXPECT_EQ(p.seq_len, 1000);
  EXPECT_EQ(p.image_tokens, 100);
  EXPECT_FALSE(p.images[0].downscaled);
}

// Qwen3-VL geometry (patch 16, merge 2: resize factor 32, 1024 pixels per merged token;
// min_pixels 65536 = 64 tokens). Reference sizes are HF's: Qwen2VLImageProcessorPil with
// patch_size 16, merge_size 2, size {65536, max_pixels} (scripts/image_reference.py
// --processor qwen3_vl prints the same grids for these images).
Budgets qwen3_budgets() {
  Budgets b = default_budgets();
  b.factor = 32;
  b.pixels = {65536, 16777216};
  return b;
}

TEST(StepPlan, Qwen3FactorCapsImagesOnThe32PixelGrid) {
  PlannedSample p;
  std::string reason;
  // Capped at 100 tokens (max_pixels 102400): HF's grid is [1, 16, 22] -> 256 x 352, 88 tokens.
  Budgets b = qwen3_budgets();
  b.max_image_tokens = 100;
  ASSERT_TRUE(fit_sample({1, 20, {{1500, 2000}}}, b, &p, &reason)) << reason;
  EXPECT_EQ(p.images[0].resized.height, 256);
  EXPECT_EQ(p.images[0].resized.width, 352);
  EXPECT_EQ(p.image_tokens, 88);
  EXPECT_EQ(p.seq_len, 20 + 88);
  // Capped at 77 tokens: HF's grid for 333 x 517 is [1, 14, 20] -> 224 x 320, 70 tokens.
  b.max_image_tokens = 77;
  ASSERT_TRUE(fit_sample({2, 20, {{333, 517}}}, b, &p, &reason)) << reason;
  EXPECT_EQ(p.images[0].resized.height, 224);
  EXPECT_EQ(p.images[0].resized.width, 320);
  EXPECT_EQ(p.image_tokens, 70);
  // Uncapped 480 x 640 is already on the grid: 15 x 20 = 300 tokens (391 at factor 28).
  ASSERT_TRUE(fit_sample({3, 20, {{480, 640}}}, qwen3_budgets(), &p, &reason)) << reason;
  EXPECT_EQ(p.images[0].resized.height, 480);
  EXPECT_EQ(p.images[0].resized.width, 640);
  EXPECT_EQ(p.image_tokens, 300);
  // A tiny image goes up to min_pixels: 10 x 10 -> 256 x 256 = 64 tokens (HF [1, 16, 16]).
  ASSERT_TRUE(fit_sample({4, 20, {{10, 10}}}, qwen3_budgets(), &p, &reason)) << reason;
  EXPECT_EQ(p.images[0].resized.height, 256);
  EXPECT_EQ(p.image_tokens, 64);
}

TEST(StepPlan, Qwen3FactorTokenBudgetDownscalesAndSkips) {
  PlannedSample p;
  std::string reason;
  // A 100 MP image under a 200-token micro-batch budget: square, on the 32-px grid, <= 200
  // tokens (the largest square is 14 x 14 = 196), never below min_pixels.
  Budgets b = qwen3_budgets();
  b.batch_image_tokens = 200;
  ASSERT_TRUE(fit_sample({1, 30, {{10000, 10000}}}, b, &p, &reason)) << reason;
  const auto& im = p.images.at(0);
  EXPECT_TRUE(im.downscaled);
  EXPECT_EQ(im.resized.height, im.resized.width);
  EXPECT_EQ(im.resized.height % 32, 0);
  EXPECT_EQ(im.tokens, (im.resized.height / 32) * (im.resized.width / 32));
  EXPECT_EQ(p.image_tokens, 196);
  EXPECT_GE(im.resized.height * im.resized.width, 65536);
  // 8 images need 8 x 64 tokens at min_pixels 65536: more than 300 does not fit.
  b.batch_image_tokens = 300;
  EXPECT_FALSE(fit_sample({2, 10, std::vector<vlm::ImageSize>(8, {500, 500})}, b, &p, &reason));
  EXPECT_NE(reason.find("need at least 512 merged tokens"), std::string::npos) << reason;

  // Random steps: every planned image on the 32-px grid, under the per-image cap, its tokens
  // (h/32)(w/32), and every micro-batch under its budgets. The one exception to the cap is
  // HF's: smart_resize keeps each side >= 32, so a very elongated image can be one row of
  // merged tokens above the cap (vlm/model/image_geometry.h; the plan budgets its real tokens).
  std::mt19937_64 rng(32);
  for (int trial = 0; trial < 60; ++trial) {
    Budgets rb = qwen3_budgets();
    rb.max_image_tokens = 64 + static_cast<int64_t>(rng() % 1500);
    const int world = 1 + trial % 8;
    StepPlan plan = plan_step(random_samples(rng, 1 + static_cast<int>(rng() % 40)), world, rb);
    SCOPED_TRACE("trial " + std::to_string(trial));
    for (const auto& rank : plan.ranks) {
      ASSERT_EQ(static_cast<int64_t>(rank.micro_batches.size()), plan.micro_batches);
      for (const auto& mb : rank.micro_batches) {
        EXPECT_LE(mb.padded_tokens(), rb.max_tokens);
        EXPECT_LE(mb.image_tokens, rb.batch_image_tokens);
        for (const auto& s : mb.samples)
          for (const auto& pi : s.images) {
            EXPECT_EQ(pi.resized.height % 32, 0);
            EXPECT_EQ(pi.resized.width % 32, 0);
            EXPECT_EQ(pi.tokens, (pi.resized.height / 32) * (pi.resized.width / 32));
            if (std::min(pi.resized.height, pi.resized.width) > 32) EXPECT_LE(pi.tokens, rb.max_image_tokens);
          }
      }
    }
  }
}

TEST(StepPlan, IdenticalInAnotherProcess) {
  std::mt19937_64 rng(99);
  auto samples = random_samples(rng, 50);
  std::string here = serialize(plan_step(samples, 5, default_budgets()));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    std::string there = serialize(plan_step(samples, 5, default_budgets()));
    ssize_t w = write(fds[1], there.data(), there.size());
    _exit(w == static_cast<ssize_t>(there.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string there;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) there.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(here, there);
  // And the plan depends on its inputs (a different world size differs).
  EXPECT_NE(here, serialize(plan_step(samples, 4, default_budgets())));
}

}  // namespace

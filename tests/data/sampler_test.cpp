// Distributed sampler: equal counts per rank, full coverage, determinism, resume from a
// cursor (same and different world size), length grouping.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "data/sampler.h"
#include "vlm/runtime/check.h"

namespace {

using namespace vlm::data;

SamplerOptions opts(int64_t n, int64_t world, int64_t batch, uint64_t seed = 7) {
  SamplerOptions o;
  o.dataset_size = n;
  o.world_size = world;
  o.batch_per_rank = batch;
  o.seed = seed;
  return o;
}

// Global order actually consumed in one epoch from `c`: ranks in rank order per step.
std::vector<int64_t> consumed(const DistributedSampler& s, SamplerCursor c, int64_t steps,
                              int64_t* padded = nullptr) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < steps; ++k) {
    SamplerCursor next;
    for (int64_t r = 0; r < s.options().world_size; ++r) {
      SamplerStep st = s.step(c, r);
      out.insert(out.end(), st.indices.begin(), st.indices.end());
      if (padded) *padded += st.padded;
      next = st.next;
    }
    c = next;
  }
  return out;
}

TEST(Sampler, EqualCountsAndFullCoverage) {
  for (int64_t n = 1; n <= 50; ++n) {
    for (int64_t w = 1; w <= 8; ++w) {
      for (int64_t b : {1, 3}) {
        DistributedSampler s(opts(n, w, b));
        const int64_t steps = s.steps_per_epoch();
        EXPECT_EQ(steps, (n + w * b - 1) / (w * b));
        std::map<int64_t, int64_t> seen;
        int64_t padded = 0;
        for (int64_t r = 0; r < w; ++r) {
          std::vector<int64_t> mine = s.rank_epoch({0, 0}, r);
          ASSERT_EQ(int64_t(mine.size()), steps * b) << "n=" << n << " w=" << w << " r=" << r;
          for (int64_t i : mine) {
            ASSERT_GE(i, 0);
            ASSERT_LT(i, n);
            ++seen[i];
          }
        }
        consumed(s, {0, 0}, steps, &padded);
        EXPECT_EQ(padded, s.padding_per_epoch());
        EXPECT_EQ(padded, steps * w * b - n);
        ASSERT_EQ(int64_t(seen.size()), n) << "every index at least once";
        int64_t extra = 0;
        for (auto& [i, k] : seen) extra += k - 1;
        EXPECT_EQ(extra, padded) << "repeats are exactly the reported padding";
      }
    }
  }
}

TEST(Sampler, EpochOrderIsPermutationAndDeterministic) {
  DistributedSampler a(opts(1000, 4, 2, 123)), b(opts(1000, 3, 5, 123)), c(opts(1000, 4, 2, 124));
  auto o0 = a.epoch_order(0), o1 = a.epoch_order(1);
  auto sorted = o0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(o0, o1) << "shuffled per epoch";
  EXPECT_EQ(o0, b.epoch_order(0)) << "order independent of world size and batch";
  EXPECT_NE(o0, c.epoch_order(0)) << "seed changes the order";
  EXPECT_EQ(o0, DistributedSampler(opts(1000, 4, 2, 123)).epoch_order(0));
  SamplerOptions ns = opts(10, 1, 1);
  ns.shuffle = false;
  auto plain = DistributedSampler(ns).epoch_order(3);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(plain[i], i);
  // Consumed global order is the epoch order (plus padding at the end).
  auto got = consumed(a, {0, 0}, a.steps_per_epoch());
  EXPECT_TRUE(std::equal(o0.begin(), o0.end(), got.begin()));
}

TEST(Sampler, ResumeSameWorldSize) {
  DistributedSampler s(opts(37, 3, 2));
  // Uninterrupted run over two epochs, per rank.
  std::vector<std::vector<int64_t>> full(3), resumed(3);
  SamplerCursor c{0, 0}, saved;
  int64_t step = 0;
  while (c.epoch < 2) {
    SamplerCursor next;
    for (int64_t r = 0; r < 3; ++r) {
      SamplerStep st = s.step(c, r);
      full[r].insert(full[r].end(), st.indices.begin(), st.indices.end());
      next = st.next;
    }
    c = next;
    if (++step == 4) saved = c;
  }
  EXPECT_EQ(saved, (SamplerCursor{0, 24}));
  // A fresh sampler resumed from the saved cursor reproduces the rest exactly.
  DistributedSampler s2(opts(37, 3, 2));
  c = saved;
  while (c.epoch < 2) {
    SamplerCursor next;
    for (int64_t r = 0; r < 3; ++r) {
      SamplerStep st = s2.step(c, r);
      resumed[r].insert(resumed[r].end(), st.indices.begin(), st.indices.end());
      next = st.next;
    }
    c = next;
  }
  for (int64_t r = 0; r < 3; ++r)
    EXPECT_TRUE(std::equal(resumed[r].begin(), resumed[r].end(), full[r].begin() + 4 * 2))
        << "rank " << r;
}

TEST(Sampler, ResumeOnDifferentWorldSize) {
  for (int64_t n : {1, 7, 37, 100}) {
    for (int64_t w1 = 1; w1 <= 4; ++w1) {
      for (int64_t w2 = 1; w2 <= 5; ++w2) {
        DistributedSampler before(opts(n, w1, 2, 99)), after(opts(n, w2, 3, 99));
        const int64_t k = std::max<int64_t>(0, before.steps_per_epoch() / 2);
        std::vector<int64_t> a = consumed(before, {0, 0}, k);
        SamplerCursor c{0, 0};
        for (int64_t i = 0; i < k; ++i) c = before.step(c, 0).next;
        if (c.epoch != 0) continue;  // epoch finished before the switch
        EXPECT_EQ(c.offset, k * w1 * 2);
        int64_t padded = 0;
        std::vector<int64_t> b = consumed(after, c, after.steps_remaining(c.offset), &padded);
        EXPECT_EQ(padded, after.padding_from(c.offset));
        // Together: the epoch order exactly, then the padding.
        std::vector<int64_t> all = a;
        all.insert(all.end(), b.begin(), b.end());
        auto order = before.epoch_order(0);
        ASSERT_GE(all.size(), order.size());
        EXPECT_TRUE(std::equal(order.begin(), order.end(), all.begin()))
            << "n=" << n << " w1=" << w1 << " w2=" << w2;
        EXPECT_EQ(int64_t(all.size()) - n, padded);
        // Equal counts per rank after the switch.
        for (int64_t r = 0; r < w2; ++r)
          EXPECT_EQ(int64_t(after.rank_epoch(c, r).size()), after.steps_remaining(c.offset) * 3);
      }
    }
  }
}

TEST(Sampler, LengthGroupedGroupsSimilarCosts) {
  const int64_t n = 1000;
  SamplerOptions o = opts(n, 2, 4, 5);
  o.group_by_length = true;
  o.group_size = 8;
  o.groups_per_chunk = 16;
  for (int64_t i = 0; i < n; ++i) o.costs.push_back((i * 7919) % 1000);
  DistributedSampler s(o);
  auto order = s.epoch_order(0);
  auto sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(order, s.epoch_order(0));
  EXPECT_NE(order, s.epoch_order(1));
  // Mean cost spread inside groups of 8 is far below that of a random order.
  auto spread = [&](const std::vector<int64_t>& v) {
    double total = 0;
    for (int64_t g = 0; g + 8 <= n; g += 8) {
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (int64_t k = g; k < g + 8; ++k) {
        lo = std::min(lo, o.costs[v[k]]);
        hi = std::max(hi, o.costs[v[k]]);
      }
      total += double(hi - lo);
    }
    return total / (n / 8);
  };
  SamplerOptions plain = o;
  plain.group_by_length = false;
  const double grouped = spread(order), random = spread(DistributedSampler(plain).epoch_order(0));
  EXPECT_LT(grouped, random / 5) << grouped << " vs " << random;
  // Group order is shuffled: consecutive groups are not globally sorted.
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end(),
                              [&](int64_t x, int64_t y) { return o.costs[x] > o.costs[y]; }));
  o.costs.pop_back();
  EXPECT_THROW(DistributedSampler{o}, vlm::Error);
}

TEST(Sampler, RejectsBadInput) {
  EXPECT_THROW(DistributedSampler(opts(0, 1, 1)), vlm::Error);
  EXPECT_THROW(DistributedSampler(opts(5, 0, 1)), vlm::Error);
  DistributedSampler s(opts(5, 2, 1));
  EXPECT_THROW(s.step({0, 5}, 0), vlm::Error);
  EXPECT_THROW(s.step({0, 0}, 2), vlm::Error);
}

}  // namespace

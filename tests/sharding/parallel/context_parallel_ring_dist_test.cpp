// Context parallelism in ring mode (cp_mode "ring"), its own ctest entry so that each entry
// stays well inside the dist timeout. The workers, DISABLED_RingEqualsOneProcessWorker and its
// harness (one-process reference, 10 AdamW steps, every family and layout, the formulas), are
// in context_parallel_dist_test.cpp, in the same test executable; here are the launches (real
// processes on Gloo over loopback, hard timeouts) and the ring layout's and formula's checks.
#include <gtest/gtest.h>

#include <vector>

#include "sharding/parallel/context_parallel.h"
#include "tests/sharding/parallel/fsdp_testing.h"

namespace {

using namespace vlm::sharding;

std::vector<std::string> ring_env(int cp) { return {vlm::str("VLMTRAIN_TEST_CP=", cp)}; }

TEST(ContextParallelRingDist, EqualsOneProcessCp2World2) {
  fsdp_testing::launch(2, "ContextParallelDist.DISABLED_RingEqualsOneProcessWorker", 540,
                       [](int) { return ring_env(2); });
}

TEST(ContextParallelRingDist, EqualsOneProcessCp4World4) {
  fsdp_testing::launch(4, "ContextParallelDist.DISABLED_RingEqualsOneProcessWorker", 540,
                       [](int) { return ring_env(4); });
}

TEST(ContextParallelRingDist, EqualsOneProcessDp2Cp2World4) {
  fsdp_testing::launch(4, "ContextParallelDist.DISABLED_RingEqualsOneProcessWorker", 540,
                       [](int) { return ring_env(2); });
}

// Ring layout: rank r holds chunks r and 2 cp - 1 - r of 2 cp; the ranks cover the padded
// sequence once, and the local index inverts the held positions.
TEST(ContextParallelRing, LayoutCoversThePaddedSequence) {
  for (int64_t cp : {2, 3, 4})
    for (int64_t len : {1, 7, 8, 13, 24}) {
      const int64_t padded = (len + 2 * cp - 1) / (2 * cp) * (2 * cp), c = padded / (2 * cp);
      std::vector<int> held(static_cast<size_t>(padded), 0);
      for (int64_t r = 0; r < cp; ++r) {
        const auto lay = vlm::sequence_layout(len, cp, r, vlm::SequenceMode::kRing);
        ASSERT_EQ(lay.padded, padded) << "len " << len << " cp " << cp;
        ASSERT_EQ(lay.len, padded / cp);
        ASSERT_EQ(lay.runs.size(), 2u);
        EXPECT_EQ(lay.runs[0].begin, r * c);
        EXPECT_EQ(lay.runs[1].begin, (2 * cp - 1 - r) * c);
        const auto pos = lay.positions();
        const auto index = vlm::layout_local_index(lay);
        for (size_t i = 0; i < pos.size(); ++i) {
          ++held[static_cast<size_t>(pos[i])];
          EXPECT_EQ(index[pos[i]].item<int64_t>(), static_cast<int64_t>(i));
          if (i > 0) EXPECT_LT(pos[i - 1], pos[i]) << "held positions in sequence order";
        }
        EXPECT_EQ(index.ge(0).sum().item<int64_t>(), lay.len);
        // A padded length gives the same layout back.
        EXPECT_EQ(vlm::sequence_layout(padded, cp, r, vlm::SequenceMode::kRing).positions(), pos);
      }
      for (int h : held) EXPECT_EQ(h, 1) << "len " << len << " cp " << cp;
    }
  // Ulysses' layout is sequence_chunk's one run.
  const auto u = vlm::sequence_layout(13, 4, 2, vlm::SequenceMode::kUlysses);
  const auto c = vlm::sequence_chunk(13, 4, 2);
  ASSERT_EQ(u.runs.size(), 1u);
  EXPECT_EQ(u.padded, c.padded);
  EXPECT_EQ(u.runs[0].begin, c.begin);
  EXPECT_EQ(u.len, c.len);
}

// The ring formula by hand: tiny has 2 kv heads of head_dim D; cp 4, 3 rows of 16 tokens (4 per
// rank) in bf16: a block is B x Hkv x 4 x D x 2 (k, v) elements; forward 3 hops of blocks,
// backward 3 hops of blocks and 4 of their fp32 gradients; a recompute, the forward's again.
TEST(ContextParallelRing, LayerBytesByHand) {
  const vlm::TextConfig t = vlm::preset("tiny").text;
  const double block = 3.0 * 2 * 4 * static_cast<double>(t.head_dim()) * 2;
  EXPECT_EQ(t.num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(ring_layer_bytes(t, 4, 3, 16, 2), 3 * block * 2 + 3 * block * 2 + 4 * block * 4);
  EXPECT_DOUBLE_EQ(ring_layer_bytes(t, 4, 3, 16, 2, true), 6 * block * 2 + 3 * block * 2 + 4 * block * 4);
  EXPECT_DOUBLE_EQ(ring_layer_bytes(t, 1, 3, 16, 4), 0.0);
}

}  // namespace

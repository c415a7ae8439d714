// Ring attention (vlm/model/ring_attention.h) alone, with cp ranks emulated in one process:
// one thread per rank, each with its own tokens' q / k / v (leaves of its own, gathered from
// whole-sequence tensors) and an in-memory exchange whose ring_pass hands each rank what the
// previous one passed (a barrier per hop; a rank that waits 60 s fails instead of hanging). The
// real exchange, over Comm, is tested in tests/sharding/parallel/context_parallel_dist_test.cpp.
// The ranks' outputs, put back in sequence order, and their q, k, v gradients (each rank's
// backward in its thread, the dk / dv travelling the ring) equal plain attention on the whole
// sequence and its gradients (vlm::attention with causal_padding_mask, causal, or
// varlen_attention for packed rows). fp32, GQA (4 heads, 2 kv heads), cp 2, 3, 4; key padding
// with rows whose every key of a block is masked (no NaN); packed segments; the ring layout and
// the contiguous one (whose last block every rank skips: its hops still run). Outputs and
// gradients within 1e-5 of the largest value; cp - 1 hops forward, 2 cp - 1 in backward.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "vlm/model/attention.h"
#include "vlm/model/language_model.h"
#include "vlm/model/ring_attention.h"
#include "vlm/runtime/check.h"

namespace ring_attention_test {

// The group's in-memory ring: ring_pass deposits x in its rank's slot and, once every rank has
// deposited, takes the previous rank's.
class RingBoard {
 public:
  explicit RingBoard(int64_t cp) : cp_(cp), slots_(static_cast<size_t>(cp)) {}
  torch::Tensor pass(int64_t rank, const torch::Tensor& x) {
    std::unique_lock<std::mutex> lock(mutex_);
    slots_[static_cast<size_t>(rank)] = x.detach().clone();
    wait_all(lock);
    auto got = slots_[static_cast<size_t>((rank - 1 + cp_) % cp_)];
    wait_all(lock);  // nobody deposits the next hop before every rank took this one
    return got;
  }

 private:
  void wait_all(std::unique_lock<std::mutex>& lock) {
    const int64_t gen = generation_;
    if (++arrived_ == cp_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != gen; }))
      throw std::runtime_error("ring board: a rank waited 60 s for the others (a hop missing on some rank)");
  }
  const int64_t cp_;
  std::vector<torch::Tensor> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t arrived_ = 0, generation_ = 0;
};

// Rank `rank` of the group on the board.
class RingFake : public vlm::SequenceExchange {
 public:
  RingFake(RingBoard& board, int64_t cp, int64_t rank, vlm::SequenceMode mode)
      : board_(board), cp_(cp), rank_(rank), mode_(mode) {}
  int64_t size() const override { return cp_; }
  int64_t rank() const override { return rank_; }
  vlm::SequenceMode mode() const override { return mode_; }
  torch::Tensor all_to_all(const torch::Tensor&, const std::string&) override {
    ADD_FAILURE() << "ring attention must not call all_to_all";
    return {};
  }
  torch::Tensor ring_pass(const torch::Tensor& x, const std::string&) override {
    ++passes;
    return board_.pass(rank_, x);
  }
  int64_t passes = 0;

 private:
  RingBoard& board_;
  int64_t cp_, rank_;
  vlm::SequenceMode mode_;
};

enum class RaMask { kCausal, kPadding, kPacked };

struct RaCase {
  int64_t cp;
  vlm::SequenceMode mode;
  RaMask mask;
  int64_t tile_bytes = vlm::kRingTileBytes;  // small: every block pair runs in several tiles
};

double ra_rel(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

void ra_check(const RaCase& c) {
  const std::string tag = vlm::str("cp ", c.cp, " ", vlm::sequence_mode_name(c.mode), " mask ",
                                   static_cast<int>(c.mask));
  torch::manual_seed(7 + c.cp);
  const int64_t b = c.mask == RaMask::kPacked ? 1 : 2, h = 4, hkv = 2, d = 8, l = 8 * c.cp;
  const double scale = 0.3;
  auto q = torch::randn({b, h, l, d}).requires_grad_(), k = torch::randn({b, hkv, l, d}).requires_grad_(),
       v = torch::randn({b, hkv, l, d}).requires_grad_();
  auto dout = torch::randn({b, h, l, d});
  // Row 0 real but for the last 5 keys and a hole; row 1 but for its first 5 (a whole chunk of
  // the ring layout: queries of other ranks see no key of that run).
  std::vector<int64_t> cu;
  torch::Tensor key_mask;
  if (c.mask == RaMask::kPadding) {
    key_mask = torch::ones({b, l}, torch::kBool);
    key_mask[0].narrow(0, l - 5, 5).fill_(false);
    key_mask[0][2] = false;
    key_mask[1].narrow(0, 0, 5).fill_(false);
  }
  if (c.mask == RaMask::kPacked) cu = {0, 3, 4, l / 2 + 1, l - 2, l};
  // The reference: plain attention on the whole sequence.
  torch::Tensor want;
  if (c.mask == RaMask::kPacked) {
    auto pk = [](const torch::Tensor& t) { return t.squeeze(0).transpose(0, 1); };
    want = vlm::varlen_attention(pk(q), pk(k), pk(v), cu, scale, true).transpose(0, 1).unsqueeze(0);
  } else {
    auto m = key_mask.defined() ? vlm::causal_padding_mask(key_mask.to(torch::kInt64), l) : torch::Tensor();
    want = vlm::attention(q, k, v, m, scale, !m.defined());
  }
  auto grads = torch::autograd::grad({want}, {q, k, v}, {dout});
  // The ring: one thread per rank, its own leaves.
  struct RankRun {
    torch::Tensor out, dq, dk, dv;
    int64_t forward_passes = 0, passes = 0;
    std::string error;
  };
  std::vector<RankRun> runs(static_cast<size_t>(c.cp));
  RingBoard board(c.cp);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < c.cp; ++r)
    threads.emplace_back([&, r] {
      RankRun& run = runs[static_cast<size_t>(r)];
      try {
        RingFake ex(board, c.cp, r, c.mode);
        const auto lay = vlm::sequence_layout(l, c.cp, r, c.mode);
        auto qr = vlm::gather_layout(q, 2, lay).detach().requires_grad_();
        auto kr = vlm::gather_layout(k, 2, lay).detach().requires_grad_();
        auto vr = vlm::gather_layout(v, 2, lay).detach().requires_grad_();
        run.out = vlm::ring_attention(ex, qr, kr, vr, key_mask, cu.empty() ? nullptr : &cu, scale, "test ring",
                                      c.tile_bytes);
        run.forward_passes = ex.passes;
        auto g = torch::autograd::grad({run.out}, {qr, kr, vr}, {vlm::gather_layout(dout, 2, lay)});
        run.dq = g[0], run.dk = g[1], run.dv = g[2];
        run.passes = ex.passes;
      } catch (const std::exception& e) {
        run.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  auto got = torch::zeros_like(want);
  std::vector<torch::Tensor> ring_grads = {torch::zeros_like(q), torch::zeros_like(k), torch::zeros_like(v)};
  for (int64_t r = 0; r < c.cp; ++r) {
    const RankRun& run = runs[static_cast<size_t>(r)];
    ASSERT_EQ(run.error, "") << tag << " rank " << r;
    const auto lay = vlm::sequence_layout(l, c.cp, r, c.mode);
    EXPECT_EQ(run.forward_passes, c.cp - 1) << tag;
    EXPECT_EQ(run.passes, c.cp == 1 ? 0 : 3 * (c.cp - 1) + 1) << tag << ": forward and backward hops";
    ASSERT_EQ(run.out.sizes(), (std::vector<int64_t>{b, h, lay.len, d})) << tag;
    auto index = torch::tensor(lay.positions(), torch::kInt64);
    got = got.index_add(2, index, run.out.detach());
    ring_grads[0] = ring_grads[0].index_add(2, index, run.dq);
    ring_grads[1] = ring_grads[1].index_add(2, index, run.dk);
    ring_grads[2] = ring_grads[2].index_add(2, index, run.dv);
  }
  EXPECT_FALSE(torch::isnan(got).any().item<bool>()) << tag;
  EXPECT_LE(ra_rel(got, want), 1e-5) << tag << ": output";
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(torch::isnan(ring_grads[i]).any().item<bool>()) << tag << " grad " << names[i];
    EXPECT_LE(ra_rel(ring_grads[i], grads[i]), 1e-5) << tag << ": grad " << names[i];
  }
}

TEST(RingAttention, EqualsWholeSequenceAttention) {
  for (int64_t cp : {2, 3, 4})
    for (auto mode : {vlm::SequenceMode::kRing, vlm::SequenceMode::kUlysses})
      for (RaMask m : {RaMask::kCausal, RaMask::kPadding, RaMask::kPacked}) ra_check({cp, mode, m});
}

// Tiles of 3 query rows (a score row is B x H x m x 4 bytes): uneven tiles, the masks cut by row.
TEST(RingAttention, TiledBlocksEqualWholeSequenceAttention) {
  for (RaMask m : {RaMask::kPadding, RaMask::kPacked}) {
    const int64_t b = m == RaMask::kPacked ? 1 : 2;
    ra_check({3, vlm::SequenceMode::kRing, m, 3 * b * 4 * 4 * 4});
  }
}

TEST(RingAttention, OneRankIsPlainAttention) { ra_check({1, vlm::SequenceMode::kRing, RaMask::kPadding}); }

TEST(RingAttention, RefusesTokensOffTheLayout) {
  auto q = torch::randn({1, 4, 3, 8}), k = torch::randn({1, 2, 3, 8});
  RingBoard board(2);
  RingFake ex(board, 2, 0, vlm::SequenceMode::kRing);
  try {
    vlm::ring_attention(ex, q, k, k, torch::Tensor(), nullptr, 1.0, "test ring");
    FAIL() << "3 tokens per rank cannot be half of 2 chunks";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit the ring layout"), std::string::npos) << e.what();
  }
}

}  // namespace ring_attention_test

namespace ring_attention_test {

// What an all-to-all hands a rank (every rank's held tokens, in rank order) put back in
// sequence order, and the inverse (Gated DeltaNet under ring mode): against gather_layout of
// each rank's layout, both modes, cp 1-4.
TEST(SequenceLayout, RankOrderRoundTripsTheSequence) {
  for (auto mode : {vlm::SequenceMode::kUlysses, vlm::SequenceMode::kRing})
    for (int64_t cp : {1, 2, 3, 4}) {
      const int64_t l = 2 * cp * 3;
      auto seq = torch::arange(2 * l * 5, torch::kFloat32).view({2, l, 5});  // [B, L, w]
      std::vector<torch::Tensor> held;
      for (int64_t r = 0; r < cp; ++r) held.push_back(vlm::gather_layout(seq, 1, vlm::sequence_layout(l, cp, r, mode)));
      const auto rank_order = torch::cat(held, 1);
      const std::string tag = vlm::str(vlm::sequence_mode_name(mode), " cp ", cp);
      EXPECT_TRUE(torch::equal(vlm::rank_order_to_sequence(rank_order, 1, cp, mode), seq)) << tag;
      EXPECT_TRUE(torch::equal(vlm::sequence_to_rank_order(seq, 1, cp, mode), rank_order)) << tag;
    }
}

}  // namespace ring_attention_test

// Ring attention (vlm/model/ring_attention.h) alone, with cp ranks emulated in one process: each
// rank's call gets its own tokens' q / k / v (gathered from whole-sequence leaves) and a fake
// exchange whose ring pass hands it the block rank (rank - s) mod cp holds at step s, gathered
// from the same leaves (the real exchange, over Comm, is tested in
// tests/sharding/parallel/context_parallel_dist_test.cpp). The ranks' outputs, put back in
// sequence order, and the gradients of the whole-sequence q, k, v (through every rank's graph)
// equal plain attention on the whole sequence (vlm::attention with causal_padding_mask, causal,
// or varlen_attention for packed rows). fp32, GQA (4 heads, 2 kv heads), cp 2, 3, 4; key
// padding with rows whose every key of a block is masked (no NaN); packed segments; the ring
// layout and the contiguous one (whose last block every rank skips: it must still enter the
// graph). Outputs and gradients within 1e-5 of the largest value.
#include <gtest/gtest.h>

#include "vlm/model/attention.h"
#include "vlm/model/language_model.h"
#include "vlm/model/ring_attention.h"
#include "vlm/runtime/check.h"

namespace ring_attention_test {

// Rank `rank` of a group of `cp` in one process: ring_pass returns the next block from the
// whole-sequence leaves k / v (their gradients flow there), after checking what it was given.
class RingFake : public vlm::SequenceExchange {
 public:
  RingFake(int64_t cp, int64_t rank, vlm::SequenceMode mode, torch::Tensor k, torch::Tensor v)
      : cp_(cp), rank_(rank), mode_(mode), k_(std::move(k)), v_(std::move(v)) {}
  int64_t size() const override { return cp_; }
  int64_t rank() const override { return rank_; }
  vlm::SequenceMode mode() const override { return mode_; }
  torch::Tensor all_to_all(const torch::Tensor&, const std::string&) override {
    ADD_FAILURE() << "ring attention must not call all_to_all";
    return {};
  }
  torch::Tensor ring_pass(const torch::Tensor& x, const std::string&) override {
    ++passes;
    auto sent = block((rank_ - passes + 1 + cp_) % cp_);  // what this rank held: it goes on
    EXPECT_TRUE(x.sizes() == sent.sizes() && torch::equal(x.detach(), sent.detach())) << "hop " << passes;
    return block((rank_ - passes + cp_) % cp_);
  }
  // [B, 2 Hkv, Lr, D]: rank src's keys and values.
  torch::Tensor block(int64_t src) const {
    const auto lay = vlm::sequence_layout(k_.size(2), cp_, src, mode_);
    return torch::cat({vlm::gather_layout(k_, 2, lay), vlm::gather_layout(v_, 2, lay)}, 1);
  }
  int64_t passes = 0;

 private:
  int64_t cp_, rank_;
  vlm::SequenceMode mode_;
  torch::Tensor k_, v_;
};

enum class RaMask { kCausal, kPadding, kPacked };

struct RaCase {
  int64_t cp;
  vlm::SequenceMode mode;
  RaMask mask;
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
  // The ring: each rank's tokens, its own fake exchange.
  std::vector<torch::Tensor> outs(static_cast<size_t>(c.cp));
  auto got = torch::zeros_like(want);
  for (int64_t r = 0; r < c.cp; ++r) {
    RingFake ex(c.cp, r, c.mode, k, v);
    const auto lay = vlm::sequence_layout(l, c.cp, r, c.mode);
    auto o = vlm::ring_attention(ex, vlm::gather_layout(q, 2, lay), vlm::gather_layout(k, 2, lay),
                                 vlm::gather_layout(v, 2, lay), key_mask, cu.empty() ? nullptr : &cu, scale,
                                 "test ring");
    EXPECT_EQ(ex.passes, c.cp - 1) << tag;
    ASSERT_EQ(o.sizes(), (std::vector<int64_t>{b, h, lay.len, d})) << tag;
    auto index = torch::tensor(lay.positions(), torch::kInt64);
    got = got.index_add(2, index, o);
  }
  EXPECT_FALSE(torch::isnan(got).any().item<bool>()) << tag;
  EXPECT_LE(ra_rel(got, want), 1e-5) << tag << ": output";
  auto ring_grads = torch::autograd::grad({got}, {q, k, v}, {dout});
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

TEST(RingAttention, OneRankIsPlainAttention) { ra_check({1, vlm::SequenceMode::kRing, RaMask::kPadding}); }

TEST(RingAttention, RefusesTokensOffTheLayout) {
  auto q = torch::randn({1, 4, 3, 8}), k = torch::randn({1, 2, 3, 8});
  RingFake ex(2, 0, vlm::SequenceMode::kRing, torch::randn({1, 2, 6, 8}), torch::randn({1, 2, 6, 8}));
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

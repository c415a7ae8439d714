// chunked_linear_cross_entropy against the plain computation it replaces: logits = h W^T
// in full, upcast, torch's cross_entropy (reduction sum, ignore_index -100), and autograd
// through it. Loss and both gradients must agree within 1e-6 relative in fp32 for every
// chunking (1 row, uneven, exactly N, more than N), with ignored rows;
// in bf16 within bf16 rounding (2e-2 relative on the gradients, the reference rounds its
// [N, V] logits gradient once, the chunks their own). Like HF, the cross-entropy is always
// computed in fp32 (the logits are upcast), so only fp32 and bf16 inputs are meaningful.
#include <gtest/gtest.h>

#include "vlm/model/chunked_cross_entropy.h"
#include "vlm/runtime/tensor_memory.h"

namespace {

struct CeCase {
  torch::Tensor h, w, labels;
};

CeCase ce_case(int64_t n, int64_t d, int64_t v, torch::Dtype dt, uint64_t seed) {
  torch::manual_seed(seed);
  CeCase c;
  c.h = torch::randn({n, d}, torch::kFloat64).to(dt);
  c.w = (torch::randn({v, d}, torch::kFloat64) * 0.3).to(dt);
  c.labels = torch::randint(0, v, {n}, torch::kInt64);
  c.labels.index_put_({torch::arange(0, n, 3)}, -100);  // every third row ignored
  return c;
}

struct CeResult {
  torch::Tensor loss, gh, gw;
};

CeResult ce_reference(const CeCase& c) {
  auto h = c.h.clone().requires_grad_(true), w = c.w.clone().requires_grad_(true);
  auto logits = torch::matmul(h, w.t()).to(torch::kFloat32);  // HF's causal-LM loss upcasts to fp32
  auto loss = torch::nn::functional::cross_entropy(
      logits, c.labels, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  (loss * 1.7).backward();  // a non-unit upstream gradient
  return {loss.detach(), h.grad(), w.grad()};
}

CeResult ce_chunked(const CeCase& c, int64_t chunk) {
  auto h = c.h.clone().requires_grad_(true), w = c.w.clone().requires_grad_(true);
  auto loss = vlm::chunked_linear_cross_entropy(h, w, c.labels, chunk);
  (loss * 1.7).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

double ce_rel(const torch::Tensor& a, const torch::Tensor& b) {
  auto ad = a.to(torch::kFloat64), bd = b.to(torch::kFloat64);
  return (ad - bd).abs().max().item<double>() / std::max(1e-30, bd.abs().max().item<double>());
}

TEST(ChunkedCrossEntropy, EqualsFullLogitsFp32) {
  const CeCase c = ce_case(37, 16, 53, torch::kFloat32, 1);
  const CeResult ref = ce_reference(c);
  for (int64_t chunk : {1, 5, 37, 100}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const CeResult got = ce_chunked(c, chunk);
    EXPECT_EQ(got.loss.scalar_type(), torch::kFloat32);
    EXPECT_LE(ce_rel(got.loss, ref.loss), 1e-6);
    EXPECT_LE(ce_rel(got.gh, ref.gh), 1e-6);
    EXPECT_LE(ce_rel(got.gw, ref.gw), 1e-6);
  }
}

// A frozen head (LoRA, a frozen LLM): the hidden gradient as before, no weight gradient, and
// no [V, d] accumulator (counted by the tensor memory meter: the backward's peak stays below
// the weight's fp32 size).
TEST(ChunkedCrossEntropy, FrozenWeightGetsNoGradientNorAccumulator) {
  const CeCase c = ce_case(37, 256, 4096, torch::kFloat32, 4);
  const CeResult ref = ce_reference(c);
  for (int64_t chunk : {5, 100}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto h = c.h.clone().requires_grad_(true), w = c.w.clone();
    auto loss = vlm::chunked_linear_cross_entropy(h, w, c.labels, chunk);
    vlm::TensorMemoryMeter::install();
    vlm::TensorMemoryMeter::reset_peak();
    const int64_t before = vlm::TensorMemoryMeter::live_bytes();
    (loss * 1.7).backward();
    const int64_t peak = vlm::TensorMemoryMeter::peak_bytes() - before;
    EXPECT_LE(ce_rel(h.grad(), ref.gh), 1e-5);
    EXPECT_TRUE(torch::equal(h.grad(), ce_chunked(c, chunk).gh)) << "differs from the trained-weight path";
    EXPECT_FALSE(w.grad().defined());
    EXPECT_LT(peak, static_cast<int64_t>(w.numel()) * 4) << "a [V, d] fp32 accumulator was allocated";
  }
}

// A trained head accumulates its gradient in one [V, d] fp32 buffer: no chunk materialises a
// second [V, d] (its own gradient) beside it. The backward's peak of tensor bytes, counted by
// the meter, is the accumulator (returned as the gradient) plus one chunk's working set (its
// [m, V] logits, log-probabilities and their gradients: at most 6 such tensors) and the
// [N, d] hidden gradient; a per-chunk [V, d] copy would add 4 V d bytes more than that.
TEST(ChunkedCrossEntropy, WeightGradientAccumulatesWithoutAPerChunkCopy) {
  const int64_t n = 37, d = 1024, v = 4096;
  const CeCase c = ce_case(n, d, v, torch::kFloat32, 5);
  const CeResult ref = ce_reference(c);
  const double wbytes = 4.0 * v * d;
  for (int64_t chunk : {5, 37}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto h = c.h.clone().requires_grad_(true), w = c.w.clone().requires_grad_(true);
    auto loss = vlm::chunked_linear_cross_entropy(h, w, c.labels, chunk);
    vlm::TensorMemoryMeter::install();
    vlm::TensorMemoryMeter::reset_peak();
    const int64_t before = vlm::TensorMemoryMeter::live_bytes();
    (loss * 1.7).backward();
    const double peak = static_cast<double>(vlm::TensorMemoryMeter::peak_bytes() - before);
    const double working_set = 6 * 4.0 * chunk * v + 4.0 * n * d;
    EXPECT_LE(ce_rel(w.grad(), ref.gw), 1e-5);  // fp32 sums of d = 1024 products, chunked: another order
    EXPECT_GE(peak, wbytes) << "the accumulator";
    EXPECT_LE(peak, wbytes + working_set) << "a second [V, d] tensor alive during backward";
    std::printf("chunk %lld: backward peak %.2f MB = [V, d] fp32 %.2f MB + %.2f MB (bound %.2f MB)\n",
                static_cast<long long>(chunk), peak / 1e6, wbytes / 1e6, (peak - wbytes) / 1e6, working_set / 1e6);
  }
}

TEST(ChunkedCrossEntropy, Bf16WithinRounding) {
  const CeCase c = ce_case(64, 32, 97, torch::kBFloat16, 2);
  const CeResult ref = ce_reference(c);
  const CeResult got = ce_chunked(c, 7);
  EXPECT_EQ(got.gh.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.gw.scalar_type(), torch::kBFloat16);
  EXPECT_LE(ce_rel(got.loss, ref.loss), 1e-6);  // logits are the same bf16 matmul, upcast
  EXPECT_LE(ce_rel(got.gh, ref.gh), 2e-2);
  EXPECT_LE(ce_rel(got.gw, ref.gw), 2e-2);
}

TEST(ChunkedCrossEntropy, AllIgnoredAndEmpty) {
  CeCase c = ce_case(6, 8, 11, torch::kFloat32, 3);
  c.labels.fill_(-100);
  const CeResult got = ce_chunked(c, 4);
  EXPECT_EQ(got.loss.item<float>(), 0.0f);
  EXPECT_EQ(got.gh.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(got.gw.abs().max().item<float>(), 0.0f);
  auto h = torch::zeros({0, 8}).requires_grad_(true), w = torch::randn({11, 8}).requires_grad_(true);
  auto loss = vlm::chunked_linear_cross_entropy(h, w, torch::zeros({0}, torch::kInt64));
  loss.backward();
  EXPECT_EQ(loss.item<float>(), 0.0f);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().abs().max().item<float>(), 0.0f);
}

TEST(ChunkedCrossEntropy, ChunkRowsFollowTheBudget) {
  EXPECT_EQ(vlm::cross_entropy_chunk_rows(151936), (int64_t{256} << 20) / (151936 * 4));  // 441 rows, 256 MiB
  EXPECT_EQ(vlm::cross_entropy_chunk_rows(1 << 30, 1024), 1);
  EXPECT_THROW(vlm::cross_entropy_chunk_rows(0), std::exception);
}

}  // namespace

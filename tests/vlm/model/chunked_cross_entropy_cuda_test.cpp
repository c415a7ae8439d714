// The CUDA path of the chunked cross-entropy's weight gradient: bf16 inputs, the per-chunk
// g^T h GEMM written straight into the fp32 [V, d] accumulator (addmm with out_dtype fp32),
// against an fp32 reference (full logits, autograd) on the same GPU, within bf16 rounding
// (2e-2 relative); and the caching allocator's peak through backward: the fp32 accumulator,
// the returned bf16 gradient and one chunk's working set, well under the 10 V d bytes a
// per-chunk bf16 gradient plus its fp32 copy would add up to.
// Label cuda: skipped where no GPU is visible; the GPU run runs it.
#include <gtest/gtest.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include "vlm/model/chunked_cross_entropy.h"

namespace {

int64_t cuda_peak_allocated() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}
int64_t cuda_allocated() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
}

TEST(ChunkedCrossEntropyCuda, Bf16WeightGradientAccumulatesInFp32) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible to LibTorch (torch::cuda::is_available() is false); "
                    "the GPU run (scripts/gpu/device_run.sh) runs the cuda label on a lent GPU";
  const int64_t n = 512, d = 1024, v = 32768, chunk = 128;
  torch::manual_seed(0);
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  auto h32 = torch::randn({n, d}, f32), w32 = torch::randn({v, d}, f32) * 0.05;
  auto labels = torch::randint(0, v, {n}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt64));
  // Reference: fp32 everywhere, full logits.
  auto hr = h32.clone().requires_grad_(true), wr = w32.clone().requires_grad_(true);
  torch::nn::functional::cross_entropy(torch::matmul(hr, wr.t()), labels,
                                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
      .backward();
  // vlmtrain's path in bf16.
  auto h = h32.to(torch::kBFloat16).requires_grad_(true), w = w32.to(torch::kBFloat16).requires_grad_(true);
  auto loss = vlm::chunked_linear_cross_entropy(h, w, labels, chunk);
  torch::cuda::synchronize();
  const int64_t before = cuda_allocated();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  loss.backward();
  torch::cuda::synchronize();
  const double peak = static_cast<double>(cuda_peak_allocated() - before);
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kFloat32) - b).abs().max().item<double>() / b.abs().max().item<double>();
  };
  const double vd = static_cast<double>(v) * d;
  std::printf("bf16 chunked CE on CUDA: grad w rel %.3g, grad h rel %.3g, backward peak %.1f MB = %.2f x V d\n",
              rel(w.grad(), wr.grad()), rel(h.grad(), hr.grad()), peak / 1e6, peak / vd);
  EXPECT_EQ(w.grad().scalar_type(), torch::kBFloat16);
  EXPECT_LT(rel(w.grad(), wr.grad()), 2e-2);
  EXPECT_LT(rel(h.grad(), hr.grad()), 2e-2);
  // fp32 accumulator 4 V d + the bf16 gradient 2 V d + a chunk's [128, V] fp32 working set.
  EXPECT_LT(peak, 7 * vd) << "a per-chunk [V, d] gradient (and its fp32 copy) was materialised";
}

}  // namespace

// Optimizer state offload on a GPU (ctest label `cuda`; skips, saying why, when LibTorch
// sees no CUDA device). World 1 on cuda:0, the tiny model (text only: frozen vision, the
// LLM fsdp full_shard, model.norm ddp), 3 steps with the grad clip active:
//   - fp32: offload (host AdamW on pinned masters / moments, non-blocking copies, events)
//     equals the on-device optimizer (CUDA fused AdamW) within 1e-5 absolute on every
//     parameter and 1e-5 relative on the losses (the two kernels round differently by a
//     few fp32 ulps per step; the FSDP tests hold the reference to the same 1e-5);
//   - bf16: the losses within 1e-3 relative (a master that differs by an fp32 ulp can round
//     to the neighbouring bf16 value);
//   - the device holds no optimizer state with offload (MemoryReport), the host does.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "sharding/parallel/fsdp.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace {

using namespace vlm::sharding;

struct OffloadCudaRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;  // fp32 copies on the host, after the last step
  MemoryReport memory;
};

OffloadCudaRun offload_cuda_run(ParallelDims& dims, torch::Dtype dtype, bool offload) {
  auto cfg = vlm::preset("tiny");
  vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta).dtype(dtype));
  vlm::materialize(*model, {torch::kCPU, dtype, 7});
  model->to(dims.device());
  ShardingOptions o;
  o.rules = {{"visual.*", "freeze", ""}, {"model.norm", "ddp", ""}};
  o.default_policy = "fsdp";
  o.default_strategy = "full_shard";
  o.param_dtype = dtype;
  o.optim.lr = 1e-3;
  o.optim.weight_decay = 0.1;
  o.optim.grad_clip = 0.5;
  o.optimizer_offload = offload;
  auto sm = apply_policies(*model, o, dims);
  OffloadCudaRun r;
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step);
    vlm::Batch b;
    b.input_ids = torch::randint(10, 1000, {2, 12}, torch::kInt64).to(dims.device());
    b.labels = b.input_ids.clone();
    auto out = model->forward(b);
    (out.loss_sum / static_cast<double>(out.n_tokens)).backward();
    sm->finish_backward("step");
    r.losses.push_back(out.loss_sum.item<double>() / static_cast<double>(out.n_tokens));
    sm->optimizer().clip_grad_norm();
    sm->optimizer().step();
    sm->optimizer().zero_grad();
  }
  r.memory = sm->memory();
  if (sm->fsdp()) sm->fsdp()->gather_all("test snapshot");
  for (auto& p : model->parameters()) r.params.push_back(p.detach().to(torch::kCPU, torch::kFloat32).clone());
  if (sm->fsdp()) sm->fsdp()->release_all();
  return r;
}

TEST(OffloadCuda, EqualsOnDeviceOptimizer) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible to LibTorch (torch::cuda::is_available() is false); "
                    "the GPU run runs the cuda label on a lent GPU";
  ParallelOptions po;
  po.device = "cuda";
  auto dims = ParallelDims::init(DistEnv{}, po);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    const OffloadCudaRun want = offload_cuda_run(dims, dtype, false);
    const OffloadCudaRun got = offload_cuda_run(dims, dtype, true);
    const double loss_tol = dtype == torch::kFloat32 ? 1e-5 : 1e-3;
    for (size_t s = 0; s < want.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], want.losses[s], loss_tol * std::abs(want.losses[s])) << "step " << s;
    double worst = 0;
    for (size_t i = 0; i < want.params.size(); ++i)
      worst = std::max(worst, (got.params[i] - want.params[i]).abs().max().item<double>());
    if (dtype == torch::kFloat32) {
      EXPECT_LE(worst, 1e-5);
    }
    EXPECT_GT(want.memory.optim_bytes, 0);
    EXPECT_EQ(got.memory.optim_bytes, 0);
    EXPECT_GT(got.memory.host_optim_bytes, 0);
    std::printf("%s: losses %.6f -> %.6f (on-device %.6f), max |param diff| %.3g\n",
                dtype == torch::kFloat32 ? "fp32" : "bf16", got.losses.front(), got.losses.back(),
                want.losses.back(), worst);
  }
}

}  // namespace

// Every copy-back of a device runs on one dedicated stream: the same stream each time, and
// none of the 32 pool streams PyTorch hands out round-robin (the NCCL lanes' streams come
// from that pool).
TEST(OffloadCuda, CopyBackHasItsOwnStream) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible to LibTorch (torch::cuda::is_available() is false); "
                    "the GPU run (scripts/gpu/device_run.sh) runs the cuda label on a lent GPU";
  const auto a = vlm::sharding::offload_stream(0), b = vlm::sharding::offload_stream(0);
  EXPECT_EQ(a.id(), b.id());
  for (int k = 0; k < 64; ++k) {
    EXPECT_NE(c10::cuda::getStreamFromPool(false, 0).id(), a.id());
    EXPECT_NE(c10::cuda::getStreamFromPool(true, 0).id(), a.id());
  }
  auto dst = torch::zeros({1000}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16));
  auto src = vlm::sharding::host_zeros(1000, dst.device()).fill_(1.5);
  vlm::sharding::copy_back({dst}, {src});
  EXPECT_EQ(dst.to(torch::kFloat32).sum().item<double>(), 1500.0);
}

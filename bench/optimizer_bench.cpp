// Optimizer step time on CPU (grad norm + AdamW): the per-parameter loop the optimizer had
// before issue #22 (one .item() per parameter, reproduced here) vs ShardedAdamW with foreach
// ops, with the same ops in cache-sized pieces (kBlocked, bitwise equal to the foreach ops)
// and with the fused kernel (the CPU default for fp32). Not run in CI.
//
//   ./bench/optimizer_bench [fp32]   (OMP_NUM_THREADS sets the threads; fp32: fp32 parameters,
//                                     no masters, as the CPU trainer runs them)
// Times are the fastest of 5 repetitions (the machine may be shared).
//
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "sharding/parallel/optimizer.h"
#include "sharding/dist/parallel_dims.h"

using namespace vlm::sharding;

// One Qwen2-VL-2B decoder layer's
// parameters (46.8M: q/o 1536^2, k/v 256x1536, gate/up/down 8960x1536 and biases, norms),
// bf16 with fp32 masters, world 1: grad norm + AdamW step, per-parameter loop with one
// .item() per parameter (the implementation before issue #22, reproduced here) vs
// ShardedAdamW with foreach ops vs ShardedAdamW with the fused kernel.
int main(int argc, char** argv) {
  const bool fp32 = argc > 1 && std::string(argv[1]) == "fp32";
  const torch::Dtype dtype = fp32 ? torch::kFloat32 : torch::kBFloat16;
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  const std::vector<std::vector<int64_t>> shapes = {{1536, 1536}, {1536}, {256, 1536}, {256}, {256, 1536}, {256},
                                                    {1536, 1536}, {8960, 1536}, {8960, 1536}, {1536, 8960}, {1536}, {1536}};
  UnitPlan u;
  u.path = "model.layers.0";
  torch::manual_seed(5);
  for (size_t k = 0; k < shapes.size(); ++k) {
    UnitParam p;
    p.name = "p" + std::to_string(k);
    p.param = (0.02 * torch::randn(shapes[k])).to(dtype).set_requires_grad(true);
    p.param.mutable_grad() = (1e-3 * torch::randn(shapes[k])).to(dtype);
    p.lr = 1e-4;
    p.weight_decay = shapes[k].size() == 2 ? 0.1 : 0.0;
    u.numel += p.param.numel();
    u.params.push_back(p);
  }
  AdamWOptions o;
  o.grad_clip = 1e9;  // norm computed, no clip
  constexpr int kReps = 5;
  auto time_it = [](const std::function<void()>& fn) {
    fn();  // warm-up
    double best = 1e30;
    for (int i = 0; i < kReps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  // Before: the per-parameter loop.
  std::vector<torch::Tensor> master, m, v;
  for (auto& p : u.params) {
    master.push_back(p.param.detach().to(torch::kFloat32).view({-1}));
    m.push_back(torch::zeros_like(master.back()));
    v.push_back(torch::zeros_like(master.back()));
  }
  int64_t t = 0;
  const double loop_s = time_it([&] {
    torch::NoGradGuard ng;
    double sumsq = 0;
    for (auto& p : u.params) {
      torch::Tensor part = p.param.grad().reshape({-1}).to(torch::kDouble);
      sumsq += part.dot(part).item<double>();
    }
    ++t;
    const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t);
    for (size_t k = 0; k < u.params.size(); ++k) {
      auto& p = u.params[k];
      torch::Tensor g = p.param.grad().reshape({-1}).to(torch::kFloat32);
      if (p.weight_decay != 0) master[k].mul_(1 - p.lr * p.weight_decay);
      m[k].mul_(0.9).add_(g, 0.1);
      v[k].mul_(0.999).addcmul_(g, g, 0.001);
      torch::Tensor denom = (v[k].sqrt() / std::sqrt(bc2)).add_(1e-8);
      master[k].addcdiv_(m[k], denom, -p.lr / bc1);
      p.param.detach().view({-1}).copy_(master[k]);
    }
    if (!(sumsq > 0)) std::abort();
  });
  double kernel_s[3];
  const AdamWKernel kernels[3] = {AdamWKernel::kForeach, AdamWKernel::kBlocked, AdamWKernel::kFused};
  for (int k = 0; k < 3; ++k) {
    ShardedAdamW opt(dims.comm(), {u}, o);
    opt.set_kernel(kernels[k]);
    kernel_s[k] = time_it([&] {
      if (!(opt.clip_grad_norm() > 0)) std::abort();
      opt.step();
    });
  }
  std::printf("optimizer step (grad norm + AdamW) on %lld %s parameters, %d threads: per-parameter loop %.3f s, "
              "foreach %.3f s, blocked foreach %.3f s, fused (the CPU default for fp32) %.3f s\n",
              static_cast<long long>(u.numel), fp32 ? "fp32" : "bf16", torch::get_num_threads(), loop_s, kernel_s[0], kernel_s[1], kernel_s[2]);
  return 0;
}

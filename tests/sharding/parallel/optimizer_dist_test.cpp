// ShardedAdamW against torch::optim::AdamW, bit for bit: bf16 parameters with fp32 masters,
// per-parameter lr / weight decay, replicated and ZeRO-1 units, at world 1 (in process) and
// world 3 (real processes; unit sizes not divisible by 3, so the last shard is short).
//
// Every rank sets the same gradients by hand (no DDP here), so each rank's parameters after
// K steps must equal, bitwise, the reference: fp32 copies of the initial bf16 values,
// updated by torch::optim::AdamW with the same (bf16-valued) gradients, cast to bf16. Bitwise
// holds because the master update runs the same fp32 ops in the same order as LibTorch.
// Clipping: the global norm equals sqrt(sum g^2) of every trainable gradient (1e-6
// relative; each rank sums squares over its own ranges, one all-reduce) and gradients are
// scaled by clip / (norm + 1e-6) as torch::nn::utils::clip_grad_norm_ does.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "sharding/dist/comm.h"
#include "sharding/parallel/optimizer.h"
#include "sharding/dist/parallel_dims.h"
#include "tests/dist_testing.h"

using namespace vlm::sharding;

namespace {

constexpr int kOptSteps = 4;

// Two units of two parameters each; unit "b" is ZeRO-1 when zero1.
std::vector<UnitPlan> make_units(bool zero1) {
  torch::manual_seed(3);
  std::vector<UnitPlan> units(2);
  const std::vector<std::vector<int64_t>> shapes = {{7, 5}, {5}, {4, 9}, {11}};
  for (int k = 0; k < 4; ++k) {
    UnitPlan& u = units[k / 2];
    u.path = k < 2 ? "a" : "b";
    u.sharding = (k >= 2 && zero1) ? Sharding::kShardOptimizer : Sharding::kReplicated;
    UnitParam p;
    p.name = u.path + ".p" + std::to_string(k);
    p.param = torch::randn(shapes[k]).to(torch::kBFloat16).set_requires_grad(true);
    p.lr = k == 3 ? 3e-3 : 1e-3;
    p.weight_decay = k % 2 == 0 ? 0.1 : 0.0;
    u.numel += p.param.numel();
    u.params.push_back(p);
  }
  return units;
}

torch::Tensor grad_for(int step, int k, const torch::Tensor& p) {
  torch::manual_seed(100 * step + k);
  return torch::randn(p.sizes()).to(torch::kBFloat16);
}

void run_and_compare(Comm& comm, bool zero1) {
  auto units = make_units(zero1);
  AdamWOptions o;
  o.grad_clip = 0;
  ShardedAdamW opt(comm, units, o);
  // Reference on fp32 copies.
  std::vector<torch::Tensor> ref;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& u : units)
    for (const auto& p : u.params) {
      ref.push_back(p.param.detach().to(torch::kFloat32).clone().set_requires_grad(true));
      auto opts = std::make_unique<torch::optim::AdamWOptions>(p.lr);
      opts->weight_decay(p.weight_decay);
      groups.emplace_back(std::vector<torch::Tensor>{ref.back()}, std::move(opts));
    }
  torch::optim::AdamW ropt(groups, torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < kOptSteps; ++step) {
    int k = 0;
    for (auto& u : units)
      for (auto& p : u.params) {
        torch::Tensor g = grad_for(step, k, p.param);
        p.param.mutable_grad() = g;
        ref[k].mutable_grad() = g.to(torch::kFloat32);
        ++k;
      }
    opt.step();
    ropt.step();
  }
  int k = 0;
  for (const auto& u : units)
    for (const auto& p : u.params) {
      const torch::Tensor want = ref[k++].detach().to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(p.param.detach(), want))
          << p.name << " (zero1 " << zero1 << ", rank " << comm.rank() << "): max |diff| "
          << (p.param.detach().to(torch::kFloat32) - want.to(torch::kFloat32)).abs().max().item<double>();
      EXPECT_FALSE(torch::equal(p.param.detach(), make_units(zero1)[&u - &units[0]].params[&p - &u.params[0]].param))
          << p.name << " did not move";
    }
  // ZeRO-1 state: replicated unit a (40 elements) whole; unit b (36 + 11 = 47) only this
  // rank's range of S = ceil(47 / N); fp32 master + m + v per element (bf16 params).
  const int64_t n = comm.world_size(), r = comm.rank(), s = (47 + n - 1) / n;
  const int64_t owned_b = zero1 ? std::min<int64_t>((r + 1) * s, 47) - std::min<int64_t>(r * s, 47) : 47;
  EXPECT_EQ(opt.state_numel(), 3 * (40 + owned_b));
}

void check_clip(Comm& comm) {
  auto units = make_units(/*zero1=*/true);
  AdamWOptions o;
  o.grad_clip = 0.5;
  ShardedAdamW opt(comm, units, o);
  double sumsq = 0;
  std::vector<torch::Tensor> before;
  int k = 0;
  for (auto& u : units)
    for (auto& p : u.params) {
      torch::Tensor g = grad_for(7, k++, p.param);
      p.param.mutable_grad() = g.clone();
      before.push_back(g.to(torch::kFloat32));
      sumsq += g.to(torch::kDouble).pow(2).sum().item<double>();
    }
  const double norm = opt.clip_grad_norm();
  EXPECT_NEAR(norm, std::sqrt(sumsq), 1e-6 * std::sqrt(sumsq));
  const double coef = 0.5 / (norm + 1e-6);
  ASSERT_LT(coef, 1);
  k = 0;
  for (auto& u : units)
    for (auto& p : u.params) {
      // bf16 grads scaled in bf16: within one bf16 rounding of the exact product.
      const torch::Tensor want = before[k++] * coef;
      const double err = (p.param.grad().to(torch::kFloat32) - want).abs().max().item<double>();
      EXPECT_LE(err, want.abs().max().item<double>() * 1.0 / 128) << p.name;
    }
}

}  // namespace

TEST(OptimizerDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  ParallelOptions po;
  po.timeout = std::chrono::seconds(60);
  po.device = "cpu";
  auto dims = ParallelDims::init(detect_dist_env(process_env()), po);
  run_and_compare(dims.comm(), false);
  run_and_compare(dims.comm(), true);
  check_clip(dims.comm());
  dims.comm().barrier("end");
}

TEST(OptimizerDist, World3) {
  vlm::test::DistRun run;
  run.world_size = 3;
  run.timeout = std::chrono::seconds(120);
  run.worker_test = "OptimizerDist.DISABLED_Worker";
  EXPECT_TRUE(vlm::test::all_ok(vlm::test::run_workers(run)));
}

TEST(OptimizerDist, World1) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  run_and_compare(dims.comm(), false);
  run_and_compare(dims.comm(), true);
  check_clip(dims.comm());
}

// at::_fused_adamw_ (the CUDA path, run here through its CPU kernel) against
// torch::optim::AdamW: fp32 parameters, per-parameter lr / weight decay, 4 steps. The fused
// kernel rounds differently (lerp for m, its own order for the bias corrections): within
// 1e-6 absolute (parameters are O(1), the updates O(1e-3)).
TEST(OptimizerDist, FusedKernelMatchesTorchAdamW) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  auto units = make_units(false);
  for (auto& u : units)
    for (auto& p : u.params) p.param = p.param.detach().to(torch::kFloat32).set_requires_grad(true);
  AdamWOptions o;
  o.grad_clip = 0;
  ShardedAdamW opt(dims.comm(), units, o);
  opt.set_kernel(AdamWKernel::kFused);
  std::vector<torch::Tensor> ref;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& u : units)
    for (const auto& p : u.params) {
      ref.push_back(p.param.detach().clone().set_requires_grad(true));
      auto opts = std::make_unique<torch::optim::AdamWOptions>(p.lr);
      opts->weight_decay(p.weight_decay);
      groups.emplace_back(std::vector<torch::Tensor>{ref.back()}, std::move(opts));
    }
  torch::optim::AdamW ropt(groups, torch::optim::AdamWOptions(1e-3));
  for (int step = 0; step < kOptSteps; ++step) {
    int k = 0;
    for (auto& u : units)
      for (auto& p : u.params) {
        torch::Tensor g = grad_for(step, k, p.param).to(torch::kFloat32);
        p.param.mutable_grad() = g;
        ref[k++].mutable_grad() = g.clone();
      }
    opt.step();
    ropt.step();
  }
  int k = 0;
  for (const auto& u : units)
    for (const auto& p : u.params) {
      const double d = (p.param.detach() - ref[k++].detach()).abs().max().item<double>();
      EXPECT_LE(d, 1e-6) << p.name;
    }
}

// kBlocked (the foreach ops on 256K-element pieces in one parallel_for) on parameters of
// several pieces with ragged ends, fp32 and bf16: bitwise equal to torch::optim::AdamW and
// to kForeach, at 1 and 2 intra-op threads; the grad norm (fp64, pieces in parallel) within
// 1e-12 of an fp64 sum of squares. The CPU default (kAuto: fp32 masters and gradients) is
// the fused kernel: bitwise equal to kFused (whose distance to torch::optim::AdamW
// FusedKernelMatchesTorchAdamW bounds).
TEST(OptimizerDist, BlockedKernelMatchesTorchAdamWOnLargeParams) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  const int threads = torch::get_num_threads();
  for (int nt : {1, 2}) {
    torch::set_num_threads(nt);
    for (torch::Dtype dt : {torch::kFloat32, torch::kBFloat16}) {
      auto make = [&] {
        torch::manual_seed(11);
        UnitPlan u;
        u.path = "big";
        const std::vector<std::vector<int64_t>> shapes = {{517, 1031}, {3}, {256 * 1024 + 16}, {300, 7}};
        for (size_t k = 0; k < shapes.size(); ++k) {
          UnitParam p;
          p.name = "big.p" + std::to_string(k);
          p.param = torch::randn(shapes[k]).to(dt).set_requires_grad(true);
          p.lr = k == 1 ? 3e-3 : 1e-3;
          p.weight_decay = k % 2 == 0 ? 0.1 : 0.0;
          u.numel += p.param.numel();
          u.params.push_back(p);
        }
        return std::vector<UnitPlan>{u};
      };
      auto units = make(), units_fe = make(), units_auto = make(), units_fused = make();
      AdamWOptions o;
      o.grad_clip = 0;
      ShardedAdamW opt(dims.comm(), units, o), opt_fe(dims.comm(), units_fe, o);
      ShardedAdamW opt_auto(dims.comm(), units_auto, o), opt_fused(dims.comm(), units_fused, o);
      opt.set_kernel(AdamWKernel::kBlocked);
      opt_fe.set_kernel(AdamWKernel::kForeach);
      opt_fused.set_kernel(AdamWKernel::kFused);
      ASSERT_EQ(opt_auto.kernel(), AdamWKernel::kAuto);
      std::vector<torch::Tensor> ref;
      std::vector<torch::optim::OptimizerParamGroup> groups;
      for (const auto& p : units[0].params) {
        ref.push_back(p.param.detach().to(torch::kFloat32).clone().set_requires_grad(true));
        auto ro = std::make_unique<torch::optim::AdamWOptions>(p.lr);
        ro->weight_decay(p.weight_decay);
        groups.emplace_back(std::vector<torch::Tensor>{ref.back()}, std::move(ro));
      }
      torch::optim::AdamW ropt(groups, torch::optim::AdamWOptions(1e-3));
      for (int step = 0; step < 3; ++step) {
        double sumsq = 0;
        for (size_t k = 0; k < ref.size(); ++k) {
          torch::Tensor g = grad_for(step, static_cast<int>(k), units[0].params[k].param);
          units[0].params[k].param.mutable_grad() = g;
          units_fe[0].params[k].param.mutable_grad() = g.clone();
          units_auto[0].params[k].param.mutable_grad() = g.clone();
          units_fused[0].params[k].param.mutable_grad() = g.clone();
          ref[k].mutable_grad() = g.to(torch::kFloat32);
          sumsq += g.to(torch::kDouble).pow(2).sum().item<double>();
        }
        const double norm = opt.clip_grad_norm();
        EXPECT_NEAR(norm, std::sqrt(sumsq), 1e-12 * std::sqrt(sumsq)) << "threads " << nt;
        opt.step();
        opt_fe.step();
        opt_auto.step();
        opt_fused.step();
        ropt.step();
      }
      bool kernels_differ = false;
      for (size_t k = 0; k < ref.size(); ++k) {
        const torch::Tensor got = units[0].params[k].param.detach();
        EXPECT_TRUE(torch::equal(got, ref[k].detach().to(dt))) << units[0].params[k].name << " threads " << nt;
        EXPECT_TRUE(torch::equal(got, units_fe[0].params[k].param.detach())) << units[0].params[k].name;
        const torch::Tensor fused = units_fused[0].params[k].param.detach();
        EXPECT_TRUE(torch::equal(units_auto[0].params[k].param.detach(), fused)) << units[0].params[k].name << " (kAuto)";
        kernels_differ = kernels_differ || !torch::equal(fused, got);
      }
      // kAuto is not kBlocked on fp32 (in some bit), so the kAuto == kFused check has teeth.
      if (dt == torch::kFloat32) EXPECT_TRUE(kernels_differ) << "threads " << nt;
    }
  }
  torch::set_num_threads(threads);
}

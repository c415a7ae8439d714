// DDP (+ ZeRO-1, freeze, AdamW, global grad clip) with real worker processes on Gloo over
// loopback, against a single-process reference that uses no sharding code: plain autograd
// on the whole global batch, torch::nn::utils::clip_grad_norm_ and torch::optim::AdamW.
//
// Setup: the tiny preset, fp32, seed 7. Global batch per step: 6 samples of equal length
// (5 random text ids in [10, 1000), <vs>, 4 image tokens (grid 1x4x4 or 1x2x8), <ve>, 6
// supervised answer ids) with random pixel_values [16, 1176]; rank r takes samples
// r, r+N, ...; with G micro-batches per step, micro-batch k of a rank takes its samples
// i with i % G == k (an empty one is a filler: sample 0 with every label -100, so the
// rank still runs every collective). Every micro-batch's loss is divided by the global
// supervised token count (global_token_count), no_sync on all but the last micro-batch.
// Configurations: (a) everything ddp; (b) vision frozen, merger ddp, LLM ddp + ZeRO-1.
// Optimizer: lr 1e-3 (merger 2e-3 via a group), weight decay 0.1 except biases and norms,
// grad clip 1.0; K = 5 steps; buckets of 0.05 MiB (many buckets, so overlap is visible).
//
// Tolerances: per-step loss within 1e-5 relative; step-0 reduced gradients within 1e-6 of
// the largest gradient (measured: ~1.4e-7 / 0.18); every parameter within 1e-5 absolute
// after 5 steps (fp32; only the summation order of gradients differs). Measured worst:
// 8.6e-6 (visual.merger.mlp.2.weight, accumulation 3): AdamW divides by sqrt(v) + eps, so
// elements whose gradient is near zero turn fp32 summation noise into update noise of the
// order of lr (with eps = 1e-5 instead of 1e-8 the same runs agree within 1.2e-7); hence
// lr 1e-4 here. Frozen parameters: bit-identical, no grad, no optimizer state.
// Also checked: ZeRO-1 state is 1/N of the LLM's (closed form from the unit sizes), bytes
// all-reduced in one step on the data plane = 2(N-1)/N x (trainable fp32 bytes + 2 scalars
// of 8 bytes: token count, loss) and on the control plane 2(N-1)/N x (the grad norm's 8
// bytes + one 8-byte had-gradient flag per trainable parameter),
// bytes all-gathered = (N-1)/N x the ZeRO-1 units padded to N shards; frozen units move
// nothing; at least one bucket is launched while backward still runs (overlap).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

#include "sharding/comm.h"
#include "sharding/ddp.h"
#include "sharding/parallel_dims.h"
#include "sharding/sharded_model.h"
#include "tests/dist_testing.h"
#include "vlm/check.h"
#include "vlm/meta_init.h"
#include "vlm/qwen2_vl.h"

using namespace vlm::sharding;

namespace {

constexpr int kSamples = 6;
constexpr int kSteps = 5;
constexpr double kLr = 1e-4, kMergerLr = 2e-4, kWd = 0.1, kClip = 1.0;

vlm::Qwen2VL make_model(torch::Dtype dtype = torch::kFloat32) {
  vlm::Qwen2VL m(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, dtype, 7});
  return m;
}

struct Sample {
  std::vector<int64_t> ids, labels;
  torch::Tensor pixels;  // [16, 1176]
  std::vector<int64_t> grid;
};

// Deterministic sample `i` of step `step` (same on every rank).
Sample make_sample(const vlm::VlmConfig& c, int step, int i) {
  torch::manual_seed(1000 * step + i);
  Sample s;
  auto text = torch::randint(10, 1000, {11}, torch::kInt64);
  for (int k = 0; k < 5; ++k) s.ids.push_back(text[k].item<int64_t>());
  s.ids.push_back(c.vision_start_token_id);
  for (int k = 0; k < 4; ++k) s.ids.push_back(c.image_token_id);
  s.ids.push_back(c.vision_end_token_id);
  s.labels.assign(s.ids.size(), -100);
  for (int k = 5; k < 11; ++k) {
    s.ids.push_back(text[k].item<int64_t>());
    s.labels.push_back(text[k].item<int64_t>());
  }
  s.pixels = torch::randn({16, c.vision.patch_dim()});
  s.grid = (i % 2 == 0) ? std::vector<int64_t>{1, 4, 4} : std::vector<int64_t>{1, 2, 8};
  return s;
}

// Equal-length samples -> one Batch without padding.
vlm::Batch pack(const std::vector<Sample>& samples, torch::Dtype pixel_dtype = torch::kFloat32) {
  const int64_t b = static_cast<int64_t>(samples.size()), l = static_cast<int64_t>(samples[0].ids.size());
  vlm::Batch batch;
  std::vector<int64_t> ids, labels, grid;
  std::vector<torch::Tensor> pix;
  for (const auto& s : samples) {
    ids.insert(ids.end(), s.ids.begin(), s.ids.end());
    labels.insert(labels.end(), s.labels.begin(), s.labels.end());
    grid.insert(grid.end(), s.grid.begin(), s.grid.end());
    pix.push_back(s.pixels);
  }
  batch.input_ids = torch::tensor(ids, torch::kInt64).view({b, l});
  batch.labels = torch::tensor(labels, torch::kInt64).view({b, l});
  batch.pixel_values = torch::cat(pix).to(pixel_dtype);
  batch.image_grid_thw = torch::tensor(grid, torch::kInt64).view({b, 3});
  return batch;
}

bool no_decay(const std::string& n) {
  auto ends = [&](const std::string& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  return ends(".bias") || (n.find("norm") != std::string::npos && ends(".weight")) || ends("ln_q.weight");
}

bool frozen_in(char config, const std::string& name) {
  return config == 'b' && (name.rfind("visual.patch_embed.", 0) == 0 || name.rfind("visual.blocks.", 0) == 0);
}

struct RunResult {
  std::vector<double> losses;                    // global loss per step (before the update)
  std::vector<std::pair<std::string, torch::Tensor>> params;  // after kSteps
  std::map<std::string, torch::Tensor> grads0;   // step-0 gradients before clipping
};

// Single process, no sharding code.
RunResult reference_run(char config) {
  auto model = make_model();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<torch::Tensor> trainable;
  for (auto& item : model->named_parameters()) {
    torch::Tensor p = item.value();
    if (frozen_in(config, item.key())) {
      p.set_requires_grad(false);
      continue;
    }
    auto o = std::make_unique<torch::optim::AdamWOptions>(
        item.key().rfind("visual.merger.", 0) == 0 ? kMergerLr : kLr);
    o->weight_decay(no_decay(item.key()) ? 0.0 : kWd);
    groups.emplace_back(std::vector<torch::Tensor>{p}, std::move(o));
    trainable.push_back(p);
  }
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(kLr));
  RunResult r;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Sample> all;
    for (int i = 0; i < kSamples; ++i) all.push_back(make_sample(model->cfg, step, i));
    auto out = model->forward(pack(all));
    (out.loss_sum / static_cast<double>(out.n_tokens)).backward();
    r.losses.push_back(out.loss_sum.item<double>() / static_cast<double>(out.n_tokens));
    if (step == 0)
      for (auto& item : model->named_parameters())
        if (item.value().grad().defined()) r.grads0[item.key()] = item.value().grad().clone();
    torch::nn::utils::clip_grad_norm_(trainable, kClip);
    opt.step();
    opt.zero_grad();
  }
  for (auto& item : model->named_parameters()) r.params.emplace_back(item.key(), item.value().detach().clone());
  return r;
}

ShardingOptions options(char config) {
  ShardingOptions o;
  if (config == 'b') {
    o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", ""},
               {"visual.merger", "ddp", ""},
               {"model.*|lm_head", "ddp", "shard_optimizer"}};
  }
  o.ddp_bucket_mb = 0.05;
  o.optim.lr = kLr;
  o.optim.weight_decay = kWd;
  o.optim.grad_clip = kClip;
  o.optim.groups = {{"visual.merger", kMergerLr, std::nullopt}};
  return o;
}

// Step 1's traffic (see the header comment for the formulas).
void check_traffic(Comm& comm, Comm& control, vlm::Qwen2VLImpl& model, char config) {
  const double n = comm.world_size();
  double trainable = 0, gathered = 0, flags = 0;
  for (const auto& u : model.units()) {
    if (!u.shares_params_with.empty()) continue;
    const int64_t p = vlm::count_parameters(*u.module);
    const bool vision = u.path.rfind("visual.", 0) == 0;
    if (config == 'b' && vision && u.path != "visual.merger") continue;  // frozen
    trainable += 4.0 * p;
    flags += 8.0 * static_cast<double>(u.module->parameters().size());  // one fp64 had-grad flag each
    if (config == 'b' && !vision) gathered += 4.0 * ((p + comm.world_size() - 1) / comm.world_size()) * n;
  }
  const auto& st = comm.stats();
  // Data plane: the gradients, the global token count and this test's loss (8 B each).
  // Control plane: the grad norm's one all-reduce, [sum of squares, had-grad flags] in fp64.
  EXPECT_DOUBLE_EQ(st[OpKind::kAllReduce].logical_bytes, 2 * (n - 1) / n * (trainable + 16));
  EXPECT_DOUBLE_EQ(control.stats()[OpKind::kAllReduce].logical_bytes, 2 * (n - 1) / n * (8 + flags));
  EXPECT_EQ(control.stats()[OpKind::kAllReduce].calls, n > 1 ? 1 : 0);
  EXPECT_DOUBLE_EQ(st[OpKind::kAllGather].logical_bytes, (n - 1) / n * gathered);
  EXPECT_EQ(st[OpKind::kBroadcast].calls, 0);
  std::printf("  step-1 traffic per rank: all-reduce %.0f B, all-gather %.0f B\n",
              st[OpKind::kAllReduce].logical_bytes, st[OpKind::kAllGather].logical_bytes);
}

RunResult sharded_run(ParallelDims& dims, char config, int accum, const RunResult& ref) {
  const int n = dims.world_size(), rank = dims.rank();
  auto model = make_model();
  // Start the ranks apart: the broadcast in apply_policies must make them equal.
  if (rank != 0) {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(0.5);
  }
  std::map<std::string, torch::Tensor> initial;
  auto sm = apply_policies(*model, options(config), dims);
  for (auto& item : model->named_parameters()) initial[item.key()] = item.value().detach().clone();
  Comm& comm = dims.comm();
  RunResult r;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<Sample>> micro(accum);
    int64_t local_tokens = 0;
    for (int i = rank, j = 0; i < kSamples; i += n, ++j) {
      micro[j % accum].push_back(make_sample(model->cfg, step, i));
      for (auto l : micro[j % accum].back().labels) local_tokens += l != -100;
    }
    // (labels[0] is -100 in every sample, so counting all labels = the model's shifted count)
    if (step == 1) {
      comm.reset_stats();
      dims.control().reset_stats();
    }
    const int64_t tokens = global_token_count(comm, local_tokens);
    double loss_sum = 0;
    for (int k = 0; k < accum; ++k) {
      if (micro[k].empty()) {  // filler: runs every unit, contributes nothing
        Sample f = make_sample(model->cfg, step, 0);
        std::fill(f.labels.begin(), f.labels.end(), -100);
        micro[k].push_back(f);
      }
      sm->set_sync(k == accum - 1);
      auto out = model->forward(pack(micro[k]));
      (out.loss_sum / static_cast<double>(tokens)).backward();
      sm->finish_backward("step " + std::to_string(step));
      loss_sum += out.loss_sum.item<double>();
    }
    torch::Tensor l = torch::tensor({loss_sum}, torch::kDouble);
    comm.all_reduce(l, ReduceOp::kSum, "loss");
    r.losses.push_back(l.item<double>() / static_cast<double>(tokens));
    if (step == 0) {  // reduced gradient = single-process gradient of the global batch
      double worst = 0, gmax = 0;
      std::string worst_name;
      for (auto& item : model->named_parameters()) {
        auto it = ref.grads0.find(item.key());
        EXPECT_EQ(it != ref.grads0.end(), item.value().grad().defined()) << item.key();
        if (it == ref.grads0.end() || !item.value().grad().defined()) continue;
        const double d = (item.value().grad() - it->second).abs().max().item<double>();
        gmax = std::max(gmax, it->second.abs().max().item<double>());
        if (d > worst) {
          worst = d;
          worst_name = item.key();
        }
      }
      EXPECT_LE(worst, 1e-6 * gmax) << "gradient of " << worst_name;
      std::printf("  step-0 gradients: max |diff| %.3g (%s), max |grad| %.3g\n", worst, worst_name.c_str(), gmax);
    }
    sm->optimizer().clip_grad_norm();
    sm->optimizer().step();
    sm->optimizer().zero_grad();
    if (step == 1) check_traffic(comm, dims.control(), *model, config);
    if (n > 1 && sm->reducer() != nullptr) {
      EXPECT_GT(sm->reducer()->num_buckets(), 4);
      EXPECT_GT(sm->reducer()->launched_during_backward(), 0) << "no bucket launched during backward";
    }
  }
  for (auto& item : model->named_parameters()) r.params.emplace_back(item.key(), item.value().detach().clone());
  // Frozen: bit-identical, no grad, no optimizer state.
  int64_t frozen = 0;
  for (auto& item : model->named_parameters()) {
    if (!frozen_in(config, item.key())) continue;
    ++frozen;
    EXPECT_TRUE(torch::equal(item.value(), initial[item.key()])) << item.key() << " changed while frozen";
    EXPECT_FALSE(item.value().grad().defined()) << item.key();
    EXPECT_FALSE(sm->optimizer().has_state(item.value())) << item.key();
  }
  EXPECT_EQ(frozen > 0, config == 'b');
  // Optimizer state: m + v (fp32 params are their own masters); ZeRO-1 units hold only
  // this rank's range [r*S, min((r+1)*S, P)), S = ceil(P / N).
  int64_t want_state = 0;
  for (const auto& u : model->units()) {
    if (!u.shares_params_with.empty()) continue;
    const int64_t p = vlm::count_parameters(*u.module);
    const bool vision = u.path.rfind("visual.", 0) == 0;
    if (config == 'a' || u.path == "visual.merger") {
      want_state += 2 * p;
    } else if (!vision) {
      const int64_t sh = (p + n - 1) / n;
      want_state += 2 * (std::min<int64_t>((rank + 1) * sh, p) - std::min<int64_t>(rank * sh, p));
    }
  }
  EXPECT_EQ(sm->optimizer().state_numel(), want_state);
  if (config == 'b') {
    EXPECT_GT(sm->runner()->no_grad_calls(), 0) << "frozen vision ran with autograd";
  }
  return r;
}

void compare(const RunResult& got, const RunResult& want, const std::string& tag) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s])) << tag << " step " << s;
  ASSERT_EQ(got.params.size(), want.params.size());
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < got.params.size(); ++i) {
    ASSERT_EQ(got.params[i].first, want.params[i].first);
    const double d = (got.params[i].second - want.params[i].second).abs().max().item<double>();
    if (d > worst) {
      worst = d;
      worst_name = got.params[i].first;
    }
  }
  EXPECT_LE(worst, 1e-5) << tag << ": worst parameter " << worst_name;
  std::printf("%s: step-0 loss %.6f, last loss %.6f (ref %.6f), max |param diff| %.3g (%s)\n", tag.c_str(),
              got.losses.front(), got.losses.back(), want.losses.back(), worst, worst_name.c_str());
}

ParallelDims init_ddp_worker() {
  ParallelOptions o;
  o.timeout = std::chrono::seconds(120);
  o.device = "cpu";
  return ParallelDims::init(detect_dist_env(process_env()), o);
}

}  // namespace

TEST(DdpDist, DISABLED_ParityWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_ddp_worker();
  for (char config : {'a', 'b'}) {
    const RunResult ref = reference_run(config);
    for (int accum : {1, 3}) {
      const std::string tag = std::string("config ") + config + ", world " + std::to_string(dims.world_size()) +
                              ", accumulation " + std::to_string(accum) + ", rank " + std::to_string(dims.rank());
      compare(sharded_run(dims, config, accum, ref), ref, tag);
    }
  }
  dims.comm().barrier("end");
}

TEST(DdpDist, ParityWorld2) {
  vlmtest::DistRun run;
  run.world_size = 2;
  run.timeout = std::chrono::seconds(400);
  run.worker_test = "DdpDist.DISABLED_ParityWorker";
  auto results = vlmtest::run_workers(run);
  EXPECT_TRUE(vlmtest::all_ok(results));
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
}

TEST(DdpDist, ParityWorld3) {
  vlmtest::DistRun run;
  run.world_size = 3;
  run.timeout = std::chrono::seconds(400);
  run.worker_test = "DdpDist.DISABLED_ParityWorker";
  auto results = vlmtest::run_workers(run);
  EXPECT_TRUE(vlmtest::all_ok(results));
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
}

// World size 1 (no processes): the same code path equals the reference too.
TEST(DdpDist, ParitySingleProcess) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  for (char config : {'a', 'b'}) {
    const RunResult ref = reference_run(config);
    compare(sharded_run(dims, config, 3, ref), ref, std::string("config ") + config + ", world 1, accumulation 3");
  }
}

// Unused parameters: rank 0 runs the full model; rank 1 backpropagates only through the
// vision tower (the LLM's parameters get no gradient at all, so their buckets fill only
// in finish_backward, with zeros); rank 2 (world 3) runs no backward at all. Nothing
// hangs, and every rank ends with rank 0's gradient, which must equal a single-process
// gradient of rank 0's batch (within 1e-6 of the largest gradient).
TEST(DdpDist, DISABLED_UnusedParamsWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_ddp_worker();
  auto model = make_model();
  ShardingOptions o;
  o.ddp_bucket_mb = 0.05;
  auto sm = apply_policies(*model, o, dims);
  std::vector<Sample> samples = {make_sample(model->cfg, 0, 0), make_sample(model->cfg, 0, 1)};
  const vlm::Batch batch = pack(samples);
  if (dims.rank() == 0) {
    auto out = model->forward(batch);
    (out.loss_sum / static_cast<double>(out.n_tokens)).backward();
  } else if (dims.rank() == 1) {
    (model->image_features(batch.pixel_values, batch.image_grid_thw).sum() * 0).backward();
  }
  sm->finish_backward("unused-params test");
  // Reference: the same batch on a fresh model in this process.
  auto ref = make_model();
  auto out = ref->forward(batch);
  (out.loss_sum / static_cast<double>(out.n_tokens)).backward();
  auto got = model->named_parameters();
  auto want = ref->named_parameters();
  double worst = 0, gmax = 0;
  for (const auto& item : want) {
    const torch::Tensor& g = got[item.key()].grad();
    ASSERT_TRUE(g.defined()) << item.key() << ": no gradient after finish_backward";
    worst = std::max(worst, (g - item.value().grad()).abs().max().item<double>());
    gmax = std::max(gmax, item.value().grad().abs().max().item<double>());
  }
  EXPECT_LE(worst, 1e-6 * gmax);
  std::printf("rank %d: max |grad diff| %.3g of max |grad| %.3g\n", dims.rank(), worst, gmax);
  dims.comm().barrier("end");
}

TEST(DdpDist, UnusedParamsWorld3) {
  vlmtest::DistRun run;
  run.world_size = 3;
  run.timeout = std::chrono::seconds(120);
  run.worker_test = "DdpDist.DISABLED_UnusedParamsWorker";
  auto results = vlmtest::run_workers(run);
  EXPECT_TRUE(vlmtest::all_ok(results));
  for (const auto& r : results) {
    const auto at = r.output.find("max |grad diff|");
    if (at == std::string::npos) continue;
    const size_t begin = r.output.rfind('\n', at) + 1, end = r.output.find('\n', at);
    std::printf("%s\n", r.output.substr(begin, end - begin).c_str());
  }
}

// reduce_dtype = bf16 (fp32 model): each rank backpropagates its own batch; after
// finish_backward every gradient is the bf16-rounded sum of the ranks' gradients. Bound per
// element: each rank's gradient is rounded to bf16 (unit roundoff 2^-8: 8 significant
// bits), the fp32 sum of the rounded values is rounded to bf16 again:
// |got - exact| <= 2^-8 sum_r |g_r| + 2^-8 |sum| (1 + 2^-8) <= 2^-7 (1 + 2^-8) sum_r |g_r|.
// (Example seen: 0.0632451 + 0.0666758 -> 0.0634766 + 0.0668945 = 0.1303711, a tie, -> 0.1308594.)
TEST(DdpDist, DISABLED_Bf16ReduceWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_ddp_worker();
  const int n = dims.world_size();
  auto model = make_model();
  ShardingOptions o;
  o.reduce_dtype = torch::kBFloat16;
  o.ddp_bucket_mb = 0.05;
  auto sm = apply_policies(*model, o, dims);
  auto cfg = model->cfg;
  {
    auto out = model->forward(pack({make_sample(cfg, 3, dims.rank())}));
    out.loss_sum.backward();
  }
  sm->finish_backward("bf16 reduce test");
  // Reference: every rank's batch on a fresh model here; exact fp32 sum and |g| sum.
  std::map<std::string, torch::Tensor> sum, abs_sum;
  for (int r = 0; r < n; ++r) {
    auto ref = make_model();
    ref->forward(pack({make_sample(cfg, 3, r)})).loss_sum.backward();
    for (auto& item : ref->named_parameters()) {
      torch::Tensor g = item.value().grad();
      if (!sum.count(item.key())) {
        sum[item.key()] = torch::zeros_like(g);
        abs_sum[item.key()] = torch::zeros_like(g);
      }
      sum[item.key()] += g;
      abs_sum[item.key()] += g.abs();
    }
  }
  int64_t bad = 0, total = 0;
  for (auto& item : model->named_parameters()) {
    const torch::Tensor err = (item.value().grad() - sum[item.key()]).abs();
    const torch::Tensor bound = abs_sum[item.key()] * (std::ldexp(1.0, -7) * (1 + std::ldexp(1.0, -8))) + 1e-30;
    const int64_t b = (err > bound).sum().item<int64_t>();
    if (b > 0 && bad == 0) {
      auto idx = (err - bound).reshape({-1}).argmax().item<int64_t>();
      std::printf("worst %s: got %.9g exact %.9g abs %.9g\n", item.key().c_str(),
                  item.value().grad().reshape({-1})[idx].item<double>(), sum[item.key()].reshape({-1})[idx].item<double>(),
                  abs_sum[item.key()].reshape({-1})[idx].item<double>());
    }
    bad += b;
    total += err.numel();
    // The result is representable in bf16 (it went through a bf16 buffer).
    EXPECT_TRUE(torch::equal(item.value().grad(), item.value().grad().to(torch::kBFloat16).to(torch::kFloat32)))
        << item.key();
  }
  EXPECT_EQ(bad, 0) << "of " << total << " gradient elements outside the bf16 bound";
  dims.comm().barrier("end");
}

TEST(DdpDist, Bf16ReduceWorld2) {
  vlmtest::DistRun run;
  run.world_size = 2;
  run.timeout = std::chrono::seconds(120);
  run.worker_test = "DdpDist.DISABLED_Bf16ReduceWorker";
  EXPECT_TRUE(vlmtest::all_ok(vlmtest::run_workers(run)));
}

// Misuse: two synced backwards without finish_backward in between would lose the second
// gradient (its bucket is already in flight): the second backward throws a clear error.
TEST(DdpDist, SecondSyncedBackwardWithoutFinishThrows) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  auto model = make_model();
  auto sm = apply_policies(*model, ShardingOptions{}, dims);
  const vlm::Batch batch = pack({make_sample(model->cfg, 0, 0)});
  model->forward(batch).loss_sum.backward();
  try {
    model->forward(batch).loss_sum.backward();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("second gradient before finish_backward"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- bf16 params, fp32 reduce

// bf16 parameters with reduce_dtype fp32: a DDP gradient accumulates over the micro-batches
// of a step in fp32 (in the bucket buffer, ddp.h) and reaches the optimizer in fp32.
// Step 0, 3 micro-batches per rank of one sample each (rank r's micro-batch k: sample
// 3r + k), loss / global token count, configurations (a) all ddp and (b) frozen vision,
// ZeRO-1 LLM. Reference: each micro-batch alone through a plain bf16 model (same initial
// weights), its bf16 gradient summed in fp64 over micro-batches and ranks (exact). What the
// optimizer reads (DdpReducer::grad, the function ShardedAdamW::param_grad uses) must be
// fp32 and within 1e-6 x (sum of |per-micro-batch gradients|) of it, per element: the
// fp32 sum of 3N terms has at most 3N - 1 roundings of 2^-24 of a partial sum, and each
// partial sum is bounded by that |g| sum. The old path (bf16 .grad summed in bf16 by
// autograd, fp32 all-reduce, rounded back to bf16) is emulated on the same per-micro-batch
// gradients and must be measurably worse (> 1e-4 of the |g| sum somewhere: one bf16
// rounding is up to 2^-9), so the check can fail. Also: no bf16 .grad is kept on the DDP
// parameters, the global grad norm the optimizer computes equals the exact one (1e-6
// relative), and zero_grad() empties the accumulation.
namespace {

struct AccumErrors {
  double new_worst = 0, old_worst = 0;  // max over elements of |err| / (sum |g| + 1e-30)
  double new_rel = 0, old_rel = 0;      // ||err||_2 / ||exact||_2
};

constexpr int kMicro = 3;

AccumErrors check_bf16_accumulation(ParallelDims& dims, char config) {
  const int n = dims.world_size(), rank = dims.rank();
  auto model = make_model(torch::kBFloat16);
  ShardingOptions o = options(config);
  o.param_dtype = torch::kBFloat16;
  o.reduce_dtype = torch::kFloat32;
  auto sm = apply_policies(*model, o, dims);
  const auto cfg = model->cfg;
  auto sample = [&](int r, int k) { return make_sample(cfg, 0, kMicro * r + k); };
  int64_t local_tokens = 0;
  for (int k = 0; k < kMicro; ++k)
    for (auto l : sample(rank, k).labels) local_tokens += l != -100;
  const int64_t tokens = global_token_count(dims.comm(), local_tokens);
  for (int k = 0; k < kMicro; ++k) {
    sm->set_sync(k == kMicro - 1);
    auto out = model->forward(pack({sample(rank, k)}, torch::kBFloat16));
    (out.loss_sum / static_cast<double>(tokens)).backward();
    sm->finish_backward("bf16 accumulation micro-batch " + std::to_string(k));
  }
  // Reference on a plain bf16 model: every rank's every micro-batch alone.
  auto ref = make_model(torch::kBFloat16);
  std::map<std::string, torch::Tensor> exact, abs_sum, old_sum;  // fp64, fp64, fp32
  for (int r = 0; r < n; ++r) {
    std::map<std::string, torch::Tensor> acc;  // this rank's bf16 .grad as autograd sums it
    for (int k = 0; k < kMicro; ++k) {
      for (auto& p : ref->parameters()) p.mutable_grad() = torch::Tensor();
      auto out = ref->forward(pack({sample(r, k)}, torch::kBFloat16));
      (out.loss_sum / static_cast<double>(tokens)).backward();
      for (auto& item : ref->named_parameters()) {
        const torch::Tensor g = item.value().grad();
        if (!g.defined() || frozen_in(config, item.key())) continue;
        EXPECT_EQ(g.scalar_type(), torch::kBFloat16);
        if (!exact.count(item.key())) {
          exact[item.key()] = torch::zeros_like(g, torch::kFloat64);
          abs_sum[item.key()] = torch::zeros_like(g, torch::kFloat64);
        }
        exact[item.key()] += g.to(torch::kFloat64);
        abs_sum[item.key()] += g.abs().to(torch::kFloat64);
        acc[item.key()] = acc.count(item.key()) ? acc[item.key()] + g : g.clone();  // bf16 + bf16 -> bf16
      }
    }
    for (auto& [name, a] : acc) {  // the old fp32 all-reduce of the bf16 accumulations
      if (!old_sum.count(name)) old_sum[name] = torch::zeros_like(a, torch::kFloat32);
      old_sum[name] += a.to(torch::kFloat32);
    }
  }
  AccumErrors e;
  double new_sq = 0, old_sq = 0, exact_sq = 0;
  std::string worst_name;
  DdpReducer* ddp = sm->reducer();
  EXPECT_NE(ddp, nullptr);
  if (ddp == nullptr) return e;
  for (auto& item : model->named_parameters()) {
    const torch::Tensor& p = item.value();
    if (frozen_in(config, item.key())) continue;
    EXPECT_FALSE(p.grad().defined()) << item.key() << ": a bf16 .grad is kept";
    const int64_t idx = ddp->index_of(p);
    EXPECT_GE(idx, 0) << item.key();
    if (idx < 0) continue;
    EXPECT_TRUE(ddp->grad_in_bucket(idx)) << item.key();
    const torch::Tensor got = ddp->grad(idx);
    EXPECT_TRUE(got.defined()) << item.key();
    if (!got.defined()) continue;
    EXPECT_EQ(got.scalar_type(), torch::kFloat32) << item.key();
    auto it = exact.find(item.key());
    const torch::Tensor want = it != exact.end() ? it->second : torch::zeros_like(got, torch::kFloat64);
    const torch::Tensor denom = (it != exact.end() ? abs_sum[item.key()] : torch::zeros_like(want)) + 1e-30;
    const torch::Tensor old = it != exact.end() ? old_sum[item.key()].to(torch::kBFloat16).to(torch::kFloat64)
                                                : torch::zeros_like(want);
    const torch::Tensor err_new = got.to(torch::kFloat64) - want, err_old = old - want;
    const double w = (err_new.abs() / denom).max().item<double>();
    if (w > e.new_worst) {
      e.new_worst = w;
      worst_name = item.key();
    }
    e.old_worst = std::max(e.old_worst, (err_old.abs() / denom).max().item<double>());
    new_sq += err_new.square().sum().item<double>();
    old_sq += err_old.square().sum().item<double>();
    exact_sq += want.square().sum().item<double>();
  }
  e.new_rel = std::sqrt(new_sq / exact_sq);
  e.old_rel = std::sqrt(old_sq / exact_sq);
  const std::string tag = vlm::str("config ", config, ", world ", n, ", rank ", rank);
  EXPECT_LE(e.new_worst, 1e-6) << tag << ": worst " << worst_name;
  EXPECT_GT(e.old_worst, 1e-4) << tag << ": the emulated bf16 path is not measurably worse";
  EXPECT_LT(100 * e.new_rel, e.old_rel) << tag;
  // The optimizer's global norm reads the same fp32 gradients.
  const double norm = sm->optimizer().clip_grad_norm();
  EXPECT_NEAR(norm, std::sqrt(exact_sq), 1e-6 * std::sqrt(exact_sq)) << tag;
  sm->optimizer().step();
  sm->optimizer().zero_grad();
  for (auto& item : model->named_parameters()) {
    if (frozen_in(config, item.key())) continue;
    const int64_t idx = ddp->index_of(item.value());
    EXPECT_FALSE(ddp->grad(idx).defined()) << item.key() << " after zero_grad";
    EXPECT_FALSE(ddp->had_grad(idx)) << item.key() << " after zero_grad";
  }
  std::printf("%s: gradient error / sum|g| worst: fp32 accumulation %.3g, old bf16 path %.3g; ||err||/||g||: "
              "%.3g vs %.3g; grad norm %.6g (exact %.6g)\n",
              tag.c_str(), e.new_worst, e.old_worst, e.new_rel, e.old_rel, norm, std::sqrt(exact_sq));
  return e;
}

}  // namespace

TEST(DdpDist, DISABLED_Bf16AccumulationWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_ddp_worker();
  for (char config : {'a', 'b'}) check_bf16_accumulation(dims, config);
  dims.comm().barrier("end");
}

TEST(DdpDist, Bf16AccumulationWorld2) {
  vlmtest::DistRun run;
  run.world_size = 2;
  run.timeout = std::chrono::seconds(180);
  run.worker_test = "DdpDist.DISABLED_Bf16AccumulationWorker";
  auto results = vlmtest::run_workers(run);
  EXPECT_TRUE(vlmtest::all_ok(results));
  for (const auto& r : results) {
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      if (line.find("gradient error") != std::string::npos) std::printf("%s\n", line.c_str());
  }
}

TEST(DdpDist, Bf16AccumulationSingleProcess) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  for (char config : {'a', 'b'}) check_bf16_accumulation(dims, config);
}

// A few steps of bf16 parameters (fp32 masters, fp32 reduce and accumulation) against fp32
// parameters, world 1, accumulation 3, the parity setup's optimizer: per-step losses within
// 2e-2 relative (bf16 forward rounding; the updates themselves are fp32).
TEST(DdpDist, Bf16LossesFollowFp32) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  std::map<int, std::vector<double>> losses;  // by dtype
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto model = make_model(dtype);
    ShardingOptions o = options('a');
    o.param_dtype = dtype;
    auto sm = apply_policies(*model, o, dims);
    for (int step = 0; step < 3; ++step) {
      std::vector<Sample> micro;
      int64_t tokens = 0;
      for (int k = 0; k < kMicro; ++k) {
        micro.push_back(make_sample(model->cfg, step, k));
        for (auto l : micro.back().labels) tokens += l != -100;
      }
      double loss_sum = 0;
      for (int k = 0; k < kMicro; ++k) {
        sm->set_sync(k == kMicro - 1);
        auto out = model->forward(pack({micro[k]}, dtype));
        (out.loss_sum / static_cast<double>(tokens)).backward();
        sm->finish_backward("loss test");
        loss_sum += out.loss_sum.item<double>();
      }
      losses[static_cast<int>(dtype)].push_back(loss_sum / static_cast<double>(tokens));
      sm->optimizer().clip_grad_norm();
      sm->optimizer().step();
      sm->optimizer().zero_grad();
    }
  }
  const auto& f = losses[static_cast<int>(torch::kFloat32)];
  const auto& b = losses[static_cast<int>(torch::kBFloat16)];
  for (size_t s = 0; s < f.size(); ++s) {
    EXPECT_NEAR(b[s], f[s], 2e-2 * std::abs(f[s])) << "step " << s;
    std::printf("step %zu: loss fp32 %.6f, bf16 %.6f\n", s, f[s], b[s]);
  }
}

// FSDP runtime (full_shard / shard_grad_op / no_shard, frozen sharded units), activation
// checkpointing, mixed precision, memory and traffic accounting, and world-size-independent
// checkpoint state, with real worker processes on Gloo over loopback, against a
// single-process reference that uses no sharding code (plain autograd on the whole global
// batch, torch::nn::utils::clip_grad_norm_, torch::optim::AdamW).
//
// Data and optimizer as in ddp_dist_test.cpp: tiny preset (tied embeddings), fp32, seed 7;
// 6 equal-length samples per step (5 text ids, <vs>, 4 image tokens, <ve>, 6 supervised
// ids; a 16-patch image each); rank r takes samples r, r+N, ...; micro-batch k of G takes
// a rank's j-th sample when j % G == k (an empty micro-batch is a filler with every label
// -100). Each micro-batch loss / global supervised tokens; lr 1e-4 (merger 2e-4), weight
// decay 0.1 except biases and norms, clip 1.0.
// Configurations:
//   frozen-vision: visual.patch_embed|visual.blocks.* freeze + full_shard (frozen sharded:
//                  gather only), visual.merger ddp, model.*|lm_head fsdp <strategy>;
//   all-fsdp:      every unit fsdp <strategy> (vision tower trainable and sharded).
// Activation checkpointing (when on): model.layers.*, model.embed_tokens (with its tied
// lm_head call), visual.merger (a ddp unit); all-fsdp adds visual.blocks.*.
// Tolerances: losses 1e-5 relative, parameters 1e-5 absolute after the run (fp32 summation
// order only; see ddp_dist_test.cpp for why 1e-5 with lr 1e-4).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "sharding/parallel/activation_checkpoint.h"
#include "sharding/dist/comm.h"
#include "sharding/parallel/ddp.h"
#include "sharding/parallel/fsdp.h"
#include "app/plan/memory_plan.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "tests/dist_testing.h"
#include "tests/sharding/parallel/fsdp_testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/model/recompute_tail.h"

using namespace vlm::sharding;
using namespace vlm::app;  // the cost models (app/plan/)
using namespace fsdp_testing;

// ---------------------------------------------------------------- parity

// World 2: full_shard with and without checkpointing, accumulation 1 and 3; shard_grad_op
// and no_shard without checkpointing at accumulation 1 and with it at 3. Other worlds: a
// subset (full_shard +ckpt accum 3, shard_grad_op accum 1).
TEST(FsdpDist, DISABLED_ParityWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  const RunResult ref = reference_run(Config{});
  std::vector<Config> cases;
  for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"})
    for (bool ckpt : {false, true})
      for (int accum : {1, 3}) {
        Config c;
        c.strategy = strategy;
        c.ckpt = ckpt;
        c.accum = accum;
        const bool subset = (c.strategy == "full_shard" && ckpt && accum == 3) ||
                            (c.strategy == "shard_grad_op" && !ckpt && accum == 1);
        const bool world2 = c.strategy == "full_shard" || ckpt == (accum == 3);
        if (dims.world_size() == 2 ? world2 : subset) cases.push_back(c);
      }
  for (const auto& c : cases) compare(sharded_run(dims, c), ref, rank_tag(dims, c));
  dims.comm().barrier("end");
}

TEST(FsdpDist, ParityWorld2) { launch(2, "FsdpDist.DISABLED_ParityWorker", 300); }
TEST(FsdpDist, ParityWorld3) { launch(3, "FsdpDist.DISABLED_ParityWorker", 300); }

// World size 1 (no processes): FSDP units still run (one shard = the whole unit) and give
// the plain result. Also: a non-finite gradient gives a non-finite norm, and zero_grad
// clears the FSDP shard grads (the trainer's non-finite guard).
TEST(FsdpDist, SingleProcess) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  const RunResult ref = reference_run(Config{});
  Config a;
  a.ckpt = true;
  a.accum = 3;
  compare(sharded_run(dims, a), ref, a.tag() + ", world 1");
  Config b;
  b.strategy = "shard_grad_op";
  compare(sharded_run(dims, b), ref, b.tag() + ", world 1");

  auto model = make_model();
  auto sm = apply_policies(*model, options(Config{}), dims);
  auto out = model->forward(pack({make_sample(model->cfg, 0, 0)}));
  (out.loss_sum * std::nan("")).backward();
  sm->finish_backward("nan test");
  EXPECT_TRUE(std::isnan(sm->optimizer().clip_grad_norm()));
  sm->optimizer().zero_grad();
  for (const auto& u : sm->fsdp()->units())
    if (u->trainable()) {
      EXPECT_EQ(u->shard_grad().abs().sum().item<double>(), 0.0) << u->path();
    }
  EXPECT_EQ(sm->optimizer().clip_grad_norm(), 0.0);
}

// ---------------------------------------------------------------- activation checkpointing

// One process, ddp everywhere, every unit checkpointed: the gradients of one backward equal
// a plain model's (1e-6 of the largest gradient), every unit was recomputed, and every
// block's recompute stopped before its last matmul (vlm/model/recompute_tail.h).
TEST(FsdpDist, CheckpointGradientsMatchPlain) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  auto plain = make_model();
  auto model = make_model();
  ShardingOptions o;
  o.checkpoint_match = "visual.*|model.*|lm_head";
  auto sm = apply_policies(*model, o, dims);
  const vlm::Batch batch = pack({make_sample(model->cfg, 0, 0), make_sample(model->cfg, 0, 1)});
  const int64_t before = checkpoint_recomputes();
  const int64_t tails_before = vlm::recompute_tails_skipped();
  auto out = model->forward(batch);
  EXPECT_EQ(vlm::recompute_tails_skipped(), tails_before) << "the forward itself computes every output";
  (out.loss_sum / static_cast<double>(out.n_tokens)).backward();
  sm->finish_backward("ckpt test");
  const int64_t recomputed = checkpoint_recomputes() - before;
  EXPECT_EQ(vlm::recompute_tails_skipped() - tails_before,
            model->cfg.vision.depth + model->cfg.text.num_hidden_layers);
  auto ref = plain->forward(batch);
  (ref.loss_sum / static_cast<double>(ref.n_tokens)).backward();
  EXPECT_EQ(out.loss_sum.item<double>(), ref.loss_sum.item<double>());
  auto got = model->named_parameters();
  double worst = 0, gmax = 0;
  std::string worst_name;
  for (const auto& item : plain->named_parameters()) {
    const torch::Tensor& g = got[item.key()].grad();
    ASSERT_TRUE(g.defined()) << item.key();
    const double d = (g - item.value().grad()).abs().max().item<double>();
    if (d > worst) {
      worst = d;
      worst_name = item.key();
    }
    gmax = std::max(gmax, item.value().grad().abs().max().item<double>());
  }
  EXPECT_LE(worst, 1e-6 * gmax) << worst_name;
  const int64_t units = static_cast<int64_t>(model->units().size());
  EXPECT_EQ(sm->runner()->checkpointed_calls(), units);
  EXPECT_EQ(recomputed, units);
  std::printf("checkpointing: %lld units recomputed, max |grad diff| %.3g (%s) of max |grad| %.3g\n",
              static_cast<long long>(recomputed), worst, worst_name.c_str(), gmax);
}

// ---------------------------------------------------------------- traffic and memory

// World 4, all-fsdp. Traffic of one step (step 1), Comm's logical bytes of the all-gathers
// and reduce-scatters (M = sum over units of N*S x 4 bytes, fp32): full_shard
// 3(N-1)/N M - (N-1)/N M_L - (N-1)/N M_E, where L is the unit of the last call (lm_head),
// which stays gathered from its forward into its backward, and E the embedding's, which
// backward does not re-gather (its backward never reads the table); shard_grad_op
// 2(N-1)/N M. With the tied embedding E is called twice (model.embed_tokens, lm_head) and
// gathered once more, for the kept last call (L = E): 3(N-1)/N M under full_shard. With
// activation checkpointing of model.embed_tokens its recompute reads the table: +(N-1)/N M_E. Memory (full_shard): persistent params + optimizer state
// per rank within 5% of the total / N (+ padding); three units gathered at once at the peak
// (the running one and two prefetched), within the bytes of the three largest units.
// Losses and parameters also match the single-process run.
TEST(FsdpDist, DISABLED_TrafficMemoryWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  const int n = dims.world_size();
  for (bool tied : {false, true}) {
    Config base;
    base.frozen_vision = false;
    base.tied = tied;
    base.end = 2;
    const RunResult ref = reference_run(base);
    // Unit sizes (unsharded and padded).
    auto m = make_model(torch::kFloat32, tied);
    double flat_bytes = 0, embed_bytes = 0, head_bytes = 0, total_numel = 0, pad_numel = 0;
    std::vector<double> unit_bytes;
    for (const auto& u : m->units()) {
      if (!u.shares_params_with.empty()) continue;
      const int64_t p = vlm::count_parameters(*u.module);
      const int64_t padded = (p + n - 1) / n * n;
      flat_bytes += 4.0 * padded;
      total_numel += p;
      pad_numel += padded - p;
      if (u.path == "model.embed_tokens") embed_bytes = 4.0 * padded;
      if (u.path == "lm_head") head_bytes = 4.0 * padded;
      unit_bytes.push_back(4.0 * padded);
    }
    std::sort(unit_bytes.rbegin(), unit_bytes.rend());
    const double three_largest = unit_bytes.at(0) + unit_bytes.at(1) + unit_bytes.at(2);
    for (const char* strategy : {"full_shard", "shard_grad_op"}) {
      Config c = base;
      c.strategy = strategy;
      const RunResult r = sharded_run(dims, c);
      compare(r, ref, rank_tag(dims, c) + (tied ? " tied" : " untied"));
      const double ring = (n - 1.0) / n;
      const bool full = c.strategy == "full_shard";
      const double last_bytes = tied ? embed_bytes : head_bytes;  // the unit of the lm_head call
      ASSERT_GT(last_bytes, 0.0);
      const double want =
          full ? 3 * ring * flat_bytes + (tied ? 2 * ring * embed_bytes : 0.0) - ring * last_bytes - ring * embed_bytes
               : 2 * ring * flat_bytes;
      const auto& ag = r.step1[OpKind::kAllGather];
      const auto& rs = r.step1[OpKind::kReduceScatter];
      const double got = ag.logical_bytes + rs.logical_bytes;
      EXPECT_NEAR(got, want, 0.01 * want) << c.tag();
      if (dims.rank() == 0)
        std::printf("traffic %s %s world %d: M = %.0f B; logical all-gather %.0f B + reduce-scatter %.0f B = %.0f B "
                    "= %.4f x (N-1)/N M (expected %.4f); bytes moved by the Gloo fallbacks: all-gather %.0f B, "
                    "reduce-scatter (as all-to-all) %.0f B\n",
                    c.strategy.c_str(), tied ? "tied" : "untied", n, flat_bytes, ag.logical_bytes, rs.logical_bytes,
                    got, got / (ring * flat_bytes), want / (ring * flat_bytes), ag.wire_bytes, rs.wire_bytes);
      if (full) {
        const double total = 12.0 * total_numel;  // fp32 params + m + v
        const double mine = r.memory.param_bytes + r.memory.optim_bytes;
        const double pad = 12.0 * pad_numel;
        EXPECT_LE(mine, 1.05 * total / n + pad) << "rank " << dims.rank();
        EXPECT_GE(mine, 0.95 * total / n - pad) << "rank " << dims.rank();
        EXPECT_EQ(r.memory.gathered_peak_units, 3);  // the second look-ahead happens (e.g. over model.norm)
        EXPECT_LE(r.memory.gathered_peak_bytes, three_largest);
        EXPECT_EQ(r.memory.gathered_bytes, 0.0);
        std::printf("memory rank %d (%s): params %.0f B + grads %.0f B + optimizer %.0f B; params+optimizer %.0f B "
                    "vs total/N %.0f B (%.2f%%); gathered peak %lld units, %.0f B (three largest units %.0f B)\n",
                    dims.rank(), tied ? "tied" : "untied", r.memory.param_bytes, r.memory.grad_bytes,
                    r.memory.optim_bytes, mine, total / n, 100.0 * (mine / (total / n) - 1),
                    static_cast<long long>(r.memory.gathered_peak_units), r.memory.gathered_peak_bytes,
                    three_largest);
      }
    }
  }
  dims.comm().barrier("end");
}

TEST(FsdpDist, TrafficMemoryWorld4) {
  auto results = launch(4, "FsdpDist.DISABLED_TrafficMemoryWorker", 240);
  for (size_t i = 1; i < results.size(); ++i) {
    std::istringstream lines(results[i].output);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("memory rank", 0) == 0) std::printf("%s\n", line.c_str());
  }
}

// ---------------------------------------------------------------- mixed precision

// World 2, frozen-vision full_shard, lr 1e-3 on fixed data: bf16 parameters (fp32 masters,
// fp32 reduction) stay within 2e-2 relative of the fp32 run's losses, and the loss falls;
// the same with bf16 gradient reduction (reduce_dtype bf16).
TEST(FsdpDist, DISABLED_Bf16Worker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  Config c;
  c.lr = 1e-3;
  c.fixed_data = true;
  const RunResult fp32 = sharded_run(dims, c);
  c.dtype = torch::kBFloat16;
  const RunResult bf16 = sharded_run(dims, c);
  compare(bf16, fp32, rank_tag(dims, c) + " vs fp32", 2e-2, /*param_tol=*/0);
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.05) << "bf16 run does not train";
  EXPECT_LT(fp32.losses.back(), fp32.losses.front() - 0.05);
  c.reduce = torch::kBFloat16;
  const RunResult bf16_reduce = sharded_run(dims, c);
  compare(bf16_reduce, fp32, rank_tag(dims, c) + " vs fp32", 2e-2, /*param_tol=*/0);
  EXPECT_LT(bf16_reduce.losses.back(), bf16_reduce.losses.front() - 0.05);
  dims.comm().barrier("end");
}

TEST(FsdpDist, Bf16World2) { launch(2, "FsdpDist.DISABLED_Bf16Worker", 180); }

// ---------------------------------------------------------------- text-only micro-batches

// World 2: rank 1's micro-batches never have an image (the model runs its dummy image), with
// the vision tower FSDP-sharded (trainable all-fsdp full_shard, and frozen sharded).
// Nothing hangs (hard timeout), losses are finite, every rank ends with the same parameters.
TEST(FsdpDist, DISABLED_TextOnlyWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  for (bool frozen : {false, true}) {
    Config c;
    c.frozen_vision = frozen;
    c.text_only_rank1 = true;
    c.accum = 2;
    c.ckpt = !frozen;
    c.end = 2;
    const RunResult r = sharded_run(dims, c);
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
    double sum = 0;
    for (const auto& p : r.params) sum += p.second.sum().item<double>();
    torch::Tensor mx = torch::tensor({sum}, torch::kDouble), mn = mx.clone();
    dims.comm().all_reduce(mx, ReduceOp::kMax, "check");
    dims.comm().all_reduce(mn, ReduceOp::kMin, "check");
    EXPECT_EQ(mx.item<double>(), mn.item<double>()) << "ranks disagree on the parameters";
    std::printf("%s: text-only rank 1, losses %.6f %.6f\n", rank_tag(dims, c).c_str(), r.losses[0], r.losses[1]);
  }
  dims.comm().barrier("end");
}

TEST(FsdpDist, TextOnlyWorld2) { launch(2, "FsdpDist.DISABLED_TextOnlyWorker", 120); }

// ---------------------------------------------------------------- checkpoint state

// Frozen-vision full_shard (ckpt on): 2 steps at world 2, state saved (this rank's slices);
// loaded at world 3 and at world 1, 2 more steps; both equal an uninterrupted single-process
// run of 4 steps (losses 1e-5 relative, parameters 1e-5).
Config resume_config(int begin, int end) {
  Config c;
  c.ckpt = true;
  c.begin = begin;
  c.end = end;
  return c;
}

TEST(FsdpDist, DISABLED_SaveWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  Config c = resume_config(0, 2);
  c.save_dir = std::getenv("VLMTRAIN_TEST_STATE_DIR");
  const RunResult ref = reference_run(resume_config(0, 4));
  RunResult r = sharded_run(dims, c);
  for (size_t s = 0; s < r.losses.size(); ++s) EXPECT_NEAR(r.losses[s], ref.losses[s], 1e-5 * ref.losses[s]);
  dims.comm().barrier("end");
}

TEST(FsdpDist, DISABLED_LoadWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  Config c = resume_config(2, 4);
  c.load_dir = std::getenv("VLMTRAIN_TEST_STATE_DIR");
  const RunResult ref = reference_run(resume_config(0, 4));
  compare(sharded_run(dims, c), ref, rank_tag(dims, c) + " resumed at step 2", 1e-5, 1e-5, 2);
  dims.comm().barrier("end");
}

TEST(FsdpDist, ResumeWorld2To3And1) {
  const std::string dir = (fs::temp_directory_path() / vlm::str("vlm_fsdp_state_", ::getpid())).string();
  fs::remove_all(dir);
  auto env = [dir](int) { return std::vector<std::string>{"VLMTRAIN_TEST_STATE_DIR=" + dir}; };
  launch(2, "FsdpDist.DISABLED_SaveWorker", 120, env);
  launch(3, "FsdpDist.DISABLED_LoadWorker", 120, env);
  // World 1 in this process.
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  Config c = resume_config(2, 4);
  c.load_dir = dir;
  compare(sharded_run(dims, c), reference_run(resume_config(0, 4)), c.tag() + ", world 1 resumed at step 2", 1e-5,
          1e-5, 2);
  fs::remove_all(dir);
}

// Pipeline parallelism (sharding/parallel/pipeline.h, vlm/model/pipeline_stage.h), in real
// processes on Gloo over loopback.
//
// Equality with one process (in fp64, so that the fp32 run's own rounding is all the
// difference): per configuration, 10 AdamW steps (clipping active) of a global batch of 4
// image samples and 4 text-only samples of different lengths, built by collate (right padding,
// causal attention without a mask; the same rows on the mask path; packed rows), split over the
// data-parallel groups of each stage into micro-batches of one kind each, run by the 1F1B
// schedule over pp stages (balanced by pipeline_split; stage 0 holds the vision tower and the
// DeepStack layers). The model is loaded on meta from the same seeded random init as the
// one-process reference (no sharding code): each stage materialises its own units only. Compared:
//   - the loss of every step (1e-5 relative) and the gradient norm (1e-5 relative);
//   - every gradient of step 0 before clipping that this rank holds (DDP: the reduced
//     gradients, after the tied embedding's sum between stage 0 and the last stage), max |diff|
//     <= 1e-5 x max(max |grad| of that tensor, 1e-2) (parallel_samples.h: Gated DeltaNet's
//     small per-head gradients); together the stages hold every parameter;
//   - every parameter this rank holds after the 10 steps (FSDP: gathered), 1e-5 absolute;
//   - the parameters of other stages stay on the meta device (never materialised);
//   - step 0's bytes on the pipeline links against the formula: B x L x d x 4 per micro-batch
//     forward on every stage but the last, the same backward on every stage but the first
//     (tp: B x ceil(L / tp) x d x 4, the rank's sequence chunk).
// Families: tiny (Qwen2-VL, tied embeddings: the head on the last stage computes with the
// embedding, whose gradient is summed between stage 0 and the last), tiny-qwen2.5 untied,
// tiny-qwen3 (DeepStack into layers 0 and 1, both on stage 0), tiny-qwen3.5 (Gated DeltaNet),
// tiny-qwen3-moe and tiny-qwen3.5-moe. Layouts: pp 2 at world 2 (m = 4: warm-up, steady state
// and cool-down); dp 2 x pp 2 at world 4 (padded with a filler micro-batch and packed; FSDP
// full_shard inside each stage, activation checkpointing); pp 4 at world 4 (one layer per
// stage, m = 4 and m = 2, i.e. fewer micro-batches than stages); pp 2 x tp 2 at world 4 (the
// stages' layers split by tensor parallelism, each tp rank passing its sequence chunk).
// The world-4 launches are ctest entries of their own (pipeline_4_dist_test.cpp), so that
// each entry stays well inside the dist timeout.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "collate/micro_batch.h"
#include "sharding/parallel/pipeline.h"
#include "sharding/parallel/tensor_parallel.h"
#include "tests/sharding/parallel/fsdp_testing.h"
#include "tests/sharding/parallel/parallel_samples.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/tensor_parallel.h"

namespace {

using namespace vlm::sharding;
using vlm::test::RowLayout;
using vlm::test::grad_diff_floored;
using vlm::test::parallel_batch;
using vlm::test::parallel_sample;
using vlm::test::row_layout_name;
using vlm::test::to_fp64;

constexpr int kPpSteps = 10;
constexpr int kPpPerKind = 4;  // image samples and text-only samples per step (global)
constexpr double kPpLr = 1e-4, kPpWd = 0.1, kPpClip = 0.5;
constexpr uint64_t kPpSeed = 13;

struct PpConfig {
  std::string preset = "tiny";
  bool untie = false;          // tie_word_embeddings = false
  RowLayout layout = RowLayout::kRight;
  std::string policy = "ddp";  // everything: ddp | fsdp
  bool ckpt = false;           // activation checkpointing of the decoder layers
  bool filler = false;         // data-parallel group 1's last text micro-batch is a filler
  int per_micro = 0;           // samples per micro-batch (0: 4 micro-batches per group)
  vlm::VlmConfig cfg() const {
    vlm::VlmConfig c = vlm::preset(preset);
    if (untie) c.tie_word_embeddings = false;
    return c;
  }
  std::string tag(const ParallelDims& dims) const {
    return vlm::str(preset, untie ? " untied" : "", " ", row_layout_name(layout), " ", policy, ckpt ? " +ckpt" : "",
                    filler ? " +filler" : "", " per_micro ", per_micro, " world ", dims.world_size(), " pp ", dims.pp(),
                    " tp ", dims.tp(), " rank ", dims.rank());
  }
};

// Data-parallel group `dp` of `groups`: its samples of each kind (i % groups == dp) in
// micro-batches of `per` samples; the filler group's last text micro-batch a filler.
std::vector<vlm::Batch> ppd_micro_batches(const PpConfig& c, const vlm::VlmConfig& cfg, int step, int dp, int groups) {
  const int per = c.per_micro > 0 ? c.per_micro : std::max(1, kPpPerKind / groups / 2);
  std::vector<vlm::Batch> out;
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<vlm::TokenizedSample> mine;
    for (int i = 0; i < kPpPerKind; ++i)
      if (i % groups == dp) mine.push_back(parallel_sample(cfg, step, kind, i, kPpPerKind));
    for (size_t a = 0; a < mine.size(); a += static_cast<size_t>(per)) {
      std::vector<vlm::TokenizedSample> part(mine.begin() + static_cast<std::ptrdiff_t>(a),
                                             mine.begin() + static_cast<std::ptrdiff_t>(std::min(mine.size(), a + per)));
      out.push_back(parallel_batch(part, cfg, c.layout));
    }
  }
  if (c.filler && dp == 1) out.back() = vlm::collate::filler_micro_batch(0).batch;
  return out;
}

struct PpResult {
  std::vector<double> losses, norms;
  std::map<std::string, torch::Tensor> grads0;  // step 0, before clipping
  std::map<std::string, torch::Tensor> params;  // after the last step
  double sent0 = 0, formula0 = 0;               // step 0's bytes sent on the links, and the formula's
  int64_t meta = 0;                             // parameters left on meta (other stages')
};

// One process in fp64, no sharding code, every micro-batch of every group (the filler's
// samples replaced by a filler, which adds nothing).
PpResult ppd_reference(const PpConfig& c, int groups) {
  vlm::VisionLanguageModel model(c.cfg(), torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat64));
  vlm::materialize(*model, {torch::kCPU, torch::kFloat64, kPpSeed});
  std::vector<torch::optim::OptimizerParamGroup> opt_groups;
  std::vector<torch::Tensor> all;
  for (auto& item : model->named_parameters()) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(kPpLr);
    o->weight_decay(fsdp_testing::no_decay(item.key()) ? 0.0 : kPpWd);
    opt_groups.emplace_back(std::vector<torch::Tensor>{item.value()}, std::move(o));
    all.push_back(item.value());
  }
  torch::optim::AdamW opt(opt_groups, torch::optim::AdamWOptions(kPpLr));
  PpResult r;
  for (int step = 0; step < kPpSteps; ++step) {
    torch::Tensor loss_sum = torch::zeros({}, torch::kFloat64);
    int64_t tokens = 0;
    for (int dp = 0; dp < groups; ++dp)
      for (const vlm::Batch& b : ppd_micro_batches(c, model->cfg, step, dp, groups)) {  // a filler adds 0
        auto out = model->forward(to_fp64(b));
        loss_sum = loss_sum + out.loss_sum.to(torch::kFloat64);
        tokens += out.n_tokens;
      }
    (loss_sum / static_cast<double>(tokens)).backward();
    r.losses.push_back(loss_sum.item<double>() / static_cast<double>(tokens));
    double sumsq = 0;
    for (auto& item : model->named_parameters()) {
      const torch::Tensor g = item.value().grad();
      if (!g.defined()) continue;
      sumsq += g.to(torch::kFloat64).square().sum().item<double>();
      if (step == 0) r.grads0[item.key()] = g.clone();
    }
    r.norms.push_back(std::sqrt(sumsq));
    torch::nn::utils::clip_grad_norm_(all, kPpClip);
    opt.step();
    opt.zero_grad();
  }
  for (auto& item : model->named_parameters()) r.params[item.key()] = item.value().detach().clone();
  return r;
}

ShardingOptions ppd_options(const PpConfig& c) {
  ShardingOptions o;
  o.default_policy = c.policy;
  o.ddp_bucket_mb = 0.05;
  if (c.ckpt) o.checkpoint_match = "model.layers.*";
  o.optim.lr = kPpLr;
  o.optim.weight_decay = kPpWd;
  o.optim.grad_clip = kPpClip;
  return o;
}

PpResult ppd_sharded(ParallelDims& dims, const PpConfig& c) {
  vlm::VlmConfig cfg = c.cfg();
  vlm::VisionLanguageModel full(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat32));
  std::unique_ptr<vlm::ParamSource> source = vlm::init_param_source(*full, {torch::kCPU, torch::kFloat32, kPpSeed});
  if (dims.tp() > 1) {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& p : full->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
    source = tensor_parallel_source(std::move(source), cfg, shapes, dims.tp_rank(), dims.tp());
    cfg.text.tensor_parallel = dims.tp();
  }
  vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat32));
  auto sm = apply_policies(*model, ppd_options(c), dims, source.get());
  const vlm::PipelineStage stage = model->pipeline_stage();
  EXPECT_EQ(stage.index, dims.pp_rank());
  PipelineSchedule pipe(dims, cfg.text.hidden_size, torch::TensorOptions().dtype(torch::kFloat32));
  const int dp = dims.dp_rank(), groups = dims.dp_size();
  PpResult r;
  for (int step = 0; step < kPpSteps; ++step) {
    std::vector<vlm::Batch> micro = ppd_micro_batches(c, cfg, step, dp, groups);
    // The step's supervised tokens, counted once per data-parallel group (stage 0, tp rank 0).
    int64_t local = 0;
    if (dims.pp_rank() == 0 && dims.tp_rank() == 0)
      for (const auto& b : micro) local += vlm::supervised_rows(b.labels).size(0);
    const int64_t tokens = global_token_count(dims.control(), local);
    const double scale = 1.0 / static_cast<double>(tokens);
    if (step == 0) dims.reset_data_stats();
    double loss_sum = 0;
    const int64_t m = static_cast<int64_t>(micro.size());
    PipelineStep ps;
    ps.micro_batches = m;
    ps.rows_and_length = [&](int64_t k) { return std::make_pair(micro[k].input_ids.size(0), micro[k].input_ids.size(1)); };
    ps.forward = [&](int64_t k, const torch::Tensor& input) {
      auto o = model->forward_stage(micro[k], input);
      if (!stage.last()) return o.hidden;
      loss_sum += o.out.loss_sum.item<double>();
      return o.out.loss_sum * scale;
    };
    ps.before_backward = [&](int64_t k) { sm->set_sync(k == m - 1); };
    ps.after_backward = [&](int64_t) { sm->finish_backward(vlm::str("step ", step)); };
    pipe.run(ps, vlm::str("step ", step));
    torch::Tensor l = torch::tensor({loss_sum}, torch::kDouble);
    dims.control().all_reduce(l, ReduceOp::kSum, "test: loss");
    r.losses.push_back(l.item<double>() / static_cast<double>(tokens));  // (tp: each rank's value is 1 / tp)
    if (step == 0) {
      r.sent0 = pipe.sent_bytes();
      for (const auto& b : micro) {
        const int64_t len = (b.input_ids.size(1) + dims.tp() - 1) / dims.tp();  // tp: the rank's chunk
        const double act = static_cast<double>(b.input_ids.size(0) * len * cfg.text.hidden_size) * 4;
        if (!stage.last()) r.formula0 += act;
        if (!stage.first()) r.formula0 += act;
      }
      sm->optimizer().reduce_shared_gradients();
      if (c.policy == "ddp")
        for (const auto& u : sm->unit_table())
          for (const auto& p : u.params) {
            torch::Tensor g = sm->reducer()->grad(sm->reducer()->index_of(p.param));
            r.grads0[p.name] = g.defined() ? g.clone() : torch::zeros_like(p.param);
          }
    }
    r.norms.push_back(sm->optimizer().clip_grad_norm());
    sm->optimizer().step();
    sm->optimizer().zero_grad();
  }
  std::set<std::string> held;
  for (const auto& u : sm->unit_table())
    for (const auto& p : u.params) held.insert(p.name);
  for (const auto& [name, t] : fsdp_testing::snapshot(*sm, *model))
    if (held.count(name)) r.params[name] = t;
  for (const auto& p : model->named_parameters())
    if (!held.count(p.key())) r.meta += p.value().is_meta() ? 1 : 0;
  EXPECT_EQ(static_cast<size_t>(r.meta) + held.size(), model->named_parameters().size())
      << "a parameter of another stage was materialised";
  return r;
}

void ppd_check(ParallelDims& dims, const PpConfig& c) {
  const std::string tag = c.tag(dims);
  const vlm::VlmConfig cfg = c.cfg();
  const PpResult want = ppd_reference(c, dims.dp_size());
  const PpResult got = ppd_sharded(dims, c);
  auto mine = [&](const std::string& name, const torch::Tensor& full) {
    return vlm::tp_slice(full, vlm::tensor_parallel_split(cfg, name, dims.tp()), dims.tp_rank(), dims.tp());
  };
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kPpSteps)) << tag;
  for (int s = 0; s < kPpSteps; ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s]) << tag << " loss, step " << s;
    EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s]) << tag << " grad norm, step " << s;
  }
  EXPECT_GT(want.norms.front(), kPpClip) << "the test needs clipping to be active";
  double worst_grad = 0;
  std::string worst_grad_name;
  for (const auto& [name, g] : got.grads0) {
    ASSERT_TRUE(want.grads0.count(name)) << tag << ": " << name << " has no reference gradient";
    const torch::Tensor ref = mine(name, want.grads0.at(name));
    ASSERT_EQ(g.sizes(), ref.sizes()) << tag << ": " << name;
    const double d = grad_diff_floored(g, ref);
    if (d > worst_grad) worst_grad = d, worst_grad_name = name;
  }
  EXPECT_LE(worst_grad, 1e-5) << tag << ": worst gradient " << worst_grad_name;
  // Together the stages hold every parameter: counted over the world (once per stage's rank 0).
  torch::Tensor held = torch::tensor({dims.stage_index() == 0 ? static_cast<double>(got.params.size()) : 0.0},
                                     torch::kDouble);
  dims.control().all_reduce(held, ReduceOp::kSum, "test: held parameters");
  const double tied = cfg.tie_word_embeddings && dims.pp() > 1 ? 1 : 0;  // on stage 0 and the last
  EXPECT_EQ(held.item<double>(), static_cast<double>(want.params.size()) + tied) << tag;
  EXPECT_GT(got.meta, 0) << tag << ": other stages' parameters stay on meta";
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, p] : got.params) {
    ASSERT_TRUE(want.params.count(name)) << tag << ": " << name;
    const torch::Tensor ref = mine(name, want.params.at(name));
    ASSERT_EQ(p.sizes(), ref.sizes()) << tag << ": " << name;
    const double d = (p.to(torch::kFloat64) - ref).abs().max().item<double>();
    if (d > worst) worst = d, worst_name = name;
  }
  EXPECT_LE(worst, 1e-5) << tag << ": worst parameter " << worst_name;
  EXPECT_DOUBLE_EQ(got.sent0, got.formula0) << tag;
  std::printf("%s: loss %.6f -> %.6f (ref %.6f), norm0 %.5f, max rel grad diff %.3g (%s), max |param diff| %.3g "
              "(%s); %zu parameters held, %lld on meta; step 0 sent on the links %.0f B\n",
              tag.c_str(), got.losses.front(), got.losses.back(), want.losses.back(), got.norms.front(), worst_grad,
              worst_grad_name.c_str(), worst, worst_name.c_str(), got.params.size(), static_cast<long long>(got.meta),
              got.sent0);
}

ParallelDims ppd_worker_dims() {
  ParallelOptions o;
  o.timeout = std::chrono::seconds(60);
  o.device = "cpu";
  const char* pp = std::getenv("VLMTRAIN_TEST_PP");
  const char* tp = std::getenv("VLMTRAIN_TEST_TP");
  o.pp = pp != nullptr ? std::atoi(pp) : 1;
  o.tp = tp != nullptr ? std::atoi(tp) : 1;
  return ParallelDims::init(detect_dist_env(process_env()), o);
}
std::vector<std::string> ppd_env(int pp, int tp) {
  return {vlm::str("VLMTRAIN_TEST_PP=", pp), vlm::str("VLMTRAIN_TEST_TP=", tp)};
}

TEST(PipelineParallelDist, DISABLED_EqualsOneProcessWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = ppd_worker_dims();
  if (dims.pp() == 4) {  // one layer per stage (DeepStack's two layers do not fit stage 0 alone)
    for (const char* preset : {"tiny", "tiny-qwen3.5", "tiny-qwen3.5-moe"})
      for (int per : {0, 4}) {  // m = 4 (stage 0 warms up 3), then m = 2 < pp
        PpConfig c;
        c.preset = preset;
        c.per_micro = per;
        ppd_check(dims, c);
      }
    dims.control().barrier("end");
    return;
  }
  if (dims.tp() > 1) {  // pp 2 x tp 2
    for (const char* preset : {"tiny", "tiny-qwen3", "tiny-qwen3.5"})
      for (RowLayout layout : {RowLayout::kRight, RowLayout::kPacked}) {
        PpConfig c;
        c.preset = preset;
        c.layout = layout;
        ppd_check(dims, c);
      }
    dims.control().barrier("end");
    return;
  }
  for (const char* preset : {"tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5", "tiny-qwen3-moe", "tiny-qwen3.5-moe"})
    for (RowLayout layout : {RowLayout::kRight, RowLayout::kLeftMask, RowLayout::kPacked}) {
      if (dims.dp_size() == 2 && layout == RowLayout::kLeftMask) continue;  // the mask path: at pp 2
      PpConfig c;
      c.preset = preset;
      c.untie = std::string(preset) == "tiny-qwen2.5";
      c.layout = layout;
      c.filler = dims.dp_size() == 2 && layout == RowLayout::kRight;
      ppd_check(dims, c);
    }
  if (dims.dp_size() == 2) {  // FSDP inside each stage, and recompute
    PpConfig c;
    c.policy = "fsdp";
    ppd_check(dims, c);
    c.preset = "tiny-qwen3.5";
    ppd_check(dims, c);
    c.policy = "ddp";
    c.preset = "tiny-qwen3";
    c.ckpt = true;
    ppd_check(dims, c);
  }
  dims.control().barrier("end");
}

TEST(PipelineParallelDist, EqualsOneProcessPp2World2) {
  fsdp_testing::launch(2, "PipelineParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return ppd_env(2, 1); });
}

// The balanced split against every contiguous split (brute force), and its constraints.
TEST(PipelineStages, BalancedLikeBruteForce) {
  const std::vector<double> cost = {5, 1, 1, 7, 2, 2, 9, 1, 3, 4};
  for (int64_t p : {2, 3, 4}) {
    const auto stages = vlm::pipeline_stages(cost, 6, 8, p);
    ASSERT_EQ(static_cast<int64_t>(stages.size()), p);
    auto largest = [&](const std::vector<int64_t>& cuts) {  // cuts: p + 1 boundaries
      double worst = 0;
      for (int64_t s = 0; s < p; ++s) {
        double c = (s == 0 ? 6 : 0) + (s == p - 1 ? 8 : 0);
        for (int64_t i = cuts[s]; i < cuts[s + 1]; ++i) c += cost[i];
        worst = std::max(worst, c);
      }
      return worst;
    };
    std::vector<int64_t> got{0};
    for (const auto& s : stages) {
      EXPECT_EQ(s.first_layer, got.back());
      EXPECT_GT(s.end_layer, s.first_layer);
      got.push_back(s.end_layer);
    }
    EXPECT_EQ(got.back(), 10);
    // Brute force over every choice of p - 1 cuts in 1..9.
    double best = 1e300;
    std::vector<int64_t> cuts(p + 1, 0);
    cuts[p] = 10;
    std::function<void(int64_t, int64_t)> rec = [&](int64_t s, int64_t from) {
      if (s == p) {
        best = std::min(best, largest(cuts));
        return;
      }
      for (int64_t c = from; c <= 10 - (p - s); ++c) {
        cuts[s] = c;
        rec(s + 1, c + 1);
      }
    };
    rec(1, 1);
    EXPECT_DOUBLE_EQ(largest(got), best) << "pp " << p;
  }
  // DeepStack: stage 0 holds at least min_first layers.
  const auto ds = vlm::pipeline_stages({1, 1, 1, 1}, 0, 100, 2, 3);
  EXPECT_EQ(ds[0].end_layer, 3);
  try {
    vlm::pipeline_stages({1, 1, 1}, 0, 0, 4);
    FAIL() << "3 layers over 4 stages";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 decoder layers cannot fill 4 stages"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(vlm::pipeline_bubble(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(vlm::pipeline_bubble(1, 8), 0.0);
  vlm::PipelineStage s{1, 3, 2, 4};
  EXPECT_TRUE(s.runs("model.layers.2"));
  EXPECT_TRUE(s.runs("model.layers.3"));
  EXPECT_FALSE(s.runs("model.layers.4"));
  EXPECT_FALSE(s.runs("visual.blocks.0"));
  EXPECT_FALSE(s.runs("lm_head"));
}

}  // namespace

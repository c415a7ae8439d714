// Context parallelism, Ulysses and ring modes (sharding/parallel/context_parallel.h,
// vlm/model/sequence_parallel.h), in real processes on Gloo over loopback.
//
// Equality with one process: per configuration, 10 AdamW steps (clipping active) of a global
// batch of 4 image samples (one micro-batch) and 4 text-only samples (a second one) of
// different lengths, built by collate (right padding, causal attention without a mask; the
// same rows left to the mask path; or padding-free packed rows), split over the world / cp
// data-parallel groups, the cp ranks of a group running the same micro-batches on their
// chunk of the sequence (lengths not a multiple of cp: padded inside the model). Compared
// with one process running every sample with no sharding code (its own micro-batches of all
// samples of a kind):
//   - the loss of every step (1e-5 relative) and the gradient norm (1e-5 relative);
//   - every gradient of step 0 before clipping (DDP: the reduced gradients), max |diff| <=
//     1e-5 x max |grad| of that tensor;
//   - every parameter after the 10 steps, 1e-5 absolute.
// Families: tiny (Qwen2-VL: 4 heads, 2 kv heads: at cp 4 each kv head repeated), tiny-qwen2.5
// (window attention in the tower), tiny-qwen3 (q/k norm, DeepStack features added at image
// tokens of each chunk). cp 2 and 4 at world 2 and 4; dp 2 x cp 2 at world 4 (with FSDP
// full_shard for one configuration, activation checkpointing of the decoder layers in
// another: the exchange runs again in the recompute).
// The vision tower splits too (vlm/model/vision_split.h): each rank of a group encodes its
// run of the patches (a micro-batch's 32, 44 or 76 patches padded to a multiple of cp x 4; the
// text-only micro-batch's 4-patch dummy image leaves ranks with padding only), and the vision
// gradients are compared like every other.
// Bytes: step 0's all-to-all bytes on the cp comm equal ulysses_layer_bytes() over the
// layers and vision_split_bytes() over the micro-batches. No hang: the second data-parallel group's text
// micro-batch is a filler (one pad token, nothing supervised) in the dp 2 x cp 2 runs.
// tiny-qwen3.5 (three Gated DeltaNet layers, 2 key and 4 value heads, and a gated attention
// layer): the linear layers split by value heads, the recurrence and the causal conv of each
// head whole on one rank (at cp 4 each key head serves two ranks), in either mode.
// Refusals: cp not dividing the attention heads (Ulysses) or the linear layers' value heads.
// Ring mode (cp_mode "ring": load-balanced chunks, ring attention, vlm/model/ring_attention.h)
// to the same standards: every family and layout at cp 2 and cp 4 and dp 2 x cp 2 (filler),
// recompute at cp 2; step 0's bytes equal the formulas. Its worker is here, its launches in
// context_parallel_ring_dist_test.cpp (an entry of its own, for the timeout).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "collate/micro_batch.h"
#include "sharding/parallel/context_parallel.h"
#include "tests/sharding/parallel/fsdp_testing.h"
#include "vlm/model/vision_split.h"

namespace {

using namespace vlm::sharding;

constexpr int kCpSteps = 10;
constexpr int kCpPerKind = 4;  // image samples and text-only samples per step (global)
constexpr double kCpLr = 1e-4, kCpWd = 0.1, kCpClip = 0.5;

enum class CpLayout { kRight, kLeftMask, kPacked };
const char* cpd_layout_name(CpLayout l) {
  return l == CpLayout::kRight ? "right-padded" : l == CpLayout::kLeftMask ? "masked" : "packed";
}

struct CpConfig {
  vlm::SequenceMode mode = vlm::SequenceMode::kUlysses;
  std::string preset = "tiny";
  CpLayout layout = CpLayout::kRight;
  std::string policy = "ddp";  // everything: ddp | fsdp
  bool ckpt = false;           // activation checkpointing of the decoder layers
  bool filler = false;         // data-parallel group 1's text micro-batch is a filler
  std::string tag(const ParallelDims& dims) const {
    return vlm::str(vlm::sequence_mode_name(mode), " ", preset, " ", cpd_layout_name(layout), " ", policy, ckpt ? " +ckpt" : "", filler ? " +filler" : "",
                    " world ", dims.world_size(), " cp ", dims.cp(), " rank ", dims.rank());
  }
};

// Sample i of `kind` (0 image, 1 text-only) at `step`: a prompt of 3 + i tokens, the image
// (grids of 4, 8 or 3 merged tokens: 16, 32 or 12 patches, so that a micro-batch's patches
// need not divide by cp x merge^2), an answer of 3 + (i + step) % 4 supervised tokens.
vlm::TokenizedSample cpd_sample(const vlm::VlmConfig& c, int step, int kind, int i) {
  torch::manual_seed(1000 * step + 100 * kind + i);
  vlm::TokenizedSample s;
  s.index = kind * kCpPerKind + i;
  const int64_t prompt = 3 + i, answer = 3 + (i + step) % 4;
  auto text = torch::randint(10, 1000, {prompt + answer}, torch::kInt64);
  for (int64_t k = 0; k < prompt; ++k) s.input_ids.push_back(text[k].item<int64_t>());
  if (kind == 0) {
    const std::array<int64_t, 3> grid = i % 2 == 0 ? std::array<int64_t, 3>{1, 4, 4}
                                        : i == 3   ? std::array<int64_t, 3>{1, 2, 6}
                                                   : std::array<int64_t, 3>{1, 4, 8};
    const int64_t patches = grid[0] * grid[1] * grid[2];
    s.grid_thw.push_back(grid);
    s.pixel_values = torch::randn({patches, c.vision.patch_dim()});
    s.input_ids.push_back(c.vision_start_token_id);
    for (int64_t k = 0; k < patches / c.vision.merge_unit(); ++k) s.input_ids.push_back(c.image_token_id);
    s.input_ids.push_back(c.vision_end_token_id);
  }
  s.labels.assign(s.input_ids.size(), -100);
  for (int64_t k = prompt; k < prompt + answer; ++k) {
    s.input_ids.push_back(text[k].item<int64_t>());
    s.labels.push_back(text[k].item<int64_t>());
  }
  return s;
}

// The micro-batch of `samples` in the configuration's layout (host tensors).
vlm::Batch cpd_batch(const std::vector<vlm::TokenizedSample>& samples, const vlm::VlmConfig& cfg, CpLayout layout) {
  if (layout == CpLayout::kPacked) return vlm::collate::build_packed_micro_batch(samples, cfg).batch;
  vlm::Batch b = vlm::collate::build_micro_batch(samples, cfg, /*pad_token_id=*/0).batch;
  if (layout == CpLayout::kLeftMask) b.right_padded = false;  // the attention-mask path
  return b;
}

// Step `step`'s samples of `kind` on data-parallel rank `dp` of `n` (all of them: dp < 0).
std::vector<vlm::TokenizedSample> cpd_samples(const vlm::VlmConfig& cfg, int step, int kind, int dp, int n) {
  std::vector<vlm::TokenizedSample> out;
  for (int i = 0; i < kCpPerKind; ++i)
    if (dp < 0 || i % n == dp) out.push_back(cpd_sample(cfg, step, kind, i));
  return out;
}

vlm::VisionLanguageModel cpd_model(const std::string& preset) {
  vlm::VisionLanguageModel m(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat32));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 11});
  return m;
}

struct CpResult {
  std::vector<double> losses, norms;
  std::map<std::string, torch::Tensor> grads0;  // step 0, before clipping
  std::map<std::string, torch::Tensor> params;  // after the last step
  double a2a_bytes0 = 0, formula0 = 0;          // step 0's cp all-to-all bytes, and the formula's
  int64_t a2a_calls0 = 0;
};

// One process, no sharding code; the filler group's text samples dropped, as the run drops them.
CpResult cpd_reference(const CpConfig& c, int dp_groups) {
  auto model = cpd_model(c.preset);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<torch::Tensor> all;
  for (auto& item : model->named_parameters()) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(kCpLr);
    o->weight_decay(fsdp_testing::no_decay(item.key()) ? 0.0 : kCpWd);
    groups.emplace_back(std::vector<torch::Tensor>{item.value()}, std::move(o));
    all.push_back(item.value());
  }
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(kCpLr));
  CpResult r;
  for (int step = 0; step < kCpSteps; ++step) {
    torch::Tensor loss_sum = torch::zeros({});
    int64_t tokens = 0;
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<vlm::TokenizedSample> s;
      for (int i = 0; i < kCpPerKind; ++i)
        if (!(c.filler && kind == 1 && i % dp_groups == 1)) s.push_back(cpd_sample(model->cfg, step, kind, i));
      auto out = model->forward(cpd_batch(s, model->cfg, c.layout));
      loss_sum = loss_sum + out.loss_sum;
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
    torch::nn::utils::clip_grad_norm_(all, kCpClip);
    opt.step();
    opt.zero_grad();
  }
  for (auto& item : model->named_parameters()) r.params[item.key()] = item.value().detach().clone();
  return r;
}

ShardingOptions cpd_options(const CpConfig& c) {
  ShardingOptions o;
  o.default_policy = c.policy;
  o.ddp_bucket_mb = 0.05;
  if (c.ckpt) o.checkpoint_match = "model.layers.*";
  o.cp_mode = vlm::sequence_mode_name(c.mode);
  o.optim.lr = kCpLr;
  o.optim.weight_decay = kCpWd;
  o.optim.grad_clip = kCpClip;
  return o;
}

CpResult cpd_sharded(ParallelDims& dims, const CpConfig& c) {
  auto model = cpd_model(c.preset);
  auto sm = apply_policies(*model, cpd_options(c), dims);
  EXPECT_NE(model->sequence_exchange(), nullptr);
  EXPECT_EQ(model->sequence_exchange()->mode(), c.mode);
  const auto& cfg = model->cfg;
  const int dp = dims.dp_rank(), groups = dims.dp_size();
  CpResult r;
  for (int step = 0; step < kCpSteps; ++step) {
    vlm::Batch micro[2] = {cpd_batch(cpd_samples(cfg, step, 0, dp, groups), cfg, c.layout),
                           cpd_batch(cpd_samples(cfg, step, 1, dp, groups), cfg, c.layout)};
    if (c.filler && dp == 1) micro[1] = vlm::collate::filler_micro_batch(0).batch;
    // The step's supervised tokens, counted once per cp group.
    int64_t local = 0;
    if (dims.cp_rank() == 0)
      for (const auto& b : micro) local += vlm::supervised_rows(b.labels).size(0);
    const int64_t tokens = global_token_count(dims.comm(), local);
    if (step == 0) dims.reset_data_stats();
    double loss_sum = 0;
    for (int k = 0; k < 2; ++k) {
      sm->set_sync(k == 1);
      auto out = model->forward(micro[k]);
      (out.loss_sum / static_cast<double>(tokens)).backward();
      sm->finish_backward(vlm::str("step ", step));
      loss_sum += out.loss_sum.item<double>();
      if (step == 0) {  // recompute: the forward's exchanges again (half of forward + backward)
        const auto lay = vlm::sequence_layout(micro[k].input_ids.size(1), dims.cp(), dims.cp_rank(), c.mode);
        const int64_t rows = micro[k].input_ids.size(0);
        for (int64_t i = 0; i < cfg.text.num_hidden_layers; ++i) {
          const auto kind = cfg.text.mixer(i);
          r.formula0 += c.mode == vlm::SequenceMode::kRing && kind == vlm::MixerKind::full_attention
                            ? ring_layer_bytes(cfg.text, dims.cp(), rows, lay.padded, 4, c.ckpt)
                            : ulysses_layer_bytes(cfg.text, kind, dims.cp(), rows, lay.padded, 4) * (c.ckpt ? 1.5 : 1.0);
        }
        // The vision tower's split: the images' patches, or the dummy image of a text-only one.
        const auto& px = micro[k].pixel_values;
        const int64_t patches = px.defined() && px.size(0) > 0 ? px.size(0) : cfg.vision.merge_unit();
        r.formula0 += vision_split_bytes(cfg.vision, dims.cp(), patches, 4);
      }
    }
    torch::Tensor l = torch::tensor({loss_sum}, torch::kDouble);
    dims.comm().all_reduce(l, ReduceOp::kSum, "test: loss");
    r.losses.push_back(l.item<double>() / static_cast<double>(tokens));
    if (step == 0) {
      const OpStats& a2a = dims.cp_comm().stats()[OpKind::kAllToAll];
      r.a2a_bytes0 = a2a.logical_bytes;
      r.a2a_calls0 = a2a.calls;
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
  for (const auto& [name, t] : fsdp_testing::snapshot(*sm, *model)) r.params[name] = t;
  return r;
}

double cpd_rel(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

void cpd_check(ParallelDims& dims, const CpConfig& c) {
  const std::string tag = c.tag(dims);
  const CpResult want = cpd_reference(c, dims.dp_size());
  const CpResult got = cpd_sharded(dims, c);
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kCpSteps)) << tag;
  for (int s = 0; s < kCpSteps; ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s]) << tag << " loss, step " << s;
    EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s]) << tag << " grad norm, step " << s;
  }
  EXPECT_GT(want.norms.front(), kCpClip) << "the test needs clipping to be active";
  double worst_grad = 0;
  std::string worst_grad_name;
  for (const auto& [name, g] : got.grads0) {
    ASSERT_TRUE(want.grads0.count(name)) << tag << ": " << name << " has no reference gradient";
    const double d = cpd_rel(g, want.grads0.at(name));
    if (d > worst_grad) worst_grad = d, worst_grad_name = name;
  }
  if (c.policy == "ddp") EXPECT_EQ(got.grads0.size(), want.grads0.size()) << tag << ": every gradient compared";
  EXPECT_LE(worst_grad, 1e-5) << tag << ": worst gradient " << worst_grad_name;
  double worst = 0;
  std::string worst_name;
  ASSERT_EQ(got.params.size(), want.params.size()) << tag;
  for (const auto& [name, p] : got.params) {
    const double d = (p - want.params.at(name)).abs().max().item<double>();
    if (d > worst) worst = d, worst_name = name;
  }
  EXPECT_LE(worst, 1e-5) << tag << ": worst parameter " << worst_name;
  // Per layer and micro-batch, Ulysses (and Gated DeltaNet in either mode): two exchanges
  // forward, two in backward; ring attention: cp - 1 hops forward, 2 (cp - 1) + 1 in backward
  // (the blocks and their gradients, and the gradients home); a recompute runs the forward's
  // again. Two micro-batches.
  const vlm::VlmConfig vc = vlm::preset(c.preset);
  const vlm::TextConfig& text = vc.text;
  // The vision tower: two exchanges per block forward and two backward, one gather per
  // merger forward and one backward.
  int64_t ops = vlm::vision_splits(vc.vision.num_heads, dims.cp())
                    ? 4 * vc.vision.depth + 2 * (1 + static_cast<int64_t>(vc.vision.deepstack_visual_indexes.size()))
                    : 0;
  for (int64_t i = 0; i < text.num_hidden_layers; ++i) {
    const bool ring = c.mode == vlm::SequenceMode::kRing && text.mixer(i) == vlm::MixerKind::full_attention;
    const int64_t fwd = ring ? dims.cp() - 1 : 2, bwd = ring ? 2 * dims.cp() - 1 : 2;
    ops += fwd * (c.ckpt ? 2 : 1) + bwd;
  }
  EXPECT_EQ(got.a2a_calls0, 2 * ops) << tag;
  EXPECT_DOUBLE_EQ(got.a2a_bytes0, got.formula0) << tag;
  std::printf("%s: loss %.6f -> %.6f (ref %.6f), norm0 %.5f, max rel grad diff %.3g (%s), max |param diff| %.3g "
              "(%s); step 0 all-to-all %.0f B in %lld ops\n",
              tag.c_str(), got.losses.front(), got.losses.back(), want.losses.back(), got.norms.front(), worst_grad,
              worst_grad_name.c_str(), worst, worst_name.c_str(), got.a2a_bytes0,
              static_cast<long long>(got.a2a_calls0));
}

ParallelDims cpd_worker_dims() {
  ParallelOptions o;
  o.timeout = std::chrono::seconds(60);
  o.device = "cpu";
  const char* cp = std::getenv("VLMTRAIN_TEST_CP");
  o.cp = cp != nullptr ? std::atoi(cp) : 1;
  return ParallelDims::init(detect_dist_env(process_env()), o);
}
std::vector<std::string> cpd_env(int cp) { return {vlm::str("VLMTRAIN_TEST_CP=", cp)}; }

// Every family and layout in `mode`, the filler micro-batch in the right-padded runs of a
// dp 2 group.
void cpd_every_family(ParallelDims& dims, vlm::SequenceMode mode) {
  for (const char* preset : {"tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"})
    for (CpLayout layout : {CpLayout::kRight, CpLayout::kLeftMask, CpLayout::kPacked}) {
      CpConfig c;
      c.mode = mode;
      c.preset = preset;
      c.layout = layout;
      c.filler = dims.dp_size() == 2 && layout == CpLayout::kRight;
      cpd_check(dims, c);
    }
}

TEST(ContextParallelDist, DISABLED_EqualsOneProcessWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = cpd_worker_dims();
  cpd_every_family(dims, vlm::SequenceMode::kUlysses);
  if (dims.world_size() == 2 || dims.dp_size() == 2) {  // FSDP over the world (cp ranks are replicas), and recompute
    CpConfig c;
    c.policy = "fsdp";
    cpd_check(dims, c);
    c.policy = "ddp";
    c.preset = "tiny-qwen3";
    c.ckpt = true;
    cpd_check(dims, c);
  }
  dims.comm().barrier("end");
}

// Ring mode, the same standards: every family and layout at cp 2 (world 2, plus recompute of
// the masked layout), at cp 4 (world 4) and at dp 2 x cp 2 (world 4, the filler micro-batch in
// the right-padded runs).
TEST(ContextParallelDist, DISABLED_RingEqualsOneProcessWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = cpd_worker_dims();
  cpd_every_family(dims, vlm::SequenceMode::kRing);
  if (dims.world_size() == 2) {  // recompute: the hops run again in backward
    CpConfig c;
    c.mode = vlm::SequenceMode::kRing;
    c.preset = "tiny-qwen3";
    c.layout = CpLayout::kLeftMask;
    c.ckpt = true;
    cpd_check(dims, c);
  }
  dims.comm().barrier("end");
}

TEST(ContextParallelDist, EqualsOneProcessCp2World2) {
  fsdp_testing::launch(2, "ContextParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return cpd_env(2); });
}

TEST(ContextParallelDist, EqualsOneProcessCp4World4) {
  fsdp_testing::launch(4, "ContextParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return cpd_env(4); });
}

TEST(ContextParallelDist, EqualsOneProcessDp2Cp2World4) {
  fsdp_testing::launch(4, "ContextParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return cpd_env(2); });
}

TEST(ContextParallel, RefusesWhatItCannotSplit) {
  vlm::TextConfig t = vlm::preset("tiny").text;  // 4 heads, 2 kv heads
  EXPECT_EQ(context_parallel_problem(t, 2), "");
  EXPECT_EQ(context_parallel_problem(t, 4), "");
  EXPECT_NE(context_parallel_problem(t, 8).find("4 attention heads do not divide by cp = 8"), std::string::npos)
      << context_parallel_problem(t, 8);
  t.num_attention_heads = 6;
  t.num_key_value_heads = 3;
  EXPECT_NE(context_parallel_problem(t, 2).find("3 key/value heads"), std::string::npos);
  vlm::TextConfig q35 = vlm::preset("tiny-qwen3.5").text;  // linear layers: 2 key heads, 4 value heads
  EXPECT_EQ(context_parallel_problem(q35, 2), "");
  EXPECT_EQ(context_parallel_problem(q35, 4), "");  // each key head serves two ranks
  q35.linear_num_value_heads = 6;
  q35.linear_num_key_heads = 3;
  EXPECT_NE(context_parallel_problem(q35, 2).find("Gated DeltaNet layers: 3 key heads neither divide"), std::string::npos)
      << context_parallel_problem(q35, 2);
  EXPECT_NE(context_parallel_problem(q35, 4).find("6 value heads do not divide by cp = 4"), std::string::npos)
      << context_parallel_problem(q35, 4);
  // Ring attention has no head-count requirement; Gated DeltaNet layers keep theirs.
  const auto ring = vlm::SequenceMode::kRing;
  EXPECT_EQ(context_parallel_problem(vlm::preset("tiny").text, 8, ring), "");
  EXPECT_EQ(context_parallel_problem(t, 4, ring), "");
  EXPECT_NE(context_parallel_problem(q35, 2, ring).find("Gated DeltaNet layers: 3 key heads"), std::string::npos);
  EXPECT_EQ(context_parallel_problem(vlm::preset("tiny-qwen3.5").text, 4, ring), "");
}

TEST(ContextParallel, ChunksCoverThePaddedSequence) {
  for (int64_t len : {1, 7, 8, 13}) {
    int64_t next = 0;
    for (int64_t r = 0; r < 4; ++r) {
      const auto c = vlm::sequence_chunk(len, 4, r);
      EXPECT_EQ(c.padded % 4, 0);
      EXPECT_GE(c.padded, len);
      EXPECT_LT(c.padded - len, 4);
      EXPECT_EQ(c.begin, next);
      next = c.begin + c.len;
    }
    EXPECT_EQ(next, vlm::sequence_chunk(len, 4, 0).padded);
  }
}

}  // namespace

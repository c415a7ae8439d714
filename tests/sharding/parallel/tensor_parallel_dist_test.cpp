// Tensor parallelism (sharding/parallel/tensor_parallel.h, vlm/model/tensor_parallel.h), in
// real processes on Gloo over loopback.
//
// Equality with one process (in fp64, so that the fp32 run's own rounding is all the
// difference): per configuration, 10 AdamW steps (clipping active) of a global
// batch of 4 image samples (one micro-batch) and 4 text-only samples (a second one) of
// different lengths (not multiples of tp: padded inside the model), built by collate (right
// padding, causal attention without a mask; the same rows on the mask path; packed rows),
// split over the world / tp data-parallel groups, the tp ranks of a group running the same
// micro-batches with their slices of the heads, MLP channels and vocabulary. The model is
// loaded through tensor_parallel_source from the same seeded random init as the one-process
// reference (no sharding code), so each rank's slices are cut by the production path.
// Compared:
//   - the logits of the first image micro-batch before training (the whole-sequence path of
//     evaluation: all-reduced mixer / MLP outputs, logits gathered over the vocabulary),
//     1e-5 x their largest;
//   - the loss of every step (1e-5 relative) and the gradient norm (1e-5 relative);
//   - every gradient of step 0 before clipping (DDP: the reduced gradients, after the tp sum
//     of the replicated ones), a split parameter's against the slice of the reference's, max
//     |diff| <= 1e-5 x max(max |grad| of that tensor, 1e-2) (tpd_grad_diff);
//   - every parameter after the 10 steps (FSDP: gathered over the data-parallel group), 1e-5
//     absolute.
// Families: tiny (Qwen2-VL, tied embeddings: the head is the vocabulary-parallel embedding),
// tiny-qwen2.5, tiny-qwen3 (q/k norm per head: a replicated parameter whose gradient is per
// head; DeepStack added at the chunks' image tokens), tiny-qwen3.5 (Gated DeltaNet split by
// key / value heads in three blocks, gated attention), tiny-qwen3-moe and tiny-qwen3.5-moe
// (experts replicated, on each rank's chunk). tp 2 at world 2; dp 2 x tp 2 at world 4 (FSDP
// full_shard of the tp slices in one configuration, activation checkpointing of the decoder
// layers in another, a filler micro-batch in the right-padded runs). tp 4 at world 4 (the
// launch in tensor_parallel_kv_dist_test.cpp) for the attention-only families, whose 2
// key/value heads each serve two ranks (k_proj / v_proj pieces replicated on two ranks,
// their gradients summed between them), DDP and FSDP.
// Bytes: step 0's bytes on the tp comm (all-gathers, reduce-scatters, all-reduces, all-to-alls)
// equal tensor_parallel_layer_bytes() over the layers plus the embedding's all-reduce, the
// final gather and the loss's exchanges.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "collate/micro_batch.h"
#include "sharding/parallel/tensor_parallel.h"
#include "tests/sharding/parallel/fsdp_testing.h"
#include "tests/sharding/parallel/parallel_samples.h"
#include "vlm/model/chunked_cross_entropy.h"
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

constexpr int kTpSteps = 10;
constexpr int kTpPerKind = 4;  // image samples and text-only samples per step (global)
constexpr double kTpLr = 1e-4, kTpWd = 0.1, kTpClip = 0.5;
constexpr uint64_t kTpSeed = 11;

struct TpConfig {
  std::string preset = "tiny";
  RowLayout layout = RowLayout::kRight;
  std::string policy = "ddp";  // everything: ddp | fsdp
  bool ckpt = false;           // activation checkpointing of the decoder layers
  bool filler = false;         // data-parallel group 1's text micro-batch is a filler
  std::string tag(const ParallelDims& dims) const {
    return vlm::str(preset, " ", row_layout_name(layout), " ", policy, ckpt ? " +ckpt" : "", filler ? " +filler" : "",
                    " world ", dims.world_size(), " tp ", dims.tp(), " rank ", dims.rank());
  }
};

std::vector<vlm::TokenizedSample> tpd_samples(const vlm::VlmConfig& cfg, int step, int kind, int dp, int n) {
  std::vector<vlm::TokenizedSample> out;
  for (int i = 0; i < kTpPerKind; ++i)
    if (dp < 0 || i % n == dp) out.push_back(parallel_sample(cfg, step, kind, i, kTpPerKind));
  return out;
}

// The reference in fp64: the seeded init's fp32 draws (meta_init.h), converted.
vlm::VisionLanguageModel tpd_full_model(const std::string& preset) {
  vlm::VisionLanguageModel m(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat64));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat64, kTpSeed});
  return m;
}

struct TpResult {
  std::vector<double> losses, norms;
  torch::Tensor logits0;                        // the first image micro-batch's, before training
  std::map<std::string, torch::Tensor> grads0;  // step 0, before clipping
  std::map<std::string, torch::Tensor> params;  // after the last step
  double a2a_bytes0 = 0, formula0 = 0;          // step 0's bytes on the tp comm, and the formula's
};

// One process in fp64, no sharding code; the filler group's text samples dropped, as the run
// drops them.
TpResult tpd_reference(const TpConfig& c, int dp_groups) {
  auto model = tpd_full_model(c.preset);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<torch::Tensor> all;
  for (auto& item : model->named_parameters()) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(kTpLr);
    o->weight_decay(fsdp_testing::no_decay(item.key()) ? 0.0 : kTpWd);
    groups.emplace_back(std::vector<torch::Tensor>{item.value()}, std::move(o));
    all.push_back(item.value());
  }
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(kTpLr));
  TpResult r;
  {
    torch::NoGradGuard no_grad;
    r.logits0 = model->forward(to_fp64(parallel_batch(tpd_samples(model->cfg, 0, 0, 0, dp_groups), model->cfg, c.layout)), true).logits;
  }
  for (int step = 0; step < kTpSteps; ++step) {
    torch::Tensor loss_sum = torch::zeros({});
    int64_t tokens = 0;
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<vlm::TokenizedSample> s;
      for (int i = 0; i < kTpPerKind; ++i)
        if (!(c.filler && kind == 1 && i % dp_groups == 1)) s.push_back(parallel_sample(model->cfg, step, kind, i, kTpPerKind));
      auto out = model->forward(to_fp64(parallel_batch(s, model->cfg, c.layout)));
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
    torch::nn::utils::clip_grad_norm_(all, kTpClip);
    opt.step();
    opt.zero_grad();
  }
  for (auto& item : model->named_parameters()) r.params[item.key()] = item.value().detach().clone();
  return r;
}

ShardingOptions tpd_options(const TpConfig& c) {
  ShardingOptions o;
  o.default_policy = c.policy;
  o.ddp_bucket_mb = 0.05;
  if (c.ckpt) o.checkpoint_match = "model.layers.*";
  o.optim.lr = kTpLr;
  o.optim.weight_decay = kTpWd;
  o.optim.grad_clip = kTpClip;
  return o;
}

// The tp comm's bytes for one micro-batch on top of the layers' (tensor_parallel.h): the
// embedding's all-reduce of [B, L, d] forward and backward (ring volume 2 (tp-1)/tp), the
// final hidden states' all-gather of [B, L/tp, d] forward and its reduce-scatter backward, and
// the loss's two all-to-alls per row chunk (the row maxima, then the sums of exp and the label
// logits).
double tpd_outside_layers(const vlm::VlmConfig& cfg, int64_t tp, const vlm::Batch& b) {
  const int64_t rows = b.input_ids.size(0), len = b.input_ids.size(1);
  const int64_t padded = (len + tp - 1) / tp * tp, d = cfg.text.hidden_size;
  const double e = 2.0 * static_cast<double>(tp - 1) / static_cast<double>(tp) * static_cast<double>(rows * len * d) * 4;
  const double gather = static_cast<double>(tp - 1) * static_cast<double>(rows * padded / tp * d) * 4;
  const int64_t n = vlm::supervised_rows(b.labels).size(0);
  const int64_t chunk = vlm::cross_entropy_chunk_rows(cfg.text.vocab_size / tp);
  double loss = 0;
  for (int64_t a = 0; a < n; a += chunk) loss += static_cast<double>(tp - 1) * 12.0 * static_cast<double>(std::min(chunk, n - a));
  return 2 * e + 2 * gather + loss;
}

TpResult tpd_sharded(ParallelDims& dims, const TpConfig& c) {
  vlm::VlmConfig cfg = vlm::preset(c.preset);
  // The full model's parameters from the reference's seeded init, sliced for this rank.
  vlm::VisionLanguageModel full(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat32));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : full->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  auto source = tensor_parallel_source(vlm::init_param_source(*full, {torch::kCPU, torch::kFloat32, kTpSeed}), cfg,
                                       shapes, dims.tp_rank(), dims.tp());
  cfg.text.tensor_parallel = dims.tp();
  vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat32));
  auto sm = apply_policies(*model, tpd_options(c), dims, source.get());
  EXPECT_NE(model->tensor_exchange(), nullptr);
  const int dp = dims.dp_rank(), groups = dims.dp_size();
  TpResult r;
  {
    torch::NoGradGuard no_grad;
    r.logits0 = model->forward(parallel_batch(tpd_samples(cfg, 0, 0, 0, groups), cfg, c.layout), true).logits;
  }
  for (int step = 0; step < kTpSteps; ++step) {
    vlm::Batch micro[2] = {parallel_batch(tpd_samples(cfg, step, 0, dp, groups), cfg, c.layout),
                           parallel_batch(tpd_samples(cfg, step, 1, dp, groups), cfg, c.layout)};
    if (c.filler && dp == 1) micro[1] = vlm::collate::filler_micro_batch(0).batch;
    // The step's supervised tokens, counted once per tp group (on the control plane: the
    // data plane's lanes span a data-parallel group).
    int64_t local = 0;
    if (dims.tp_rank() == 0)
      for (const auto& b : micro) local += vlm::supervised_rows(b.labels).size(0);
    const int64_t tokens = global_token_count(dims.control(), local);
    if (step == 0) dims.reset_data_stats();
    double loss_sum = 0;
    for (int k = 0; k < 2; ++k) {
      sm->set_sync(k == 1);
      auto out = model->forward(micro[k]);
      (out.loss_sum / static_cast<double>(tokens)).backward();
      sm->finish_backward(vlm::str("step ", step));
      loss_sum += out.loss_sum.item<double>();
      if (step == 0) {
        const int64_t rows = micro[k].input_ids.size(0), len = micro[k].input_ids.size(1);
        const int64_t padded = (len + dims.tp() - 1) / dims.tp() * dims.tp();
        for (int64_t i = 0; i < cfg.text.num_hidden_layers; ++i)
          r.formula0 += tensor_parallel_layer_bytes(cfg.text, cfg.text.sparse_layer(i), dims.tp(), rows, padded, 4, c.ckpt);
        r.formula0 += tpd_outside_layers(cfg, dims.tp(), micro[k]);
      }
    }
    torch::Tensor l = torch::tensor({loss_sum}, torch::kDouble);
    dims.control().all_reduce(l, ReduceOp::kSum, "test: loss");
    r.losses.push_back(l.item<double>() / static_cast<double>(tokens));
    if (step == 0) {
      for (OpKind op : {OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kAllReduce, OpKind::kAllToAll})
        r.a2a_bytes0 += dims.tp_comm().stats()[op].logical_bytes;
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
  for (const auto& [name, t] : fsdp_testing::snapshot(*sm, *model)) r.params[name] = t;
  return r;
}

double tpd_rel(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a.to(torch::kFloat64) - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

void tpd_check(ParallelDims& dims, const TpConfig& c) {
  const std::string tag = c.tag(dims);
  const vlm::VlmConfig cfg = vlm::preset(c.preset);
  const TpResult want = tpd_reference(c, dims.dp_size());
  const TpResult got = tpd_sharded(dims, c);
  auto mine = [&](const std::string& name, const torch::Tensor& full) {
    return vlm::tp_slice(full, vlm::tensor_parallel_split(cfg, name, dims.tp()), dims.tp_rank(), dims.tp());
  };
  EXPECT_LE(tpd_rel(got.logits0, want.logits0), 1e-5) << tag << ": logits before training";
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kTpSteps)) << tag;
  for (int s = 0; s < kTpSteps; ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s]) << tag << " loss, step " << s;
    EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s]) << tag << " grad norm, step " << s;
  }
  EXPECT_GT(want.norms.front(), kTpClip) << "the test needs clipping to be active";
  double worst_grad = 0;
  std::string worst_grad_name;
  int64_t split = 0;
  for (const auto& [name, g] : got.grads0) {
    ASSERT_TRUE(want.grads0.count(name)) << tag << ": " << name << " has no reference gradient";
    const torch::Tensor ref = mine(name, want.grads0.at(name));
    ASSERT_EQ(g.sizes(), ref.sizes()) << tag << ": " << name;
    split += vlm::tensor_parallel_split(cfg, name, dims.tp()).split();
    const double d = grad_diff_floored(g, ref);
    if (d > worst_grad) worst_grad = d, worst_grad_name = name;
  }
  if (c.policy == "ddp") {
    EXPECT_EQ(got.grads0.size(), want.grads0.size()) << tag << ": every gradient compared";
    EXPECT_GT(split, 0) << tag << ": split parameters among them";
  }
  EXPECT_LE(worst_grad, 1e-5) << tag << ": worst gradient " << worst_grad_name;
  double worst = 0;
  std::string worst_name;
  ASSERT_EQ(got.params.size(), want.params.size()) << tag;
  for (const auto& [name, p] : got.params) {
    const torch::Tensor ref = mine(name, want.params.at(name));
    ASSERT_EQ(p.sizes(), ref.sizes()) << tag << ": " << name;
    const double d = (p.to(torch::kFloat64) - ref).abs().max().item<double>();
    if (d > worst) worst = d, worst_name = name;
  }
  EXPECT_LE(worst, 1e-5) << tag << ": worst parameter " << worst_name;
  EXPECT_DOUBLE_EQ(got.a2a_bytes0, got.formula0) << tag;
  std::printf("%s: loss %.6f -> %.6f (ref %.6f), norm0 %.5f, max rel grad diff %.3g (%s), max |param diff| %.3g "
              "(%s); step 0 on the tp comm %.0f B\n",
              tag.c_str(), got.losses.front(), got.losses.back(), want.losses.back(), got.norms.front(), worst_grad,
              worst_grad_name.c_str(), worst, worst_name.c_str(), got.a2a_bytes0);
}

ParallelDims tpd_worker_dims() {
  ParallelOptions o;
  o.timeout = std::chrono::seconds(60);
  o.device = "cpu";
  const char* tp = std::getenv("VLMTRAIN_TEST_TP");
  o.tp = tp != nullptr ? std::atoi(tp) : 1;
  return ParallelDims::init(detect_dist_env(process_env()), o);
}
std::vector<std::string> tpd_env(int tp) { return {vlm::str("VLMTRAIN_TEST_TP=", tp)}; }

TEST(TensorParallelDist, DISABLED_EqualsOneProcessWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = tpd_worker_dims();
  if (dims.tp() == 4) {  // 2 key/value heads over 4 ranks: each kv head on two (Gated DeltaNet's 2 key heads refuse)
    for (const char* preset : {"tiny", "tiny-qwen2.5", "tiny-qwen3"})
      for (RowLayout layout : {RowLayout::kRight, RowLayout::kPacked}) {
        TpConfig c;
        c.preset = preset;
        c.layout = layout;
        tpd_check(dims, c);
      }
    TpConfig c;
    c.policy = "fsdp";
    tpd_check(dims, c);
    dims.control().barrier("end");
    return;
  }
  for (const char* preset : {"tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5", "tiny-qwen3-moe", "tiny-qwen3.5-moe"})
    for (RowLayout layout : {RowLayout::kRight, RowLayout::kLeftMask, RowLayout::kPacked}) {
      TpConfig c;
      c.preset = preset;
      c.layout = layout;
      c.filler = dims.dp_size() == 2 && layout == RowLayout::kRight;
      tpd_check(dims, c);
    }
  if (dims.dp_size() == 2) {  // FSDP of the tp slices over the data-parallel group, and recompute
    TpConfig c;
    c.policy = "fsdp";
    tpd_check(dims, c);
    c.preset = "tiny-qwen3.5";
    tpd_check(dims, c);
    c.policy = "ddp";
    c.preset = "tiny-qwen3";
    c.ckpt = true;
    tpd_check(dims, c);
  }
  dims.control().barrier("end");
}

TEST(TensorParallelDist, EqualsOneProcessTp2World2) {
  fsdp_testing::launch(2, "TensorParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return tpd_env(2); });
}

TEST(TensorParallelDist, EqualsOneProcessDp2Tp2World4) {
  fsdp_testing::launch(4, "TensorParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return tpd_env(2); });
}

// The splits: slices of every rank put back together give the tensor; Gated DeltaNet's
// in_proj_qkv takes rank r's key heads from both the q and the k block and its value heads.
TEST(TensorParallel, SlicesPutBackTogether) {
  const vlm::VlmConfig cfg = vlm::preset("tiny-qwen3.5");
  const auto& t = cfg.text;
  for (const std::string name : {"model.layers.0.linear_attn.in_proj_qkv.weight", "model.layers.0.linear_attn.out_proj.weight",
                                 "model.embed_tokens.weight"}) {
    const vlm::TpSplit split = vlm::tensor_parallel_split(cfg, name, 2);
    ASSERT_TRUE(split.split()) << name;
    int64_t rows = 0;
    for (int64_t b : split.blocks) rows += b;
    std::vector<int64_t> shape{split.dim == 0 ? rows : 8, split.dim == 0 ? 8 : rows};
    auto full = torch::randn(shape);
    std::vector<torch::Tensor> parts;
    for (int64_t r = 0; r < 2; ++r) parts.push_back(vlm::tp_slice(full, split, r, 2));
    EXPECT_TRUE(torch::equal(vlm::tp_unslice(parts, split), full)) << name;
  }
  const vlm::TpSplit qkv = vlm::tensor_parallel_split(cfg, "model.layers.0.linear_attn.in_proj_qkv.weight", 2);
  const int64_t key = t.linear_num_key_heads * t.linear_key_head_dim, kh = key / 2;
  const int64_t vh = t.linear_num_value_heads * t.linear_value_head_dim / 2;
  auto rows = torch::arange(2 * key + 2 * vh, torch::kFloat32).unsqueeze(1);
  auto r1 = vlm::tp_slice(rows, qkv, 1, 2).squeeze(1);
  EXPECT_EQ(r1[0].item<float>(), kh);                // rank 1's first q row
  EXPECT_EQ(r1[kh].item<float>(), key + kh);         // its first k row
  EXPECT_EQ(r1[2 * kh].item<float>(), 2 * key + vh); // its first v row
  EXPECT_FALSE(vlm::tensor_parallel_split(cfg, "model.layers.0.linear_attn.norm.weight", 2).split());
  EXPECT_FALSE(vlm::tensor_parallel_split(cfg, "model.layers.0.input_layernorm.weight", 2).split());
  EXPECT_FALSE(vlm::tensor_parallel_split(cfg, "visual.blocks.0.attn.qkv.weight", 2).split());
  // Fewer key/value heads than tp (tiny: 2 at tp 4): k_proj in 2 pieces, ranks 0-1 hold the
  // first kv head, ranks 2-3 the second; the four slices put back together.
  const vlm::VlmConfig tiny = vlm::preset("tiny");
  const vlm::TpSplit k = vlm::tensor_parallel_split(tiny, "model.layers.0.self_attn.k_proj.weight", 4);
  ASSERT_EQ(k.parts, 2);
  const int64_t kv_rows = tiny.text.num_key_value_heads * tiny.text.head_dim();
  auto kfull = torch::randn({kv_rows, 8});
  std::vector<torch::Tensor> kslices;
  for (int64_t r = 0; r < 4; ++r) kslices.push_back(vlm::tp_slice(kfull, k, r, 4));
  EXPECT_TRUE(torch::equal(kslices[0], kfull.narrow(0, 0, kv_rows / 2)));
  EXPECT_TRUE(torch::equal(kslices[1], kslices[0]));
  EXPECT_TRUE(torch::equal(kslices[3], kfull.narrow(0, kv_rows / 2, kv_rows / 2)));
  EXPECT_TRUE(torch::equal(vlm::tp_unslice(kslices, k), kfull));
  EXPECT_EQ(tensor_parallel_sharing(tiny, "model.layers.0.self_attn.k_proj.weight", 4), 2);
  EXPECT_EQ(tensor_parallel_sharing(tiny, "model.layers.0.self_attn.k_proj.weight", 2), 0);
  EXPECT_EQ(tensor_parallel_sharing(tiny, "model.layers.0.input_layernorm.weight", 4), 1);
}

TEST(TensorParallel, RefusesWhatItCannotSplit) {
  vlm::TextConfig t = vlm::preset("tiny").text;  // 4 heads, 2 key/value heads
  EXPECT_EQ(vlm::tensor_parallel_problem(t, 2), "");
  EXPECT_EQ(vlm::tensor_parallel_problem(t, 4), "");  // each kv head on two ranks
  const std::string p = vlm::tensor_parallel_problem(t, 8);
  EXPECT_NE(p.find("attention heads do not divide by tp = 8"), std::string::npos) << p;
  t.num_attention_heads = 6;
  t.num_key_value_heads = 3;
  EXPECT_NE(vlm::tensor_parallel_problem(t, 2).find("3 key/value heads neither divide by nor divide tp = 2"),
            std::string::npos)
      << vlm::tensor_parallel_problem(t, 2);
  t = vlm::preset("tiny").text;
  t.vocab_size += 1;
  EXPECT_NE(vlm::tensor_parallel_problem(t, 2).find("vocabulary rows do not divide by tp = 2"), std::string::npos);
}

}  // namespace

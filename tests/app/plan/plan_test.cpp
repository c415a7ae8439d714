// `vlmtrain plan --preset` as a real subprocess: parameter totals of the real presets
// against the published figure (REFERENCE.md: Qwen2-VL-2B = 2,208,985,600).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"

namespace {

nlohmann::json plan_json(const std::string& preset) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", "--preset", preset, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(Plan, Qwen2Vl2bTotalsMatchPublishedCounts) {
  auto j = plan_json("qwen2-vl-2b");
  EXPECT_EQ(j["total_params"].get<int64_t>(), 2208985600LL);
  EXPECT_EQ(j["vision_params"].get<int64_t>(), 665271296LL);
  EXPECT_EQ(j["merger_params"].get<int64_t>(), 34087936LL);
  EXPECT_EQ(j["llm_params"].get<int64_t>(), 1543714304LL);
  // The module rows add up to the total (the tied head owns nothing).
  int64_t sum = 0;
  for (const auto& m : j["modules"]) sum += m["params"].get<int64_t>();
  EXPECT_EQ(sum, 2208985600LL);
  EXPECT_EQ(j["modules"].front()["path"], "visual.patch_embed");
  EXPECT_EQ(j["modules"].back()["path"], "lm_head");
}

TEST(Plan, HumanTableShowsTotal) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", "--preset", "qwen2-vl-2b"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2,208,985,600"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.layers.27"), std::string::npos);
}

TEST(Plan, SevenBPresetPlansWithoutMemory) {
  // Building 8B parameters for real would need > 16 GB; on meta it is instant.
  auto j = plan_json("qwen2.5-vl-7b");
  EXPECT_GT(j["total_params"].get<int64_t>(), 8000000000LL);
}

TEST(Plan, UnknownPresetFailsWithList) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", "--preset", "nope"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("qwen2-vl-2b"), std::string::npos) << r.output;
}

TEST(Plan, MissingRecipeFileIsAClearError) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", "no_such_recipe.toml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no_such_recipe.toml"), std::string::npos) << r.output;
}

// ocr_qwen.toml (vision frozen, merger ddp, LLM fsdp full_shard, bf16) on the 2B preset at
// N = 8: every unit's bytes per rank against app/plan/memory_plan.h (P unit parameters,
// bf16 params, fp32 reduce): frozen 2P, ddp 2P + 4P + 12P = 18P (the fp32 bucket is the
// gradient: it accumulates there, no bf16 .grad is kept), ZeRO-3 (2 + 4 + 12)P/N = 18P/N with fp32 shard grads (every 2B unit is divisible by 8).
TEST(Plan, OcrQwenRecipeAtWorld8MatchesZeroFormulas) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_qwen.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2-vl-2b", "--world-size", "8",
                         "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["world_size"], 8);
  EXPECT_EQ(j["param_dtype"], "bf16");
  const double n = 8;
  double sum = 0, total_params = 0;
  int frozen = 0, ddp = 0, fsdp = 0;
  for (const auto& u : j["units"]) {
    const double p = u["params"].get<double>();
    total_params += p;
    const std::string policy = u["policy"], path = u["path"];
    double want = 0;
    if (policy == "freeze") {
      ++frozen;
      want = 2 * p;
      EXPECT_EQ(u["grad_bytes"].get<double>(), 0) << path;
      EXPECT_EQ(u["optim_bytes"].get<double>(), 0) << path;
    } else if (policy == "ddp") {
      ++ddp;
      want = 18 * p;
      EXPECT_EQ(path, "visual.merger");
      EXPECT_EQ(u["grad_bytes"].get<double>(), 4 * p);
      EXPECT_EQ(u["optim_bytes"].get<double>(), 12 * p);
    } else {
      ++fsdp;
      EXPECT_EQ(policy, "fsdp");
      EXPECT_EQ(static_cast<int64_t>(p) % 8, 0) << path;
      want = 18 * p / n;
    }
    EXPECT_EQ(u["total_bytes"].get<double>(), want) << path;
    EXPECT_EQ(u["activation_checkpointing"].get<bool>(), path.rfind("model.layers.", 0) == 0) << path;
    sum += want;
  }
  EXPECT_EQ(frozen, 1 + 32);  // patch_embed + 32 blocks
  EXPECT_EQ(ddp, 1);
  EXPECT_EQ(fsdp, 28 + 2);    // layers + embed_tokens (with the tied lm_head) + norm
  EXPECT_EQ(total_params, 2208985600.0);
  EXPECT_EQ(j["totals"]["total_bytes"].get<double>(), sum);
  // Published groups: frozen vision 2P, merger 18P, LLM 18P/8.
  EXPECT_EQ(sum, 2 * (665271296.0 - 34087936.0) + 18 * 34087936.0 + 18 * 1543714304.0 / 8);
  EXPECT_GT(j["reduce_scatter_peak_bytes"].get<double>(), 0);
  EXPECT_EQ(j["peak_bytes"].get<double>(), sum + j["gathered_peak_bytes"].get<double>() +
                                               j["reduce_scatter_peak_bytes"].get<double>());
  bool tiny_norm = false;
  for (const auto& w : j["warnings"]) tiny_norm |= w.get<std::string>().find("model.norm is tiny") != std::string::npos;
  EXPECT_TRUE(tiny_norm) << j["warnings"].dump();
}

TEST(Plan, OcrQwenHumanTable) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_qwen.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2-vl-2b", "--world-size", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.embed_tokens (lm_head)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("total per rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ZeRO-3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("issue #8"), std::string::npos) << "FSDP trains now; no stale note: " << r.output;
  EXPECT_NE(r.output.find("params: total 2,208,985,600, trainable"), std::string::npos) << r.output;
}

TEST(Plan, RuleMatchingNothingFailsNamingTheRule) {
  const std::string path = vlm::test::binary_dir() + "/plan_bad_rule.toml";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("[model]\npreset = \"tiny\"\n[[sharding.module]]\nmatch = \"visual.mergr\"\npolicy = \"ddp\"\n", f);
  std::fclose(f);
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", path});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("rule 1 (match = \"visual.mergr\") matches no parameter"), std::string::npos) << r.output;
}

// Expert parallelism: tiny-qwen3-moe (8 experts of [2I, d] + [d, I], I = 128, d = 256, top-2,
// layers 1-3 sparse) at world 4, dist.ep = 2, DDP elsewhere: each +experts row holds 4
// experts (4 x 3 x 128 x 256 = 393,216 params, replicated fp32: 4 + 8 + 4 bytes each for the
// params, the .grad and its DDP bucket, and AdamW's m and v ZeRO-1 over the 2 ranks holding
// the same experts), total_params still counts all 8;
// the all-to-all per micro-batch of
// T tokens is 3 layers x ((ep-1) x 4 x 8 + 4 x T x 2 x (ep-1)/ep x 256 x 4).
TEST(Plan, ExpertParallelHalvesTheExpertsAndPlansTheAllToAll) {
  const std::string path = vlm::test::binary_dir() + "/plan_ep.toml";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("[model]\npreset = \"tiny-qwen3-moe\"\n[dist]\nep = 2\n[[sharding.module]]\nmatch = "
             "\"*.mlp.experts\"\npolicy = \"ep\"\n", f);
  std::fclose(f);
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", path, "--world-size", "4", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  int rows = 0;
  for (const auto& u : j["units"]) {
    if (u["sharding"] != "experts (ep)") continue;
    ++rows;
    EXPECT_EQ(u["params"].get<double>(), 4 * 3 * 128 * 256.0) << u["path"];
    EXPECT_EQ(u["total_bytes"].get<double>(), 16 * 4 * 3 * 128 * 256.0) << u["path"];
  }
  EXPECT_EQ(rows, 3);
  // The experts' traffic stays on their expert-replicate group (2 ranks): per row the fp32
  // gradient all-reduce 2 x 1/2 x P x 4 and the ZeRO-1 all-gather 1/2 x 2 x P/2 x 4 bytes;
  // nothing of theirs on the world group.
  double replicate = 0, expert_world = 0;
  for (const auto& o : j["traffic"]["ops"]) {
    const bool expert = o["unit"].get<std::string>().find("+experts") != std::string::npos;
    if (o["group"] == "expert_replicate") replicate += o["bytes"].get<double>() * o["per_step"].get<double>();
    if (expert && o["group"] == "world") expert_world += o["bytes"].get<double>();
  }
  const double per_row = 4 * 3 * 128 * 256.0;
  EXPECT_DOUBLE_EQ(replicate, 3 * (2 * 0.5 * per_row * 4 + 0.5 * 2 * (per_row / 2) * 4));
  EXPECT_EQ(expert_world, 0);
  const auto full = nlohmann::json::parse(
      vlm::test::run({vlm::test::vlmtrain_bin(), "plan", "--preset", "tiny-qwen3-moe", "--json"}).output);
  EXPECT_EQ(j["total_params"], full["total_params"]) << "the experts of the other EP rank count too";
  ASSERT_TRUE(j.contains("expert_parallel")) << r.output;
  EXPECT_EQ(j["expert_parallel"]["ep"], 2);
  EXPECT_EQ(j["expert_parallel"]["experts_per_rank"], 4);
  const double t = j["activations"]["tokens"].get<double>();
  EXPECT_EQ(j["expert_parallel"]["all_to_all_bytes_per_micro_batch"].get<double>(),
            3 * (1 * 4 * 8 + 4 * t * 2 * 0.5 * 256 * 4));
  auto bad = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", path, "--world-size", "3"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("dist.ep = 2 does not divide the world size 3"), std::string::npos) << bad.output;
}

// dist.cp = 2 on Qwen3-VL-8B (32 heads, 8 kv heads, head_dim 128, 36 layers) for a 64k-token
// document: the decoder's activations per rank shrink, the parameters per rank do not, and the
// Ulysses bytes equal the formula written out here: per layer and micro-batch, forward and
// backward, 2 x (cp - 1)/cp x L/cp x D x 2 bytes x (2 H + 2 max(Hkv, cp)); the recipe
// checkpoints every layer, whose recompute exchanges again (x 1.5). The vision tower's split
// (27 blocks of 16 heads of 72 dims, 240,000 patches, merge 2 x 2, 4 mergers of 4096 outputs,
// blocks not checkpointed): per block 2 x (cp - 1)/cp x S/cp x 72 x 2 bytes x 4 x 16, per
// merger 2 x (cp - 1) x S/(4 cp) x 4096 x 2 bytes.
TEST(Plan, ContextParallelSplitsTheDecoderAndPlansTheAllToAll) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_qwen3vl.toml";
  auto plan = [&](int cp, int world) {
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen3-vl-8b", "--world-size",
                             std::to_string(world), "--tokens", "65536", "--image-tokens", "60000", "--set",
                             "dist.cp=" + std::to_string(cp), "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  };
  const auto one = plan(1, 8), two = plan(2, 8), eight = plan(8, 8);
  EXPECT_FALSE(one.contains("context_parallel"));
  ASSERT_TRUE(two.contains("context_parallel"));
  EXPECT_EQ(two["context_parallel"]["decoder_tokens_per_rank"], 32768);
  EXPECT_EQ(eight["context_parallel"]["decoder_tokens_per_rank"], 8192);
  EXPECT_EQ(two["totals"]["total_bytes"], one["totals"]["total_bytes"]) << "cp ranks hold what data-parallel ranks do";
  const double a1 = one["activations"]["peak_bytes"], a2 = two["activations"]["peak_bytes"],
               a8 = eight["activations"]["peak_bytes"];
  EXPECT_LT(a2, a1);
  EXPECT_LT(a8, a2);
  auto bytes = [](double cp) {
    const double decoder = 36 * 1.5 * 2 * (cp - 1) / cp * (65536 / cp) * 128 * 2 * (2 * 32 + 2 * std::max(8.0, cp));
    const double patches = 240000;
    const double vision = 27 * 2 * (cp - 1) / cp * (patches / cp) * 72 * 2 * 4 * 16 +
                          4 * 2 * (cp - 1) * (patches / (4 * cp)) * 4096 * 2;
    return decoder + vision;
  };
  EXPECT_DOUBLE_EQ(two["context_parallel"]["all_to_all_bytes_per_micro_batch"].get<double>(), bytes(2));
  EXPECT_DOUBLE_EQ(eight["context_parallel"]["all_to_all_bytes_per_micro_batch"].get<double>(), bytes(8));
  // 12 heads (Qwen2-VL-2B) do not split over 8 ranks; 3 ranks do not make groups of 2.
  auto bad = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2-vl-2b", "--world-size", "8",
                             "--set", "dist.cp=8"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("12 attention heads do not divide by cp = 8"), std::string::npos) << bad.output;
  bad = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen3-vl-8b", "--world-size", "3",
                        "--set", "dist.cp=2"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("dist.cp = 2 does not divide the world size 3"), std::string::npos) << bad.output;
}

// Tensor parallelism: Qwen2.5-VL-72B (80 layers, d 8192, 64 heads of 128, 8 kv heads, MLP
// 29568, vocabulary 152064, untied) on 32 GPUs of 8 per node, tp 8 x FSDP over 4, against the
// formulas written out: each rank holds an eighth of every split parameter (q/k/v with their
// biases, o, gate/up/down, embed_tokens, lm_head) and the rest whole; the tp group's bytes per
// micro-batch of one row of 8192 tokens in bf16 (sharding/parallel/tensor_parallel.h) with the
// recipe's checkpointed layers: 3 x 2 (all-gather + reduce-scatter pairs) x 7/8 x L x d x 2 per
// layer, the embedding's all-reduce 2 x (2 x 7/8) x L x d x 2, the final gather 2 x 7 x L/8 x d x 2,
// and the loss's 7 x 12 bytes per supervised row.
TEST(Plan, TensorParallelHoldsAnEighthOfTheSplitParameters) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_qwen25.toml";
  auto plan = [&](int tp) {
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2.5-vl-72b", "--world-size",
                             "32", "--nproc-per-node", "8", "--tokens", "8192", "--image-tokens", "4096", "--set",
                             "dist.tp=" + std::to_string(tp), "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  };
  const auto one = plan(1), eight = plan(8);
  EXPECT_FALSE(one.contains("tensor_parallel"));
  ASSERT_TRUE(eight.contains("tensor_parallel"));
  const int64_t total = one["total_params"];
  EXPECT_EQ(eight["total_params"].get<int64_t>(), total);
  const int64_t d = 8192, hd = 128, kv = 8 * hd, mlp = 29568, vocab = 152064;
  const int64_t split = 80 * (d * d + d + 2 * (kv * d + kv) + d * d + 3 * mlp * d) + 2 * vocab * d;
  EXPECT_EQ(eight["tensor_parallel"]["params_per_rank"].get<int64_t>(), total - split + split / 8);
  EXPECT_EQ(eight["tensor_parallel"]["data_parallel"], 4);
  const double l = 8192, pair = 2.0 * 7 / 8 * l * d * 2;
  const double known = 80 * 3 * 2 * pair + 2 * (2.0 * 7 / 8) * l * d * 2 + 2 * 7 * (l / 8) * d * 2;
  const double loss = eight["tensor_parallel"]["bytes_per_micro_batch"].get<double>() - known;
  EXPECT_GT(loss, 0);
  EXPECT_LE(loss, 7 * 12 * l);
  EXPECT_DOUBLE_EQ(loss / 84, std::floor(loss / 84)) << "7 x 12 bytes per supervised row";
  // ZeRO-3 over 32 ranks or tp 8 x ZeRO-3 over 4: about the same bytes per rank (the vision
  // tower, frozen and unsplit, is sharded over 4 instead of 32); the gathered units shrink 8x.
  EXPECT_LT(eight["gathered_peak_bytes"].get<double>(), one["gathered_peak_bytes"].get<double>() / 6);
  auto bad = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2-vl-2b", "--world-size", "8",
                             "--set", "dist.tp=8"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("12 attention heads do not divide by tp = 8"), std::string::npos) << bad.output;
}

// Whether a stage of `stages` holding decoder layers [a, b) holds the parameter `name` (the
// tied head's embedding on the first and the last stage), from the parameter's name alone.
bool stage_holds(const std::string& name, int64_t s, int64_t stages, int64_t a, int64_t b, bool tied) {
  auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  if (starts("visual.")) return s == 0;
  if (starts("model.embed_tokens.")) return s == 0 || (tied && s == stages - 1);
  if (starts("model.norm.") || starts("lm_head.")) return s == stages - 1;
  const std::string layers = "model.layers.";
  EXPECT_TRUE(starts("model.layers.")) << name;
  const int64_t i = std::stoll(name.substr(layers.size()));
  return i >= a && i < b;
}

// Split by tensor parallelism (docs/tensor_parallel.md's table, dense decoder): a tp rank holds
// 1 / tp of these.
bool tp_split(const std::string& name) {
  if (name.rfind("visual.", 0) == 0) return false;
  for (const char* part : {".q_proj.", ".k_proj.", ".v_proj.", ".o_proj.", ".gate_proj.", ".up_proj.", ".down_proj.",
                           "embed_tokens.", "lm_head."})
    if (name.find(part) != std::string::npos) return true;
  return false;
}

// dist.pp: each stage's parameters per rank are its layers' (from the stage's range), the
// tower and embedding on stage 0, the norm and head on the last (a tied head's embedding on
// both), split ones / tp, summed here over the model's own named_parameters; the bubble and
// the link bytes from their formulas; the plan's step peak is its largest stage's. 72B at
// tp 8 x pp 2 x dp 2 (untied head), 3B at pp 4 x dp 2 (tied).
TEST(Plan, PipelineStagesHoldTheirLayersParameters) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_qwen25.toml";
  struct Layout {
    std::string preset;
    int64_t world, tp, pp;
  };
  const int64_t m = 8, tokens = 8192;
  for (const Layout& l : {Layout{"qwen2.5-vl-72b", 32, 8, 2}, Layout{"qwen2.5-vl-3b", 8, 1, 4}}) {
    SCOPED_TRACE(l.preset);
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", l.preset, "--world-size",
                             std::to_string(l.world), "--nproc-per-node", "8", "--tokens", std::to_string(tokens),
                             "--image-tokens", "4096", "--micro-batches", std::to_string(m), "--set",
                             "dist.tp=" + std::to_string(l.tp), "--set", "dist.pp=" + std::to_string(l.pp), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    ASSERT_TRUE(j.contains("pipeline_parallel")) << r.output;
    const auto& pp = j["pipeline_parallel"];
    EXPECT_EQ(pp["data_parallel"].get<int64_t>(), l.world / (l.pp * l.tp));
    EXPECT_DOUBLE_EQ(pp["bubble"].get<double>(), static_cast<double>(l.pp - 1) / static_cast<double>(m + l.pp - 1));
    const vlm::VlmConfig cfg = vlm::preset(l.preset);
    // [B, L / tp, d] in bf16 (tp: each rank's sequence chunk; 8192 divides by 8), forward and
    // backward: B x L = the micro-batch's tokens.
    EXPECT_DOUBLE_EQ(pp["link_bytes_per_micro_batch"].get<double>(),
                     static_cast<double>(tokens / l.tp) * static_cast<double>(cfg.text.hidden_size) * 2 * 2);
    vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
    const auto& stages = pp["stages"];
    ASSERT_EQ(static_cast<int64_t>(stages.size()), l.pp);
    int64_t next = 0;
    double peak = 0;
    for (int64_t s = 0; s < l.pp; ++s) {
      const auto& st = stages[static_cast<size_t>(s)];
      const int64_t a = st["first_layer"], b = st["end_layer"];
      EXPECT_EQ(a, next) << "stage " << s << ": the stages' layers are contiguous";
      EXPECT_LT(a, b);
      next = b;
      int64_t want = 0;
      for (const auto& p : model->named_parameters())
        if (stage_holds(p.key(), s, l.pp, a, b, cfg.tie_word_embeddings))
          want += p.value().numel() / (tp_split(p.key()) ? l.tp : 1);
      EXPECT_EQ(st["params_per_rank"].get<int64_t>(), want) << "stage " << s;
      EXPECT_EQ(st["in_flight"].get<int64_t>(), std::min(l.pp - s, m)) << "stage " << s;
      peak = std::max(peak, st["step_peak_bytes"].get<double>());
    }
    EXPECT_EQ(next, cfg.text.num_hidden_layers);
    EXPECT_EQ(j["step_peak"]["total_bytes"].get<double>(), peak);
  }
}

}  // namespace

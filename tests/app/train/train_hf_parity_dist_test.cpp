// Training parity with HF transformers: 20 steps of `vlmtrain train` (world 1) and
// `vlmtrain launch --nproc-per-node 2` (world 2: the tiny recipe's FSDP full_shard vision
// blocks and decoder layers, DDP for the rest) against transformers' model + torch AdamW
// started from the same HF directory and fed the same micro-batches.
//
// scripts/hf_train_reference.py `init` draws a tiny random model with transformers and
// saves it; vlmtrain trains from that directory and writes every micro-batch it consumed
// (VLMTRAIN_DUMP_BATCHES); `train` replays them in transformers (HF computes its own M-RoPE
// position ids and checks the dumped ones against them), with torch's clip_grad_norm_,
// torch.optim.AdamW under vlmtrain's parameter groups (the tiny recipe's ViT lr, no decay on
// biases and norms) and the schedule's formula. Every step's loss and pre-clip grad norm
// must agree within 1e-4 relative (measured: <= 4e-7 for the loss, <= 5e-6 for the grad norm,
// transformers 5.23, fp32 on CPU). Small micro-batch token budgets make the steps
// accumulate over 2-4 micro-batches.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "tests/app/train/train_testing.h"
#include "tests/testing.h"

using vlm::test::TempDir;

namespace {

TempDir* g_hft_data = nullptr;
std::vector<std::string> g_hft_special_ids;  // image_pad, vision_start, vision_end, im_end

class TrainHfParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_hft_data = new TempDir("hf-train-data");
    vlm::test::make_synth_data(g_hft_data->path(), 24, 7);
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "tokenize", "--ids", "--tokenizer", *g_hft_data / "tokenizer.model",
                           "--", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_end|>"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) g_hft_special_ids.push_back(line);
    ASSERT_EQ(g_hft_special_ids.size(), 4u) << r.output;
  }
  static void TearDownTestSuite() {
    delete g_hft_data;
    g_hft_data = nullptr;
    g_hft_special_ids.clear();
  }
};

// JSON lines of a command's output that hold `key`.
std::vector<nlohmann::json> hft_json_lines(const std::string& out, const char* key) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains(key)) lines.push_back(j);
  }
  return lines;
}

double hft_rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// pad_id: the config's pad_token_id (HF never trains that embedding row) or "" for none.
// How closely the runs must agree: every step's loss and grad norm within 1e-4, or (chaotic
// models) the first `strict_steps` so, and the later steps' losses no further from HF's than
// `drift_factor` times HF's own drift: the same replay on 2 threads instead of 1 (a different
// summation order and nothing else), compared with the 1-thread one.
struct HftBounds {
  int strict_steps = 1 << 30;
  double drift_factor = 0;
  double strict_tol = 1e-4;  // loss and grad norm of the strict steps
};

// lr: the recipe's optim.lr (the ViT group takes a tenth of it).
void hft_check(const std::string& family, int nproc, int samples_per_rank, const std::string& pad_id = "",
               const std::vector<std::string>& extra_sets = {}, const std::string& lr = "2e-3",
               const std::string& vit_lr = "2e-4", const HftBounds& bounds = {}, const std::string& aux_coef = "0") {
  constexpr int kSteps = 20;
  TempDir dir("hf-train");
  const std::string py = vlm::test::python_tool("python");
  const std::string script = vlm::test::source_dir() + "/scripts/hf_train_reference.py";
  auto init = vlm::test::run({py, script, "init", "--out", dir / "model", "--family", family, "--vocab-size", "400",
                            "--image-token-id", g_hft_special_ids[0], "--vision-start-id", g_hft_special_ids[1],
                            "--vision-end-id", g_hft_special_ids[2], "--eos-id", g_hft_special_ids[3], "--seed", "5",
                            "--pad-token-id", pad_id.empty() ? "-1" : pad_id},
                           std::chrono::seconds(300));
  ASSERT_EQ(init.exit_code, 0) << init.output;

  std::vector<std::string> argv = {vlm::test::vlmtrain_bin()};
  if (nproc == 1) {
    argv.push_back("train");
  } else {
    argv.insert(argv.end(), {"launch", "--nproc-per-node", std::to_string(nproc)});
  }
  const std::vector<std::string> sets = {
      "run.output_dir=" + (dir / "run"), "model.preset=", "model.path=" + (dir / "model"),
      "model.tokenizer=" + (*g_hft_data / "tokenizer.model"), "data.train=" + (*g_hft_data / "train.jsonl"),
      "data.eval=[]", "data.synth.generate_if_missing=false", "data.num_workers=1",
      "batch.samples_per_rank=" + std::to_string(samples_per_rank), "batch.max_tokens=128",
      "schedule.steps=" + std::to_string(kSteps), "schedule.warmup_steps=5", "schedule.decay=cosine",
      "schedule.min_lr_ratio=0.1", "optim.lr=" + lr, "optim.weight_decay=0.01", "optim.grad_clip=1.0",
      "precision.param_dtype=fp32", "eval.every=0", "eval.at_end=false", "log.every=1", "checkpoint.every=0",
      "checkpoint.save_final=false", "dist.timeout_s=60", "model.router_aux_loss_coef=" + aux_coef};
  argv.push_back(vlm::test::source_dir() + "/recipes/ocr_tiny.toml");
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  for (const auto& s : extra_sets) argv.insert(argv.end(), {"--set", s});
  auto train = vlm::test::run(argv, std::chrono::seconds(300), {"VLMTRAIN_DUMP_BATCHES=" + (dir / "batches")});
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto losses = vlm::test::metrics_lines(dir / "run");
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps)) << train.output;
  ASSERT_TRUE(vlm::test::file_exists(dir / ("batches/step-000001.rank-" + std::to_string(nproc - 1) + ".mb-0.safetensors")))
      << "every rank dumps its micro-batches";

  // The tiny recipe's ViT group lr (optim.group visual.patch_embed.*|visual.blocks.*).
  auto ref = vlm::test::run({py, script, "train", "--model", dir / "model", "--batches", dir / "batches", "--steps",
                           std::to_string(kSteps), "--lr", lr, "--weight-decay", "0.01", "--grad-clip", "1.0",
                           "--warmup", "5", "--decay", "cosine", "--min-lr-ratio", "0.1", "--group",
                           "visual.patch_embed.*|visual.blocks.*=" + vit_lr, "--router-aux-coef", aux_coef},
                          std::chrono::seconds(300));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto hf = hft_json_lines(ref.output, "loss");
  ASSERT_EQ(hf.size(), static_cast<size_t>(kSteps)) << ref.output;
  double hf_drift = 0;  // max over the later steps of |loss(2 threads) - loss(1 thread)| / loss
  if (bounds.strict_steps < kSteps) {
    auto alt = vlm::test::run({py, script, "train", "--model", dir / "model", "--batches", dir / "batches", "--steps",
                               std::to_string(kSteps), "--lr", lr, "--weight-decay", "0.01", "--grad-clip", "1.0",
                               "--warmup", "5", "--decay", "cosine", "--min-lr-ratio", "0.1", "--group",
                               "visual.patch_embed.*|visual.blocks.*=" + vit_lr, "--threads", "2",
                               "--router-aux-coef", aux_coef},
                              std::chrono::seconds(300));
    ASSERT_EQ(alt.exit_code, 0) << alt.output;
    const auto hf2 = hft_json_lines(alt.output, "loss");
    ASSERT_EQ(hf2.size(), static_cast<size_t>(kSteps)) << alt.output;
    for (int s = bounds.strict_steps; s < kSteps; ++s)
      hf_drift = std::max(hf_drift, hft_rel(hf2[s].at("loss").get<double>(), hf[s].at("loss").get<double>()));
  }
  EXPECT_EQ(vlm::test::last_json_line(ref.output).at("max_position_id_diff").get<int64_t>(), 0);

  int accumulating = 0;
  double worst_loss = 0, worst_gnorm = 0, worst_later = 0;
  for (int s = 0; s < kSteps; ++s) {
    const auto& v = losses[s];
    const auto& h = hf[s];
    ASSERT_EQ(v.at("step").get<int>(), s + 1);
    ASSERT_EQ(h.at("step").get<int>(), s + 1);
    EXPECT_EQ(v.at("supervised_tokens").get<int64_t>(), h.at("supervised_tokens").get<int64_t>()) << "step " << s + 1;
    EXPECT_NEAR(v.at("lr").get<double>(), h.at("lr").get<double>(), 1e-12) << "step " << s + 1;
    const double dl = hft_rel(v.at("loss").get<double>(), h.at("loss").get<double>());
    const double dg = hft_rel(v.at("grad_norm").get<double>(), h.at("grad_norm").get<double>());
    const bool strict = s < bounds.strict_steps;
    if (strict) EXPECT_LE(dl, bounds.strict_tol) << "step " << s + 1 << ": vlmtrain loss " << v.at("loss") << ", HF " << h.at("loss");
    if (!strict) worst_later = std::max(worst_later, dl);
    if (strict)
      EXPECT_LE(dg, bounds.strict_tol) << "step " << s + 1 << ": vlmtrain grad norm " << v.at("grad_norm") << ", HF "
                          << h.at("grad_norm");
    worst_loss = std::max(worst_loss, dl);
    if (strict) worst_gnorm = std::max(worst_gnorm, dg);
    if (h.at("micro_batches").get<int>() > nproc) ++accumulating;
  }
  if (bounds.strict_steps < kSteps) {
    EXPECT_GT(hf_drift, 0.0) << "HF's 1- and 2-thread replays agree exactly: the control cannot tell chaos";
    EXPECT_LE(worst_later, bounds.drift_factor * hf_drift)
        << "after step " << bounds.strict_steps << ": vlmtrain drifts from HF by " << worst_later
        << " (loss), HF from itself on 2 threads by " << hf_drift;
    std::printf("%s world %d: later steps drift %.2e from HF; HF 1 vs 2 threads drifts %.2e\n", family.c_str(), nproc,
                worst_later, hf_drift);
  }
  EXPECT_GT(accumulating, kSteps / 2) << "most steps must accumulate over several micro-batches per rank";
  // The loss must have moved: a run that does not train would also "agree".
  EXPECT_LT(losses.back().at("loss").get<double>(), 0.8 * losses.front().at("loss").get<double>());
  std::printf("%s world %d: max relative difference over %d steps: loss %.2e, grad norm %.2e (over %d steps)\n",
              family.c_str(), nproc, kSteps, worst_loss, worst_gnorm, std::min(kSteps, bounds.strict_steps));
}

// pad_token_id = <|im_end|>, which is also an input token of every sample: HF freezes its
// embedding row (a 2.5% grad-norm difference at step 1 before vlmtrain did the same).
TEST_F(TrainHfParity, Qwen2VLWorld1PadTokenId) { hft_check("qwen2_vl", 1, 4, g_hft_special_ids[3]); }
TEST_F(TrainHfParity, Qwen2VLWorld2Fsdp) { hft_check("qwen2_vl", 2, 4); }
TEST_F(TrainHfParity, Qwen25VLWorld2Fsdp) { hft_check("qwen2_5_vl", 2, 4); }
// World 1, tied head, every unit plain DDP (scripts/bench_hf_step.py's setup): measured
// loss 1.5e-7, grad norm 7.0e-7, so the bench's grad-norm differences (bench/RESULTS.md
// section 6) do not come from this path.
TEST_F(TrainHfParity, Qwen25VLWorld1AllDdpTied) {
  hft_check("qwen2_5_vl", 1, 4, "", {"sharding.default=ddp", "sharding.module=[]"});
}
// Qwen3-VL: 16-px patches through the whole pipeline (processor, collate, DeepStack units
// under FSDP/DDP, the position table's unit).
TEST_F(TrainHfParity, Qwen3VLWorld2Fsdp) { hft_check("qwen3_vl", 2, 4); }
// Qwen3.5 (Gated DeltaNet + gated attention; the tiny pattern three linear, one full; the
// decays as transformers initialises them). Its template adds an empty think block before
// each answer (about 20 more tokens with the synthetic tokenizer), hence the larger budget.
// What holds for Qwen3.5: step 1 (same parameters, same micro-batches, through data,
// template, collate, sharding and the optimizer's clip) agrees to 1e-4 in loss and grad norm
// (measured 3.7e-6 world 1, 2.8e-6 world 2). Later steps do not agree to 1e-4, and cannot:
// the tiny random Qwen3.5 is chaotic in fp32 under AdamW, so HF does not agree with itself
// either: the same replay on 2 threads instead of 1 drifts from the 1-thread losses by up to
// 6% (measured, step 11), vlmtrain from the 1-thread HF by up to 11% (step 20), in both
// directions. The later losses must stay within 3x HF's own drift.
const HftBounds kQwen35Bounds{1, 3.0};
const std::vector<std::string> kQwen35Sets{"batch.max_tokens=176",
                                           "optim.group=[{match=\"visual.patch_embed.*|visual.blocks.*\",lr=2e-4}]"};
TEST_F(TrainHfParity, Qwen35World1) { hft_check("qwen3_5", 1, 4, "", kQwen35Sets, "2e-3", "2e-4", kQwen35Bounds); }
TEST_F(TrainHfParity, Qwen35World2Fsdp) { hft_check("qwen3_5", 2, 4, "", kQwen35Sets, "2e-3", "2e-4", kQwen35Bounds); }
// Mixture of experts (6 experts, top-2; the tiny recipe's FSDP units hold the fused experts):
// Qwen3-VL-MoE at world 2 with the load-balancing loss in the objective (coef 0.05, so that
// it moves the routers), Qwen3.5-MoE (shared expert, Gated DeltaNet: Qwen3.5's bounds) at
// world 1 without it.
TEST_F(TrainHfParity, Qwen3VLMoeWorld2FsdpAuxLoss) {
  hft_check("qwen3_vl_moe", 2, 4, "", {}, "2e-3", "2e-4", {}, "0.05");
}
// Its step-1 grad norm differs from HF's by 1.03e-4 (measured; the loss by far less): the
// dense Qwen3.5's fp32 gradient spread (HfParity allows 5e-4 per parameter, float64 agrees to
// 1e-15 for this model) now reaching the routers; held to 3e-4.
TEST_F(TrainHfParity, Qwen35MoeWorld1) {
  hft_check("qwen3_5_moe", 1, 4, "", kQwen35Sets, "2e-3", "2e-4", HftBounds{1, 3.0, 3e-4});
}

}  // namespace

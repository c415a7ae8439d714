// LoRA checkpoints through the CLI: a LoRA run of the tiny preset (3 steps, adapters on the
// decoder's q/k/v/o/MLP, everything else frozen) is exported as a PEFT adapter and as a
// merged model, and read back by `vlmtrain eval` and by PEFT. Also on tiny-qwen3, tiny-qwen3.5,
// and tiny-qwen3-moe at world 2 with its experts expert-parallel (ep 2, trained in full:
// PEFT's modules_to_save, all 8 experts per layer).
//
// References: the checkpoint itself (the adapter file holds its tensors exactly, with the
// recipe's r and alpha); PEFT 0.21 at test time (scripts/peft_reference.py load: the exported
// adapter on the base saved as an HF directory, PeftModel.from_pretrained, fp32 eager) for
// logits; the unmerged model for the merged export. Tolerance: 1e-5 relative to the largest
// |logit| (fp32 on both sides; the vlm/ LoRA-vs-PEFT tests measure ~1e-6).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/train/checkpoint.h"
#include "app/config/lora_model.h"
#include "app/config/model_source.h"
#include "tests/app/train/train_testing.h"
#include "tests/testing.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/lora.h"
#include "vlm/families/registry.h"
#include "vlm/io/peft_adapter.h"
#include "vlm/io/safetensors.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

constexpr double kLeTol = 1e-5;

// A LoRA run shared by the tests of this file: adapters only, or adapters + the merger trained
// in full (ddp), which exports as PEFT's modules_to_save.
struct LeRun {
  std::unique_ptr<TempDir> dir;
  std::string ckpt;  // its final checkpoint
  std::string error;
};

// preset: "" = the recipe's (tiny, Qwen2-VL), or e.g. "tiny-qwen3". targets: the LoRA rule's
// module globs. ep > 1: `ep` ranks (vlmtrain launch) with the MoE experts split over them
// (policy ep, trained in full beside the adapters).
LeRun le_make_run(bool with_merger, const std::string& preset = "",
                  const std::string& targets = "model.layers.*.self_attn.*_proj|model.layers.*.mlp.*_proj",
                  int ep = 1) {
    LeRun out;
    out.dir = std::make_unique<TempDir>(with_merger ? "lora_export_merger" : "lora_export" + preset);
    const std::string data = *out.dir / "data";
    auto synth = vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--out", data, "--train", "24", "--val", "8",
                               "--seed", "3", "--vocab-size", "400"},
                              std::chrono::seconds(120));
    if (synth.exit_code != 0) {
      out.error = "synth-ocr failed:\n" + synth.output;
      return out;
    }
    std::vector<std::string> argv = vlm::test::tiny_train_args(*out.dir / "run", data, 3, 0);
    if (ep > 1) {
      argv[1] = "launch";
      argv.insert(argv.begin() + 2, {"--nproc-per-node", std::to_string(ep)});
      argv.insert(argv.end(), {"--set", "dist.ep=" + std::to_string(ep)});
    }
    for (const std::string& s :
         {std::string("sharding.default=freeze"),
          std::string("sharding.module=[") + (with_merger ? "{match = \"visual.merger\", policy = \"ddp\"}, " : "") +
              (ep > 1 ? "{match = \"*.mlp.experts\", policy = \"ep\"}, " : "") +
              "{match = \"" + targets + "\", policy = \"lora\", strategy = \"full_shard\", r = 4, alpha = 8}]",
          std::string("data.eval=[\"") + data + "/val.jsonl\"]",
          std::string("model.preset=") + (preset.empty() ? "tiny" : preset)}) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    auto train = vlm::test::run(argv, std::chrono::seconds(300));
    if (train.exit_code != 0) {
      out.error = "LoRA training failed:\n" + train.output;
      return out;
    }
    auto all = vlm::app::complete_checkpoints(*out.dir / "run");
    if (all.empty()) out.error = "no checkpoint in " + (*out.dir / "run") + ":\n" + train.output;
    else out.ckpt = all.back();
    return out;
}

LeRun& le_run() {
  static LeRun r = le_make_run(false);
  return r;
}

LeRun& le_run_with_merger() {
  static LeRun r = le_make_run(true);
  return r;
}

LeRun& le_run_qwen3() {
  static LeRun r = le_make_run(false, "tiny-qwen3");
  return r;
}

// Qwen3.5: adapters on the Gated DeltaNet projections too (in_proj_qkv / z / b / a, out_proj).
LeRun& le_run_qwen3_5() {
  static LeRun r = le_make_run(false, "tiny-qwen3.5",
                               "model.layers.*.self_attn.*_proj|model.layers.*.linear_attn.in_proj_*|"
                               "model.layers.*.linear_attn.out_proj|model.layers.*.mlp.*_proj");
  return r;
}

// Qwen3-VL-MoE at world 2 with dist.ep = 2: LoRA on attention, each rank training half the
// experts in full (their layers' unit: a frozen base, +experts, +lora).
LeRun& le_run_moe_ep() {
  static LeRun r = le_make_run(false, "tiny-qwen3-moe", "model.layers.*.self_attn.*_proj", 2);
  return r;
}

vlm::app::ModelSection le_base(const vlm::app::CheckpointReader& ck) {
  vlm::app::ModelSection m = vlm::app::checkpoint_recipe(ck).model;
  m.tokenizer = ck.tokenizer_path();
  return m;
}

vlm::app::LoadModelOptions le_opts(const vlm::app::CheckpointReader& ck) {
  vlm::app::LoadModelOptions o;
  o.seed = static_cast<uint64_t>(vlm::app::checkpoint_recipe(ck).run.seed);
  return o;
}

// Two rows: <vision_start> 4 image tokens <vision_end> + 12 text tokens; labels on the text.
vlm::Batch le_batch(const vlm::VlmConfig& cfg) { return vlm::test::image_text_batch(cfg, 77, 12); }

torch::Tensor le_logits(vlm::VisionLanguageModel& m, const vlm::Batch& b) {
  torch::NoGradGuard ng;
  m->eval();
  return m->forward(b, /*return_logits=*/true).logits;
}

double le_rel(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

#define LE_REQUIRE_RUN(r)                      \
  do {                                         \
    ASSERT_TRUE((r).error.empty()) << (r).error; \
  } while (0)

}  // namespace

TEST(LoraExport, CheckpointHoldsAdaptersOnlyAndExportsThemExactly) {
  LeRun& r = le_run();
  LE_REQUIRE_RUN(r);
  vlm::app::CheckpointReader ck(r.ckpt);
  ASSERT_TRUE(vlm::app::is_lora_checkpoint(ck));
  EXPECT_TRUE(vlm::app::full_trained_tensors(ck).empty());
  const auto tensors = ck.consolidated();
  ASSERT_FALSE(tensors.empty());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(vlm::is_lora_param(name)) << name;

  const std::string out = *r.dir / "adapter";
  auto ex = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", r.ckpt, "--out", out});
  ASSERT_EQ(ex.exit_code, 0) << ex.output;
  const vlm::PeftAdapter a = vlm::read_peft_adapter(out);
  ASSERT_EQ(a.modules.size() * 2, tensors.size());
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  int64_t nonzero_b = 0;
  for (const auto& m : a.modules) {
    EXPECT_EQ(m.options.r, 4) << m.module;
    EXPECT_EQ(m.options.alpha, 8) << m.module;
    EXPECT_TRUE(torch::equal(m.lora_A.to(torch::kFloat32), by_name.at(m.module + ".lora_A.weight"))) << m.module;
    EXPECT_TRUE(torch::equal(m.lora_B.to(torch::kFloat32), by_name.at(m.module + ".lora_B.weight"))) << m.module;
    nonzero_b += m.lora_B.abs().max().item<double>() > 0;
  }
  EXPECT_EQ(nonzero_b, static_cast<int64_t>(a.modules.size())) << "3 steps must move every B away from 0";
}

// Exports `r`'s checkpoint as a PEFT adapter, saves the base as an HF directory, and has PEFT
// load both: its logits must be vlmtrain's (the checkpoint on the base).
static void le_check_peft_logits(LeRun& r, const std::string& tag) {
  vlm::app::CheckpointReader ck(r.ckpt);
  const std::string adapter = *r.dir / "adapter_peft";
  auto ex = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", r.ckpt, "--out", adapter});
  ASSERT_EQ(ex.exit_code, 0) << ex.output;
  // The base as an HF directory (what PEFT loads the adapter onto).
  vlm::app::LoadedModel base = vlm::app::load_model(le_base(ck), le_opts(ck));
  vlm::NamedTensors base_tensors;
  for (const auto& p : base.model->named_parameters()) base_tensors.emplace_back(p.key(), p.value().detach());
  vlm::SaveHfOptions so;
  so.dtype = torch::kFloat32;
  so.style = vlm::family_spec(base.model->cfg.family).nested_names ? vlm::HfNameStyle::kNested
                                                                      : vlm::HfNameStyle::kLegacy;
  so.extra_files.emplace_back("config.json", ck.config_json());
  const std::string base_dir = *r.dir / "base_hf";
  vlm::save_hf_checkpoint(base_dir, base_tensors, so);

  vlm::app::LoadedModel lm = vlm::app::load_lora_checkpoint(ck, le_base(ck), le_opts(ck));
  const vlm::Batch b = le_batch(lm.model->cfg);
  const torch::Tensor ours = le_logits(lm.model, b);
  const std::string io = *r.dir / "batch.io.safetensors", peft_out = *r.dir / "peft.out.safetensors";
  vlm::save_safetensors(io, {{"input_ids", b.input_ids}, {"attention_mask", b.attention_mask}, {"labels", b.labels},
                             {"pixel_values", b.pixel_values}, {"image_grid_thw", b.image_grid_thw}});
  auto py = vlm::test::run({vlm::test::python_tool("python"), vlm::test::source_dir() + "/scripts/peft_reference.py", "load",
                          "--base", base_dir, "--adapter", adapter, "--io", io, "--out", peft_out},
                         std::chrono::seconds(300));
  ASSERT_EQ(py.exit_code, 0) << "PEFT could not load vlmtrain's exported adapter:\n" << py.output;
  const torch::Tensor theirs = vlm::SafetensorsFile::open(peft_out).get("logits").clone();
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  const double rel = le_rel(ours, theirs);
  std::cout << "[lora_export] " << tag << ": vlmtrain LoRA checkpoint vs PEFT(exported adapter) logits: " << rel << "\n";
  EXPECT_LE(rel, kLeTol);
  // And the adapters are not a no-op on this batch (else the comparison proves little).
  EXPECT_GT(le_rel(le_logits(base.model, b), theirs), 100 * kLeTol);
}

TEST(LoraExport, PeftLoadsTheExportedAdapterToVlmtrainsLogits) {
  LeRun& r = le_run();
  LE_REQUIRE_RUN(r);
  le_check_peft_logits(r, "adapters");
}

// Qwen3-VL: the same LoRA table on tiny-qwen3 (q_norm / k_norm are not Linears: untouched);
// PEFT loads the exported adapter onto transformers' Qwen3VLForConditionalGeneration.
TEST(LoraExport, Qwen3AdapterLoadsInPeftToVlmtrainsLogits) {
  LeRun& r = le_run_qwen3();
  LE_REQUIRE_RUN(r);
  vlm::app::CheckpointReader ck(r.ckpt);
  EXPECT_EQ(vlm::app::checkpoint_recipe(ck).model.preset, "tiny-qwen3");
  le_check_peft_logits(r, "qwen3_vl adapters");
}

// Qwen3.5: PEFT loads the exported adapter (linear-attention projections included) onto
// transformers' Qwen3_5ForConditionalGeneration.
TEST(LoraExport, Qwen35AdapterLoadsInPeftToVlmtrainsLogits) {
  LeRun& r = le_run_qwen3_5();
  LE_REQUIRE_RUN(r);
  vlm::app::CheckpointReader ck(r.ckpt);
  EXPECT_EQ(vlm::app::checkpoint_recipe(ck).model.preset, "tiny-qwen3.5");
  le_check_peft_logits(r, "qwen3_5 adapters");
  const vlm::PeftAdapter a = vlm::read_peft_adapter(*r.dir / "adapter_peft");
  bool linear_attn = false;
  for (const auto& m : a.target_modules) linear_attn = linear_attn || m.find("in_proj_qkv") != std::string::npos;
  EXPECT_TRUE(linear_attn) << "the adapter should target the Gated DeltaNet's in_proj_qkv";
}

// The merger trained in full beside the adapters: exported as modules_to_save, which PEFT loads.
TEST(LoraExport, UnitsTrainedInFullExportAsModulesToSave) {
  LeRun& r = le_run_with_merger();
  LE_REQUIRE_RUN(r);
  vlm::app::CheckpointReader ck(r.ckpt);
  EXPECT_EQ(vlm::app::full_trained_units(ck), std::vector<std::string>{"visual.merger"});
  le_check_peft_logits(r, "adapters + merger");
  const vlm::PeftAdapter a = vlm::read_peft_adapter(*r.dir / "adapter_peft");
  EXPECT_EQ(a.modules_to_save, std::vector<std::string>{"model.visual.merger"});
  const auto trained = ck.consolidated();
  std::map<std::string, torch::Tensor> by_name(trained.begin(), trained.end());
  ASSERT_EQ(a.saved_tensors.size(), vlm::app::full_trained_tensors(ck).size());
  for (const auto& [name, t] : a.saved_tensors) EXPECT_TRUE(torch::equal(t.to(torch::kFloat32), by_name.at(name))) << name;
}

// LoRA beside expert parallelism: the experts the ranks trained in full (ep 2) export whole,
// all 8 per layer, as PEFT's modules_to_save; PEFT loads the adapter to vlmtrain's logits.
TEST(LoraExport, ExpertParallelExpertsExportAsModulesToSave) {
  LeRun& r = le_run_moe_ep();
  LE_REQUIRE_RUN(r);
  vlm::app::CheckpointReader ck(r.ckpt);
  EXPECT_EQ(ck.world_size(), 2);
  EXPECT_EQ(vlm::app::full_trained_units(ck),
            (std::vector<std::string>{"model.layers.1.mlp.experts", "model.layers.2.mlp.experts",
                                      "model.layers.3.mlp.experts"}));
  le_check_peft_logits(r, "qwen3_vl_moe adapters + ep experts");
  const vlm::PeftAdapter a = vlm::read_peft_adapter(*r.dir / "adapter_peft");
  EXPECT_EQ(a.modules_to_save.size(), 3u);
  const auto trained = ck.consolidated();
  std::map<std::string, torch::Tensor> by_name(trained.begin(), trained.end());
  ASSERT_EQ(a.saved_tensors.size(), vlm::app::full_trained_tensors(ck).size());
  for (const auto& [name, t] : a.saved_tensors) {
    EXPECT_TRUE(torch::equal(t.to(torch::kFloat32), by_name.at(name))) << name;
    EXPECT_EQ(t.size(0), 8) << name << ": every expert, not one rank's half";
  }
}

TEST(LoraExport, MergedExportEqualsUnmergedAndEvalReadsCheckpointAndAdapterAlike) {
  LeRun& r = le_run();
  LE_REQUIRE_RUN(r);
  vlm::app::CheckpointReader ck(r.ckpt);
  const std::string merged = *r.dir / "merged";
  auto ex = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", r.ckpt, "--out", merged, "--merge",
                          "--dtype", "fp32"});
  ASSERT_EQ(ex.exit_code, 0) << ex.output;
  vlm::app::ModelSection m;
  m.path = merged;
  vlm::app::LoadedModel hf = vlm::app::load_model(m, {});
  EXPECT_TRUE(vlm::lora_modules(*hf.model).empty());
  vlm::app::LoadedModel lm = vlm::app::load_lora_checkpoint(ck, le_base(ck), le_opts(ck));
  const vlm::Batch b = le_batch(lm.model->cfg);
  const double rel = le_rel(le_logits(hf.model, b), le_logits(lm.model, b));
  std::cout << "[lora_export] merged export vs unmerged logits: " << rel << "\n";
  EXPECT_LE(rel, kLeTol);

  // eval --checkpoint (base + checkpoint) and eval --adapter (base + exported adapter): the
  // same greedy predictions, sample by sample.
  const std::string adapter = *r.dir / "adapter_eval";
  ASSERT_EQ(vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", r.ckpt, "--out", adapter}).exit_code, 0);
  const std::string recipe = ck.dir() + "/recipe.toml";
  std::vector<std::string> preds;
  for (const std::vector<std::string>& how : {std::vector<std::string>{"--checkpoint", r.ckpt},
                                              std::vector<std::string>{"--adapter", adapter}}) {
    const std::string out = *r.dir / ("eval" + how[0]);
    std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "eval", recipe, how[0], how[1], "--out", out,
                                     "--max-new-tokens", "8"};
    auto ev = vlm::test::run(argv, std::chrono::seconds(300));
    ASSERT_EQ(ev.exit_code, 0) << ev.output;
    EXPECT_NE(ev.output.find(how[0] == "--adapter" ? "+ PEFT adapter" : "+ LoRA checkpoint"), std::string::npos)
        << ev.output;
    std::string all;
    std::ifstream in(out + "/predictions.jsonl");
    std::string line;
    while (std::getline(in, line)) all += nlohmann::json::parse(line).at("prediction").get<std::string>() + "\n";
    preds.push_back(all);
  }
  ASSERT_EQ(preds.size(), 2u);
  EXPECT_FALSE(preds[0].empty());
  EXPECT_EQ(preds[0], preds[1]);
}

TEST(LoraExport, BadUseIsAClearError) {
  LeRun& r = le_run();
  LE_REQUIRE_RUN(r);
  const std::string out = *r.dir / "adapter_twice";
  ASSERT_EQ(vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", r.ckpt, "--out", out}).exit_code, 0);
  auto again = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", r.ckpt, "--out", out});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("exists (hint: --overwrite"), std::string::npos) << again.output;
  EXPECT_TRUE(fs::exists(fs::path(out) / "adapter_model.safetensors"));
  auto base_alone = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", r.ckpt, "--out",
                                  *r.dir / "x", "--base", "/nonexistent"});
  EXPECT_NE(base_alone.exit_code, 0);
  EXPECT_NE(base_alone.output.find("--base applies with --merge only"), std::string::npos) << base_alone.output;
  auto bad_adapter = vlm::test::run({vlm::test::vlmtrain_bin(), "eval", r.ckpt + "/recipe.toml", "--adapter",
                                   *r.dir / "no_such_adapter"});
  EXPECT_NE(bad_adapter.exit_code, 0);
  EXPECT_NE(bad_adapter.output.find("no_such_adapter"), std::string::npos) << bad_adapter.output;
}

// `vlmtrain export` of a Qwen3-VL run (preset tiny-qwen3, 2 steps), of a Qwen3.5 run
// (tiny-qwen3.5) and of their MoE siblings (tiny-qwen3-moe, tiny-qwen3.5-moe) writes what
// transformers loads: tensor names in the hub layout
// (model.visual.*, model.language_model.*, DeepStack mergers / Gated DeltaNet included), a
// config.json that Qwen3VLForConditionalGeneration / Qwen3_5ForConditionalGeneration reads
// with no missing or unexpected keys, and weights whose logits on a batch with images equal
// vlmtrain's on the checkpoint it came from (scripts/hf_forward_reference.py: from_pretrained
// with every tensor loaded, fp32 eager; tolerance 1e-5 of the largest |logit|, as the parity
// tests; measured 2.9e-7 and 6.7e-7).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "app/train/checkpoint.h"
#include "app/config/model_source.h"
#include "tests/app/train/train_testing.h"
#include "tests/require_sentencepiece.h"
#include "tests/testing.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/meta_init.h"
#include "vlm/io/safetensors.h"

using vlm::test::TempDir;


struct ExportCase {
  std::string preset, model_type, hf_class;
  std::vector<std::string> hub_names;  // tensors that must be stored under these names
  double tol;
};

class ExportQwen3 : public ::testing::TestWithParam<ExportCase> {};

INSTANTIATE_TEST_SUITE_P(
    Families, ExportQwen3,
    ::testing::Values(ExportCase{"tiny-qwen3", "qwen3_vl", "Qwen3VLForConditionalGeneration",
                                 {"model.visual.deepstack_merger_list.0.linear_fc1.weight", "model.visual.pos_embed.weight",
                                  "model.language_model.layers.0.self_attn.q_norm.weight"},
                                 1e-5},
                      ExportCase{"tiny-qwen3.5", "qwen3_5", "Qwen3_5ForConditionalGeneration",
                                 {"model.visual.pos_embed.weight", "model.language_model.layers.0.linear_attn.A_log",
                                  "model.language_model.layers.0.linear_attn.conv1d.weight",
                                  "model.language_model.layers.3.self_attn.q_norm.weight"},
                                 1e-5},
                      // Mixture of experts: the experts fused ([E, 2I, d] / [E, d, I], as
                      // transformers holds them; it reads this layout for both families).
                      ExportCase{"tiny-qwen3-moe", "qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration",
                                 {"model.language_model.layers.1.mlp.experts.gate_up_proj",
                                  "model.language_model.layers.1.mlp.experts.down_proj",
                                  "model.language_model.layers.1.mlp.gate.weight",
                                  "model.language_model.layers.0.mlp.up_proj.weight"},
                                 1e-5},
                      ExportCase{"tiny-qwen3.5-moe", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration",
                                 {"model.language_model.layers.0.mlp.experts.gate_up_proj",
                                  "model.language_model.layers.0.mlp.shared_expert.down_proj.weight",
                                  "model.language_model.layers.0.mlp.shared_expert_gate.weight"},
                                 1e-5}),
    [](const ::testing::TestParamInfo<ExportCase>& info) { return info.param.model_type; });

TEST_P(ExportQwen3, TransformersLoadsTheExportToTheSameLogits) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();
  const ExportCase& c = GetParam();
  TempDir dir("export_qwen3");
  const std::string data = dir / "data";
  auto synth = vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--out", data, "--train", "16", "--val", "4",
                             "--seed", "4", "--vocab-size", "400"},
                            std::chrono::seconds(120));
  ASSERT_EQ(synth.exit_code, 0) << synth.output;
  auto argv = vlm::test::tiny_train_args(dir / "run", data, 2, 0);
  argv.insert(argv.end(), {"--set", "model.preset=" + c.preset});
  auto train = vlm::test::run(argv, std::chrono::seconds(300));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto ckpts = vlm::app::complete_checkpoints(dir / "run");
  ASSERT_FALSE(ckpts.empty()) << train.output;

  const std::string out = dir / "hf";
  auto ex = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", ckpts.back(), "--out", out, "--dtype", "fp32"});
  ASSERT_EQ(ex.exit_code, 0) << ex.output;
  // Names as the family's hub checkpoints write them.
  const auto ck = vlm::HfCheckpoint::open(out);
  for (const std::string& n : c.hub_names) {
    const std::string canonical = vlm::canonical_hf_name(n);
    ASSERT_TRUE(ck.contains(canonical)) << n;
    EXPECT_EQ(ck.stored_name(canonical), n);
  }

  // vlmtrain's logits: the model built from the exported config with the exported weights.
  const auto cfg = vlm::load_hf_config(out);
  EXPECT_EQ(vlm::family_name(cfg.family), c.model_type);
  vlm::VisionLanguageModel m(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 0, 0.02, /*init=*/false});
  vlm::load_module_weights(*m, out);
  m->eval();
  const vlm::Batch b = vlm::test::image_text_batch(cfg, 31, 10);
  torch::Tensor ours;
  {
    torch::NoGradGuard ng;
    ours = m->forward(b, /*return_logits=*/true).logits;
  }
  const std::string io = dir / "io.safetensors", ref = dir / "ref.safetensors";
  vlm::save_safetensors(io, {{"input_ids", b.input_ids}, {"attention_mask", b.attention_mask}, {"labels", b.labels},
                             {"pixel_values", b.pixel_values}, {"image_grid_thw", b.image_grid_thw}});
  auto py = vlm::test::run({vlm::test::python_tool("python"), vlm::test::source_dir() + "/scripts/hf_forward_reference.py",
                          "--model", out, "--io", io, "--out", ref},
                         std::chrono::seconds(300));
  ASSERT_EQ(py.exit_code, 0) << "transformers could not load vlmtrain's " << c.model_type << " export:\n" << py.output;
  const torch::Tensor theirs = vlm::SafetensorsFile::open(ref).get("logits").clone();
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  const double rel = (ours - theirs).abs().max().item<double>() / theirs.abs().max().item<double>();
  const auto loaded = vlm::test::last_json_line(py.output);
  EXPECT_EQ(loaded.at("class").get<std::string>(), c.hf_class);
  std::cout << "[export " << c.model_type << "] transformers(export) vs vlmtrain logits: " << rel << " ("
            << loaded.dump() << ")\n";
  EXPECT_LE(rel, c.tol);
}

// Shared by the trainer's end-to-end tests: a small synthetic OCR set, the tiny recipe's
// command line pointed at it, metrics.jsonl readers, and the check of an export.
#pragma once
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/testing.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/io/safetensors.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::test {

// Renders `train` + 4 synthetic OCR lines and a 400-piece sentencepiece model into `dir`.
inline void make_synth_data(const std::string& dir, int train, int seed) {
  auto r = run({vlmtrain_bin(), "synth-ocr", "--out", dir, "--train", std::to_string(train), "--val", "4", "--seed",
                std::to_string(seed), "--vocab-size", "400"},
               std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// `vlmtrain train recipes/ocr_tiny.toml` on the data in `data_dir`: 2 samples per rank,
// `steps` steps, log every step, no eval, a 60 s collective timeout.
inline std::vector<std::string> tiny_train_args(const std::string& run_dir, const std::string& data_dir, int steps,
                                                int checkpoint_every) {
  return {vlmtrain_bin(),
          "train",
          source_dir() + "/recipes/ocr_tiny.toml",
          "--set", "run.output_dir=" + run_dir,
          "--set", "model.tokenizer=" + data_dir + "/tokenizer.model",
          "--set", "data.train=" + data_dir + "/train.jsonl",
          "--set", "data.eval=[]",
          "--set", "data.synth.generate_if_missing=false",
          "--set", "data.num_workers=1",
          "--set", "batch.samples_per_rank=2",
          "--set", "schedule.steps=" + std::to_string(steps),
          "--set", "schedule.warmup_steps=1",
          "--set", "checkpoint.every=" + std::to_string(checkpoint_every),
          "--set", "eval.every=0",
          "--set", "eval.at_end=false",
          "--set", "log.every=1",
          "--set", "dist.timeout_s=60"};
}

// A run directory holding only `from`'s checkpoint of step `step` (step-<8 digits>) and its
// metrics.jsonl lines up to that step: what a resumed run starts from.
inline void copy_checkpoint_run(const std::string& from, const std::string& to, int64_t step) {
  namespace fs = std::filesystem;
  fs::create_directories(to);
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  fs::copy(fs::path(from) / name, fs::path(to) / name, fs::copy_options::recursive);
  std::ifstream in(fs::path(from) / "metrics.jsonl");
  std::ofstream out(fs::path(to) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (nlohmann::json::parse(line).at("step").get<int64_t>() <= step) out << line << "\n";
}

// The lines of <run_dir>/metrics.jsonl (or of a .jsonl file given by path), in order.
inline std::vector<nlohmann::json> metrics_lines(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  const bool file = run_dir.size() > 6 && run_dir.compare(run_dir.size() - 6, 6, ".jsonl") == 0;
  std::ifstream in(file ? run_dir : run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// step -> loss of the training lines (eval lines carry no loss; a resumed run appends to
// the same file: the later line wins).
inline std::map<int64_t, double> losses_by_step(const std::string& run_dir) {
  std::map<int64_t, double> out;
  for (const auto& j : metrics_lines(run_dir))
    if (j.contains("loss")) out[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  return out;
}

// Two rows: <vision_start>, 4 image pads (one 4x4-patch image each), <vision_end>, then
// `text` random ids in [16, 300) (above the synthetic tokenizer's special ids, so no stray
// vision_start changes HF's M-RoPE ids); labels on the text; random pixels from `seed`.
inline vlm::Batch image_text_batch(const vlm::VlmConfig& cfg, uint64_t seed, int64_t text) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t B = 2, L = 6 + text;
  vlm::Batch b;
  b.input_ids = torch::randint(16, 300, {B, L}, gen, torch::kInt64);
  for (int64_t i = 0; i < B; ++i) {
    b.input_ids[i][0] = cfg.vision_start_token_id;
    for (int64_t k = 1; k <= 4; ++k) b.input_ids[i][k] = cfg.image_token_id;
    b.input_ids[i][5] = cfg.vision_end_token_id;
  }
  b.attention_mask = torch::ones({B, L}, torch::kInt64);
  b.labels = b.input_ids.clone();
  b.labels.narrow(1, 0, 6).fill_(-100);
  b.image_grid_thw = torch::tensor({1, 4, 4, 1, 4, 4}, torch::kInt64).view({2, 3});
  b.pixel_values = torch::randn({32, cfg.vision.patch_dim()}, gen);
  return b;
}

// `vlmtrain export --checkpoint ckpt --out out --dtype fp32` of a sharded run's checkpoint,
// then every parameter of the exported model against `want` (another run's consolidated
// checkpoint tensors): the same names and shapes, each within `bound`. Prints and returns the
// worst |diff|.
inline double expect_export_matches(const std::string& ckpt, const std::string& out, const vlm::NamedTensors& want,
                                    double bound, const std::string& what) {
  auto r = run({vlmtrain_bin(), "export", "--checkpoint", ckpt, "--out", out, "--dtype", "fp32"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return -1;
  vlm::VisionLanguageModel model(vlm::load_hf_config(out));
  vlm::load_module_weights(*model, out);
  std::map<std::string, torch::Tensor> exported;
  for (const auto& p : model->named_parameters()) exported[p.key()] = p.value();
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, w] : want) {
    if (!exported.count(name)) {
      ADD_FAILURE() << what << ": " << name << " is not in the export";
      continue;
    }
    EXPECT_EQ(exported[name].sizes(), w.sizes()) << what << ": " << name;
    if (exported[name].sizes() != w.sizes()) continue;
    const double d = (exported[name] - w).abs().max().item<double>();
    EXPECT_LE(d, bound) << what << ": " << name;
    if (d > worst) worst = d, worst_name = name;
  }
  EXPECT_EQ(exported.size(), want.size()) << what;
  std::printf("%s: worst |diff| %.3g (%s)\n", what.c_str(), worst, worst_name.c_str());
  return worst;
}

}  // namespace vlm::test

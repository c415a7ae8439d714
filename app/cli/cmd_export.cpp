// `vlmtrain export`: a training checkpoint -> a consolidated HF model directory.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "app/train/checkpoint.h"
#include "app/cli/commands.h"
#include "app/config/lora_model.h"
#include "vlm/runtime/check.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/lora.h"
#include "vlm/families/registry.h"
#include "vlm/io/peft_adapter.h"

namespace fs = std::filesystem;

namespace vlm::app {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in.good(), "export: cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Tokenizer files to copy: a directory's known files, or the single file given.
std::vector<std::pair<std::string, std::string>> tokenizer_files(const std::string& path) {
  VLM_CHECK(fs::exists(path), "export: tokenizer ", path,
            " does not exist (hint: pass --tokenizer PATH when the run's tokenizer moved)");
  std::vector<std::pair<std::string, std::string>> out;
  if (fs::is_directory(path)) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                             "special_tokens_map.json", "added_tokens.json", "chat_template.json",
                             "preprocessor_config.json", "generation_config.json", "tokenizer.model"}) {
      const fs::path f = fs::path(path) / name;
      if (fs::exists(f)) out.emplace_back(name, slurp(f.string()));
    }
    VLM_CHECK(!out.empty(), "export: ", path, " holds no tokenizer file (tokenizer.json / tokenizer.model)");
  } else {
    out.emplace_back(fs::path(path).filename().string(), slurp(path));
  }
  return out;
}

// A LoRA checkpoint as a PEFT adapter directory (no base weights read).
// Units trained in full beside the adapters (the merger, ...) go in as PEFT's modules_to_save.
int export_peft_adapter(const CheckpointReader& ck, const std::string& out, bool overwrite) {
  const std::vector<std::string> full = full_trained_units(ck);
  VLM_CHECK(overwrite || !fs::exists(out), "vlmtrain export: ", out, " exists (hint: --overwrite replaces it)");
  const Recipe trained = checkpoint_recipe(ck);
  const std::string base = !trained.model.path.empty() ? trained.model.path : "preset:" + trained.model.preset;
  vlm::VisionLanguageModel model = lora_adapters_on_meta(ck);
  vlm::write_peft_adapter(*model, out, base, full);
  std::string saved;
  for (const auto& u : full) saved += (saved.empty() ? "" : ", ") + u;
  std::printf("export: %s (step %lld, LoRA) -> %s: PEFT adapter, %zu adapted modules%s, base %s\n", ck.dir().c_str(),
              static_cast<long long>(ck.state().step), out.c_str(), vlm::lora_modules(*model).size(),
              saved.empty() ? "" : (", modules_to_save " + saved).c_str(), base.c_str());
  return 0;
}

// The base model the LoRA run trained on, with the checkpoint's adapters merged into it.
vlm::NamedTensors merged_lora_tensors(const CheckpointReader& ck, const std::optional<std::string>& base_dir) {
  const Recipe trained = checkpoint_recipe(ck);
  ModelSection base = trained.model;
  if (base_dir) {
    base.preset.clear();
    base.path = *base_dir;
  }
  base.tokenizer = ck.tokenizer_path();  // the one the run trained with (absolute)
  LoadModelOptions opts;
  opts.seed = static_cast<uint64_t>(trained.run.seed);
  LoadedModel lm = load_lora_checkpoint(ck, base, opts, ck.dir() + "/recipe.toml");
  const int64_t merged = vlm::merge_all_lora(*lm.model);
  std::printf("export: merged %lld LoRA adapters into %s\n", static_cast<long long>(merged), lm.description.c_str());
  vlm::NamedTensors out;
  for (const auto& p : lm.model->named_parameters()) out.emplace_back(p.key(), p.value().detach());
  return out;
}

struct ExportArgs {
  std::optional<std::string> checkpoint;  // --checkpoint DIR (required)
  std::optional<std::string> out;         // --out HF_DIR (required)
  std::string dtype = "bf16";             // --dtype bf16|fp32
  std::optional<std::string> tokenizer;   // --tokenizer PATH
  std::optional<double> max_shard_gb;     // --max-shard-gb G
  bool overwrite = false;
  bool merge = false;
  std::optional<std::string> base;        // --base HF_DIR (with --merge)
};

int export_checkpoint(const ExportArgs& a) {
  const auto& ckpt = a.checkpoint;
  const auto& out = a.out;
  const std::string& dtype = a.dtype;
  const auto& tok_override = a.tokenizer;
  const auto& shard_gb = a.max_shard_gb;
  const bool overwrite = a.overwrite;
  const bool merge = a.merge;
  const auto& base_dir = a.base;
  VLM_CHECK(ckpt.has_value(), "vlmtrain export: --checkpoint DIR is required");
  VLM_CHECK(out.has_value(), "vlmtrain export: --out HF_DIR is required");
  VLM_CHECK(dtype == "bf16" || dtype == "fp32", "vlmtrain export: --dtype must be bf16 or fp32, got '", dtype, "'");

  std::string dir = *ckpt;
  if (!fs::exists(fs::path(dir) / "trainer.json")) {  // a run directory: its newest checkpoint
    auto all = complete_checkpoints(dir);
    VLM_CHECK(!all.empty(), "vlmtrain export: ", dir, " is neither a checkpoint nor a run directory with a "
              "complete checkpoint (expected step-<N>/ with trainer.json and COMPLETE)");
    dir = all.back();
  }
  CheckpointReader ck(dir);
  VLM_CHECK(!base_dir || merge, "vlmtrain export: --base applies with --merge only");
  if (is_lora_checkpoint(ck) && !merge) return export_peft_adapter(ck, *out, overwrite);
  VLM_CHECK(!merge || is_lora_checkpoint(ck), "vlmtrain export: --merge: ", dir,
            " is not a LoRA checkpoint (it holds every weight already; export it without --merge)");
  vlm::NamedTensors tensors = merge ? merged_lora_tensors(ck, base_dir) : ck.consolidated();

  nlohmann::json config = nlohmann::json::parse(ck.config_json());
  config["torch_dtype"] = dtype == "bf16" ? "bfloat16" : "float32";
  if (config.contains("dtype")) config["dtype"] = config["torch_dtype"];
  vlm::SaveHfOptions so;
  // Tensor names as the family's hub checkpoints write them (Qwen3-VL: model.visual.*,
  // model.language_model.*).
  const vlm::VlmConfig model_cfg = vlm::parse_hf_config(ck.config_json(), dir + "/config.json");
  so.style = vlm::family_spec(model_cfg.family).nested_names ? vlm::HfNameStyle::kNested : vlm::HfNameStyle::kLegacy;
  so.dtype = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  so.overwrite = overwrite;
  if (shard_gb) {
    VLM_CHECK(*shard_gb > 0, "vlmtrain export: --max-shard-gb must be > 0, got ", *shard_gb);
    so.max_shard_bytes = static_cast<uint64_t>(*shard_gb * 1e9);
  }
  so.extra_files = tokenizer_files(tok_override.value_or(ck.tokenizer_path()));
  so.extra_files.emplace_back("config.json", config.dump(2) + "\n");
  vlm::SaveHfReport rep = vlm::save_hf_checkpoint(*out, tensors, so);
  std::printf("export: %s (step %lld, %lld rank file(s)) -> %s: %lld tensors, %.1f MB %s in %zu file(s)\n",
              dir.c_str(), static_cast<long long>(ck.state().step), static_cast<long long>(ck.world_size()),
              out->c_str(), static_cast<long long>(rep.tensors_written), rep.total_size / 1e6, dtype.c_str(),
              rep.files.size());
  return 0;
}

}  // namespace

CommandRun declare_export(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  app.description(R"(usage: vlmtrain export --checkpoint DIR --out HF_DIR [--dtype bf16|fp32]
                       [--tokenizer PATH] [--overwrite] [--merge [--base HF_DIR]]

Writes a consolidated HF directory from a training checkpoint (step-<N>/ with its
COMPLETE marker), whatever the world size that wrote it:
  config.json, model.safetensors (or sharded model-0000K-of-0000N.safetensors +
  model.safetensors.index.json), and the tokenizer files.
HF transformers and `vlmtrain eval --model HF_DIR` load it unchanged.

A LoRA checkpoint (policy = "lora") holds the adapters, not the base. By default it is
written as a PEFT adapter directory (adapter_config.json, adapter_model.safetensors with
PEFT's tensor names) that peft.PeftModel.from_pretrained loads on the HF base model, and
`vlmtrain eval RECIPE --adapter DIR` on vlmtrain's; units the run trained in full beside
the adapters (e.g. visual.merger) are written whole as PEFT's modules_to_save. With
--merge: the base the run trained on (its recipe's [model], or --base) with the adapters
folded in (W += alpha/r B A) and the trained units, as a full HF directory.
)");
  add_value(app, "--checkpoint", a->checkpoint, "DIR",
            "a step-<N> checkpoint directory (or a run directory: its newest\n"
            "complete checkpoint)");
  add_value(app, "--out", a->out, "HF_DIR", "output directory (written atomically)");
  add_value(app, "--dtype", a->dtype, "D", "bf16 (default, like hub checkpoints) or fp32 (the exact masters)");
  add_value(app, "--tokenizer", a->tokenizer, "PATH", "tokenizer to copy (default: the one the run trained with)");
  add_value(app, "--max-shard-gb", a->max_shard_gb, "G", "shard size limit (default 5)");
  add_flag(app, "--overwrite", a->overwrite, "replace an existing HF_DIR");
  add_flag(app, "--merge", a->merge, "LoRA checkpoint: write the merged full model instead of an adapter");
  add_value(app, "--base", a->base, "HF_DIR",
            "with --merge: the base model directory (default: the run's model.path;\n"
            "a preset base is rebuilt from the run's seed)");
  return [a] { return export_checkpoint(*a); };
}

}  // namespace vlm::app

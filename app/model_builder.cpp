// The recipe's tokenizer, config and model (see model_builder.h).
#include "app/model_builder.h"

#include <filesystem>

#include "vlm/check.h"
#include "vlm/hf_checkpoint.h"
#include "vlm/meta_init.h"

namespace fs = std::filesystem;

namespace vlmtrain {

std::string recipe_tokenizer_path(const Recipe& recipe) {
  const std::string& p = !recipe.model.tokenizer.empty() ? recipe.model.tokenizer : recipe.model.path;
  VLM_CHECK(!p.empty(), recipe.location("model.tokenizer"),
            ": no tokenizer (expected model.tokenizer = a tokenizer.json / .model / directory, or "
            "model.path = an HF model directory that holds one)");
  return p;
}

std::unique_ptr<vlm::Tokenizer> recipe_tokenizer(const Recipe& recipe) {
  return vlm::load_tokenizer(recipe_tokenizer_path(recipe));
}

void apply_tokenizer_ids(vlm::VlmConfig& cfg, const vlm::Tokenizer& tok, bool keep_ids,
                         const std::string& source) {
  const std::string tok_desc = vlm::str("the tokenizer (", tok.kind(), ", vocab ", tok.vocab_size(), ")");
  VLM_CHECK(tok.vocab_size() <= cfg.text.vocab_size, source, ": vocab_size ", cfg.text.vocab_size,
            " is smaller than ", tok_desc, " (hint: a tokenizer and a model that do not belong together)");
  struct Slot {
    const char* token;
    int64_t* id;
    bool required;
  };
  const Slot slots[] = {{"<|image_pad|>", &cfg.image_token_id, true},
                        {"<|vision_start|>", &cfg.vision_start_token_id, true},
                        {"<|vision_end|>", &cfg.vision_end_token_id, true},
                        {"<|im_end|>", &cfg.eos_token_id, true},
                        {"<|video_pad|>", &cfg.video_token_id, false},
                        {"<|endoftext|>", &cfg.bos_token_id, false}};
  for (const Slot& s : slots) {
    std::optional<int64_t> id = tok.token_to_id(s.token);
    if (!id) {
      VLM_CHECK(!s.required, tok_desc, " has no ", s.token,
                " token (hint: Qwen2-VL needs the ChatML and vision special tokens; train the "
                "sentencepiece model with them, as `vlmtrain synth-ocr` does)");
      continue;
    }
    if (keep_ids) {
      VLM_CHECK(*s.id == *id, source, ": ", s.token, " is id ", *s.id, " in the config but ", *id, " in ",
                tok_desc, " (hint: use the tokenizer that came with the model)");
    } else {
      *s.id = *id;
    }
  }
}

vlm::VlmConfig recipe_model_config(const Recipe& recipe, const vlm::Tokenizer& tok) {
  if (!recipe.model.preset.empty()) {
    vlm::VlmConfig cfg = vlm::preset(recipe.model.preset);
    apply_tokenizer_ids(cfg, tok, false, "preset " + recipe.model.preset);
    return cfg;
  }
  const std::string& dir = recipe.model.path;
  VLM_CHECK(fs::exists(fs::path(dir) / "config.json"), recipe.location("model.path"), ": ", dir,
            " has no config.json (expected an HF model directory: config.json + *.safetensors)");
  vlm::VlmConfig cfg = vlm::load_hf_config(dir);
  apply_tokenizer_ids(cfg, tok, true, (fs::path(dir) / "config.json").string());
  return cfg;
}

vlm::Qwen2VL build_model(const Recipe& recipe, const vlm::VlmConfig& cfg, torch::Device device,
                         torch::Dtype dtype, std::string* source) {
  vlm::Qwen2VL model(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::MaterializeOptions mo;
  mo.device = device;
  mo.dtype = dtype;
  mo.seed = static_cast<uint64_t>(recipe.run.seed);
  mo.init = recipe.model.path.empty();
  vlm::materialize(*model, mo);
  if (!recipe.model.path.empty()) {
    vlm::LoadReport rep = vlm::load_module_weights(*model, recipe.model.path);
    if (source)
      *source = vlm::str("weights from ", recipe.model.path, " (", rep.loaded, " tensors, ",
                         rep.bytes_read / 1e6, " MB)");
  } else if (source) {
    *source = vlm::str("preset ", recipe.model.preset, ", random init (seed ", recipe.run.seed, ")");
  }
  return model;
}

}  // namespace vlmtrain

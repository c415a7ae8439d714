#include "app/config/model_source.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>

#include "sharding/parallel/tensor_parallel.h"
#include "vlm/runtime/check.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/meta_init.h"

namespace vlm::app {

std::string tokenizer_path(const ModelSection& model, const std::string& recipe_source) {
  if (!model.tokenizer.empty()) return model.tokenizer;
  VLM_CHECK(!model.path.empty(), recipe_source.empty() ? "recipe" : recipe_source,
            ": key 'model.tokenizer': no tokenizer (expected model.tokenizer, a tokenizer.json, "
            ".model file or folder, or model.path; hint: --set model.tokenizer=PATH)");
  return model.path;
}

void use_tokenizer_special_ids(vlm::VlmConfig& cfg, const vlm::Tokenizer& tok) {
  VLM_CHECK(tok.vocab_size() <= cfg.text.vocab_size, "tokenizer ", tok.source(), " has ",
            tok.vocab_size(), " ids but the model's vocabulary holds ", cfg.text.vocab_size,
            " (hint: a preset needs a tokenizer of at most that many pieces, e.g. "
            "`vlmtrain synth-ocr --vocab-size ", cfg.text.vocab_size, "`)");
  const char* why = "the model's special token ids";
  cfg.image_token_id = tok.special_id("<|image_pad|>", why);
  cfg.vision_start_token_id = tok.special_id("<|vision_start|>", why);
  cfg.vision_end_token_id = tok.special_id("<|vision_end|>", why);
  cfg.eos_token_id = tok.special_id("<|im_end|>", why);
  if (auto id = tok.token_to_id("<|endoftext|>")) cfg.bos_token_id = *id;
  cfg.video_token_id = tok.token_to_id("<|video_pad|>").value_or(cfg.image_token_id);
}

void check_tokenizer_special_ids(const vlm::VlmConfig& cfg, const vlm::Tokenizer& tok,
                                 const std::string& source) {
  const std::pair<const char*, int64_t> ids[] = {{"<|image_pad|>", cfg.image_token_id},
                                                 {"<|vision_start|>", cfg.vision_start_token_id},
                                                 {"<|vision_end|>", cfg.vision_end_token_id}};
  for (const auto& [name, id] : ids) {
    const int64_t want = tok.special_id(name, "the model's special token ids");
    VLM_CHECK(want == id, source, ": the config's id of ", name, " is ", id, " but tokenizer ",
              tok.source(), " has it at ", want,
              " (hint: the tokenizer does not belong to this model; set model.tokenizer)");
  }
}

namespace {

// Tensor parallelism: the whole model becomes `whole` (the source reads through it) and the
// model is rebuilt on meta for tp ranks, its source cut to rank tp_rank's slices.
void to_tensor_parallel(LoadedModel& out, const LoadModelOptions& opts) {
  if (opts.tp <= 1) return;
  VLM_CHECK(opts.deferred && out.source, "tensor parallelism (dist.tp = ", opts.tp,
            ") loads each rank's slices of the weights: it needs model.sharded_load = true");
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : out.model->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  vlm::VlmConfig cfg = out.model->cfg;
  out.source = vlm::sharding::tensor_parallel_source(std::move(out.source), cfg, std::move(shapes), opts.tp_rank,
                                                     opts.tp);
  out.whole = out.model;
  cfg.text.tensor_parallel = opts.tp;
  out.model = vlm::VisionLanguageModel(cfg, torch::TensorOptions().device(torch::kMeta).dtype(opts.dtype));
  out.description += vlm::str(", tensor-parallel slice ", opts.tp_rank, " of ", opts.tp);
}

}  // namespace

LoadedModel load_model(const ModelSection& model, const LoadModelOptions& opts,
                       const std::string& recipe_source) {
  VLM_CHECK(model.preset.empty() != model.path.empty(),
            recipe_source.empty() ? "recipe" : recipe_source,
            ": key 'model': expected exactly one of model.preset and model.path, got ",
            model.preset.empty() ? "neither" : "both");
  LoadedModel out;
  out.tokenizer = vlm::load_tokenizer(tokenizer_path(model, recipe_source));
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(opts.dtype);
  if (!model.preset.empty()) {
    vlm::VlmConfig cfg = vlm::preset(model.preset);
    use_tokenizer_special_ids(cfg, *out.tokenizer);
    out.model = vlm::VisionLanguageModel(cfg, meta);
    const vlm::MaterializeOptions mo{opts.device, opts.dtype, opts.seed};
    if (opts.deferred) out.source = vlm::init_param_source(*out.model, mo);
    else vlm::materialize(*out.model, mo);
    out.random_init = true;
    out.description = vlm::str("preset ", model.preset, " (random init, seed ", opts.seed, ")");
    to_tensor_parallel(out, opts);
    return out;
  }
  namespace fs = std::filesystem;
  VLM_CHECK(fs::is_directory(model.path) && fs::exists(fs::path(model.path) / "config.json"),
            "model.path '", model.path,
            "': expected an HF model directory with config.json and safetensors "
            "(hint: `vlmtrain export` writes one; a preset needs model.preset)");
  vlm::VlmConfig cfg = vlm::load_hf_config(model.path);
  check_tokenizer_special_ids(cfg, *out.tokenizer, model.path + "/config.json");
  const vlm::HfCheckpoint ckpt = vlm::HfCheckpoint::open(model.path);
  const vlm::TiedHead tied = vlm::resolve_tied_head(cfg, ckpt);  // may untie cfg, as HF
  if (!tied.note.empty()) spdlog::info("{}", tied.note);
  out.model = vlm::VisionLanguageModel(cfg, meta);
  if (opts.deferred) {
    out.source = vlm::checkpoint_param_source(*out.model, ckpt, tied.load);  // checks names and shapes now
  } else {
    vlm::MaterializeOptions mo{opts.device, opts.dtype, opts.seed};
    mo.init = false;
    vlm::materialize(*out.model, mo);
    vlm::load_module_weights(*out.model, ckpt, tied.load);
  }
  out.description = vlm::str("HF ", model.path, " (", ckpt.files().size(), " safetensors file",
                             ckpt.files().size() == 1 ? "" : "s", ")");
  to_tensor_parallel(out, opts);
  return out;
}

}  // namespace vlm::app

// Tokenizer interface helpers and the load_tokenizer() factory.
#include "vlm/text/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "vlm/text/bpe_tokenizer.h"
#include "vlm/runtime/check.h"
#include "vlm/text/sp_tokenizer.h"
#include "vlm/text/tiktoken.h"

namespace vlm {
namespace fs = std::filesystem;

std::vector<int64_t> Tokenizer::encode(std::string_view text) const {
  return encode_with_offsets(text).ids;
}

int64_t Tokenizer::special_id(std::string_view name, std::string_view needed_for) const {
  auto id = token_to_id(name);
  VLM_CHECK(id.has_value(), "tokenizer ", source_, " has no token \"", name, "\"",
            needed_for.empty() ? "" : " (needed for ", needed_for, needed_for.empty() ? "" : ")",
            "; hint: use the tokenizer shipped with the model, or train the sentencepiece model "
            "with the chat specials as user_defined_symbols (vlm::sp_trainer_flags())");
  return *id;
}

void Tokenizer::apply_config_file(const std::string& path) {
  std::ifstream in(path);
  VLM_CHECK(in, "cannot open ", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(path, ": not valid JSON: ", e.what()));
  }
  auto role = [&](const char* key, std::optional<int64_t>& slot) {
    if (!j.contains(key) || j[key].is_null()) return;
    const auto& v = j[key];
    std::string name = v.is_string() ? v.get<std::string>()
                       : v.is_object() ? v.value("content", std::string()) : std::string();
    VLM_CHECK(!name.empty(), path, ": ", key, " must be a token string or {\"content\": ...}, got ",
              v.dump());
    auto id = token_to_id(name);
    VLM_CHECK(id.has_value(), path, ": ", key, " is \"", name, "\", which tokenizer ", source_,
              " does not contain (hint: the config and the tokenizer files come from different "
              "models?)");
    slot = id;
  };
  role("pad_token", specials_.pad);
  role("eos_token", specials_.eos);
  role("bos_token", specials_.bos);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  VLM_CHECK(fs::exists(path, ec), "tokenizer path ", path, " does not exist (hint: pass a ",
            "tokenizer.json, a sentencepiece .model, or a model directory holding one)");
  fs::path file = path;
  if (fs::is_directory(file, ec)) {
    fs::path found;
    if (fs::exists(file / "tokenizer.json")) {
      found = file / "tokenizer.json";
    } else if (fs::exists(file / "tokenizer.model")) {
      found = file / "tokenizer.model";
    } else {
      std::vector<fs::path> models;
      for (const auto& e : fs::directory_iterator(file))
        if (e.path().extension() == ".model") models.push_back(e.path());
      VLM_CHECK(models.size() == 1, "directory ", path, " holds ",
                models.empty() ? "no tokenizer" : "several .model files",
                " (expected tokenizer.json, tokenizer.model, or exactly one *.model)");
      found = models[0];
    }
    file = found;
  }
  std::unique_ptr<Tokenizer> tok;
  std::string ext = file.extension().string();
  if (ext == ".json") {
    tok = BpeTokenizer::load(file.string());
  } else if (ext == ".model") {
    tok = SentencePieceTokenizer::load(file.string());
  } else if (ext == ".tiktoken") {
    tok = BpeTokenizer::from_tiktoken(file.string(), qwen35_tiktoken_spec());
  } else {
    throw Error(str("cannot tell the tokenizer type of ", file.string(),
                    ": expected a .json (HF tokenizer.json), .model (sentencepiece) or .tiktoken ",
                    "(Qwen3.5's ranks) file"));
  }
  fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config)) tok->apply_config_file(config.string());
  return tok;
}

const std::vector<std::string>& chat_special_tokens() {
  static const std::vector<std::string> tokens = {
      "<|endoftext|>", "<|im_start|>", "<|im_end|>",  "<|vision_start|>",
      "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"};
  return tokens;
}

}  // namespace vlm

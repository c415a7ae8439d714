// `vlmtrain tokenize`: encode or decode text with a tokenizer (debugging / conformance).
#include <cstdio>
#include <sstream>

#include "app/cli/commands.h"
#include "vlm/runtime/check.h"
#include "vlm/text/tokenizer.h"

namespace vlm::app {

namespace {

struct TokenizeArgs {
  std::optional<std::string> tokenizer;  // --tokenizer PATH (required)
  std::vector<std::string> inputs;       // TEXT... (or IDS... with --decode)
  bool decode = false, tokens = false, ids = false, skip_special = false;
};

int tokenize(const TokenizeArgs& a) {
  const auto& path = a.tokenizer;
  const bool decode = a.decode, tokens = a.tokens, ids = a.ids, skip_special = a.skip_special;
  VLM_CHECK(path.has_value(), "vlmtrain tokenize: --tokenizer PATH is required");
  VLM_CHECK(!(decode && (tokens || ids)), "vlmtrain tokenize: --decode cannot be combined with ",
            "--ids/--tokens");
  VLM_CHECK(!(tokens && ids), "vlmtrain tokenize: choose one of --ids and --tokens");
  VLM_CHECK(!skip_special || decode, "vlmtrain tokenize: --skip-special applies to --decode only");
  const auto& inputs = a.inputs;
  VLM_CHECK(!inputs.empty(), "vlmtrain tokenize: nothing to ", decode ? "decode" : "encode",
            " (see `vlmtrain tokenize --help`)");
  auto tok = vlm::load_tokenizer(*path);

  std::string out;
  for (const auto& input : inputs) {
    if (decode) {
      std::vector<int64_t> seq;
      std::string s = input;
      for (char& c : s)
        if (c == ',') c = ' ';
      std::istringstream ss(s);
      std::string word;
      while (ss >> word) {
        char* end = nullptr;
        long long v = std::strtoll(word.c_str(), &end, 10);
        VLM_CHECK(end != word.c_str() && *end == '\0', "vlmtrain tokenize --decode: '", word,
                  "' is not an integer id");
        seq.push_back(v);
      }
      out += tok->decode(seq, skip_special);
    } else {
      std::vector<int64_t> seq = tok->encode(input);
      for (size_t i = 0; i < seq.size(); ++i) {
        if (i) out += ' ';
        out += tokens ? tok->id_to_token(seq[i]) : std::to_string(seq[i]);
      }
    }
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

CommandRun declare_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  app.description(R"(usage: vlmtrain tokenize --tokenizer PATH [--ids|--tokens] TEXT...
       vlmtrain tokenize --tokenizer PATH --decode [--skip-special] IDS...

PATH is a tokenizer.json, a sentencepiece .model, or a model directory holding one
(tokenizer_config.json beside it is applied).
Encoding prints one line per TEXT: its ids (default, --ids) or its token strings
(--tokens), separated by spaces. Special tokens written in TEXT (<|im_end|>) are
recognised; no BOS/EOS is added.
--decode reverses --ids: each IDS argument is one line of ids separated by spaces or
commas, printed back as text (one line per argument).
)");
  add_value(app, "TEXT", a->inputs, "", "texts to encode (or, with --decode, lines of ids)");
  add_value(app, "--tokenizer", a->tokenizer, "PATH", "tokenizer.json, sentencepiece .model, or a model directory");
  add_flag(app, "--ids", a->ids, "print token ids (the default)");
  add_flag(app, "--tokens", a->tokens, "print token strings");
  add_flag(app, "--decode", a->decode, "decode lines of ids back to text");
  add_flag(app, "--skip-special", a->skip_special, "with --decode: leave special tokens out");
  app.footer(R"(Use `--` before the texts when a text starts with '-', so that it is never taken as
an option: vlmtrain tokenize --ids --tokenizer tok.json -- "-Hello world")");
  return [a] { return tokenize(*a); };
}

}  // namespace vlm::app

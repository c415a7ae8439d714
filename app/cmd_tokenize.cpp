// `vlmtrain tokenize`: encode or decode text with a tokenizer (debugging / conformance).
#include <cstdio>
#include <sstream>

#include "app/commands.h"
#include "vlm/check.h"
#include "vlm/tokenizer.h"

namespace vlmtrain {

const char* help_tokenize() {
  return R"(usage: vlmtrain tokenize --tokenizer PATH [--ids|--tokens] TEXT...
       vlmtrain tokenize --tokenizer PATH --decode [--skip-special] IDS...

PATH is a tokenizer.json, a sentencepiece .model, or a model directory holding one
(tokenizer_config.json beside it is applied).
Encoding prints one line per TEXT: its ids (default, --ids) or its token strings
(--tokens), separated by spaces. Special tokens written in TEXT (<|im_end|>) are
recognised; no BOS/EOS is added.
--decode reverses --ids: each IDS argument is one line of ids separated by spaces or
commas, printed back as text (one line per argument).
Put flags before --tokenizer or use `--` before the texts so that a text is never
taken as a flag's value: vlmtrain tokenize --ids --tokenizer tok.json -- "Hello world"
)";
}

int cmd_tokenize(Args& args) {
  auto path = args.value("tokenizer");
  const bool decode = args.flag("decode");
  const bool tokens = args.flag("tokens");
  const bool ids = args.flag("ids");
  const bool skip_special = args.flag("skip-special");
  args.finish();
  VLM_CHECK(path.has_value(), "vlmtrain tokenize: --tokenizer PATH is required");
  VLM_CHECK(!(decode && (tokens || ids)), "vlmtrain tokenize: --decode cannot be combined with ",
            "--ids/--tokens");
  VLM_CHECK(!(tokens && ids), "vlmtrain tokenize: choose one of --ids and --tokens");
  VLM_CHECK(!skip_special || decode, "vlmtrain tokenize: --skip-special applies to --decode only");
  const auto& inputs = args.positionals();
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

}  // namespace vlmtrain

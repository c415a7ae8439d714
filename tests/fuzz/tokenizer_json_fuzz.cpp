// Fuzz target: a tokenizer.json through vlm::BpeTokenizer (the backend load_tokenizer picks
// for it), then encoding arbitrary bytes with it. Input: byte 0 = length n of the text to
// encode, bytes 1..n = that text, the rest = the tokenizer.json (vlm::fuzz::split2).
// Encoded ids must decode, and every id must be a valid vocabulary index.
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "vlm/text/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = vlm::fuzz::split2(data, size);
  const std::string_view text = parts.first, json = parts.second;
  std::unique_ptr<vlm::BpeTokenizer> tok;
  try {
    tok = vlm::BpeTokenizer::from_json_text(json, "<fuzz>/tokenizer.json");
  } catch (const vlm::Error&) {
    return 0;
  }
  vlm::fuzz::expect_only_vlm_errors([&] {
    vlm::Encoding enc = tok->encode_with_offsets(text);  // throws vlm::Error on invalid UTF-8
    if (enc.ids.size() != enc.offsets.size()) __builtin_trap();
    for (size_t i = 0; i < enc.ids.size(); ++i) {
      if (enc.ids[i] < 0 || enc.ids[i] >= tok->vocab_size()) __builtin_trap();
      if (enc.offsets[i].first > enc.offsets[i].second || enc.offsets[i].second > text.size())
        __builtin_trap();
      (void)tok->id_to_token(enc.ids[i]);
    }
    (void)tok->decode(enc.ids, /*skip_special=*/false);
    (void)tok->decode(enc.ids, /*skip_special=*/true);
    (void)tok->pre_tokenize(text);
  });
  vlm::fuzz::expect_only_vlm_errors([&] { (void)tok->token_to_id(text); });
  return 0;
}

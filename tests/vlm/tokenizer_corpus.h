// Deterministic multilingual test corpus for tokenizer conformance (and the bench).
// Categories: English with contractions, Korean, Chinese, Japanese, Arabic, emoji and ZWJ
// sequences, digit runs, whitespace runs (spaces, tabs, \r\n, trailing), punctuation
// runs, URLs, code, special tokens mid-text, NFC/NFD pairs, and random mixtures.
// U+0085 and U+FEFF are left out on purpose: HF (Oniguruma) and the JS reference
// disagree on whether they are `\s` (see vlm/bpe_tokenizer.cpp).
#pragma once
#include <random>
#include <string>
#include <vector>

namespace vlmtest {

inline std::vector<std::string> tokenizer_corpus(size_t n_random = 1800, uint32_t seed = 1234) {
  const std::vector<std::string> english = {
      "Hello world", "The quick brown fox jumps over the lazy dog.", "it's", "they're", "We'LL see",
      "I'M here", "you'VE", "she'd", "don't", "CAN'T", "o'clock", "rock'n'roll", "'s", "'re",
      "Mr. O'Neil's book", "isn't it?", "HELLO", "hello", "HeLLo WoRLD", "naïve café", "résumé",
      "supercalifragilisticexpialidocious", "a", "I", "tokenization", "Don't STOP 'TIL",
      "x'S y'T z'RE w'Ve v'M u'Ll t'D"};
  const std::vector<std::string> korean = {"안녕하세요", "한국어 텍스트 인식", "서울특별시 강남구",
                                           "감사합니다!", "대한민국 만세", "ㄱㄴㄷ ㅏㅑㅓ"};
  const std::vector<std::string> chinese = {"你好，世界", "光学字符识别", "北京欢迎你。",
                                            "人工智能与机器学习", "中华人民共和国", "繁體中文測試"};
  const std::vector<std::string> japanese = {"こんにちは世界", "カタカナとひらがな", "東京タワー",
                                             "ｶﾀｶﾅ半角", "日本語の文章です。", "ー〜・"};
  const std::vector<std::string> arabic = {"مرحبا بالعالم", "اللغة العربية", "٠١٢٣٤٥٦٧٨٩",
                                           "السلام عليكم", "قِرَاءَة"};
  const std::vector<std::string> other = {"Привет мир", "Ελληνικά", "שלום עולם", "नमस्ते दुनिया",
                                          "สวัสดีครับ", "Tiếng Việt có dấu", "Zürich Straße"};
  const std::vector<std::string> emoji = {
      "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇰🇷🇯🇵", "❤️", "🧑‍💻 coding", "👩🏾‍🔬", "🤖🤖🤖",
      "✨done✨", "1️⃣", "😀😃😄😁"};
  const std::vector<std::string> punct = {
      "...", "!!!", "?!", "---", "***", "((()))", "[]{}<>", "\"quoted\"", "«guillemets»",
      "—–-", "、。！？", "@#$%^&*", "~`|\\", ";;", "::", "''", "'", "<<>>", "</div>", "=>", "!="};
  const std::vector<std::string> urls = {
      "https://example.com/path?q=1&r=two#frag", "http://localhost:8080/", "www.qwen.ai",
      "mailto:someone@example.org", "ftp://files.example.net/a/b/c.tar.gz",
      "https://ko.wikipedia.org/wiki/한국어"};
  const std::vector<std::string> code = {
      "int main() {\n    return 0;\n}\n", "def f(x):\n\treturn x ** 2\n",
      "for (size_t i = 0; i < n; ++i) sum += a[i];", "if x != None and y >= 3:",
      "const auto& [k, v] = *it;", "#include <vector>", "SELECT * FROM t WHERE id = 42;",
      "  \"key\": [1, 2, 3],\r\n", "λx.x", "a_b_c = 0x1F; b = 1e-9"};
  const std::vector<std::string> specials = {
      "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|image_pad|>",
      "<|vision_end|>", "<think>", "</think>", "<tool_call>", "<|im_", "<|im_end", "|>", "<|",
      "<|image_pad|><|image_pad|>"};
  const std::vector<std::string> spaces = {
      " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", "  \n  ",
      "\u00a0", "\u3000", " \t \n", "\u2003", "\r", "\v", "\f"};
  const std::vector<std::pair<std::string, std::string>> nfc_pairs = {
      {"\u00e9", "e\u0301"}, {"\u00c5", "A\u030a"}, {"\u00f1", "n\u0303"},
      {"\ud55c\uad6d\uc5b4", "\u1112\u1161\u11ab\u1100\u116e\u11a8\u110b\u1165"},
      {"\u1ec7", "e\u0323\u0302"}, {"\u00fc", "u\u0308"}, {"\u01fa", "A\u030a\u0301"},
      {"\u304c", "\u304b\u3099"}};

  std::vector<std::string> out;
  // Every fragment alone, with a leading space, and followed by trailing whitespace.
  for (const auto* group : {&english, &korean, &chinese, &japanese, &arabic, &other, &emoji,
                            &punct, &urls, &code, &specials, &spaces}) {
    for (const auto& s : *group) {
      out.push_back(s);
      out.push_back(" " + s);
      out.push_back(s + "  ");
      out.push_back(s + "\r\n");
    }
  }
  for (const auto& [c, d] : nfc_pairs) {
    out.push_back(c);
    out.push_back(d);
    out.push_back("caf" + d + " and " + c);
    out.push_back(d + d + " " + d);
  }
  std::mt19937 rng(seed);
  auto pick = [&](const std::vector<std::string>& v) -> const std::string& {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  // Digit runs and whitespace runs of many lengths.
  for (int len = 1; len <= 40; ++len) {
    std::string digits;
    for (int i = 0; i < len; ++i) digits += static_cast<char>('0' + uni(0, 9));
    out.push_back(digits);
    out.push_back("v" + digits + "x " + digits.substr(0, len / 2) + "," + digits);
    out.push_back("a" + std::string(len, ' ') + "b");
    out.push_back(std::string(len, ' '));
    out.push_back("x" + std::string(len, '\t') + "\n");
    out.push_back("end" + std::string(len % 7 + 1, ' '));
    std::string mixed_ws;
    for (int i = 0; i < len; ++i) mixed_ws += pick(spaces);
    out.push_back("w" + mixed_ws + "w");
    out.push_back(mixed_ws);
  }
  // Random mixtures.
  const std::vector<const std::vector<std::string>*> groups = {
      &english, &english, &english, &korean, &chinese, &japanese, &arabic, &other,
      &emoji,   &punct,   &urls,    &code,   &specials, &spaces, &spaces};
  for (size_t i = 0; i < n_random; ++i) {
    std::string s;
    int parts = uni(1, 8);
    for (int p = 0; p < parts; ++p) {
      int sep = uni(0, 9);
      if (p > 0) s += sep < 6 ? " " : sep < 8 ? "" : pick(spaces);
      if (uni(0, 19) == 0) {
        const auto& pr = nfc_pairs[uni(0, static_cast<int>(nfc_pairs.size()) - 1)];
        s += uni(0, 1) ? pr.first : pr.second;
      } else if (uni(0, 14) == 0) {
        std::string d;
        for (int k = uni(1, 12); k > 0; --k) d += static_cast<char>('0' + uni(0, 9));
        s += d;
      } else {
        s += pick(*groups[uni(0, static_cast<int>(groups.size()) - 1)]);
      }
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace vlmtest

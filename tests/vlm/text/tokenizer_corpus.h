// Deterministic multilingual corpus for tokenizer conformance (tests/vlm/tokenizer_qwen_test)
// and the tokenizer bench. Same (n_random, seed) -> same strings, on every platform
// (std::mt19937 is fully specified; only its raw output is used, never a distribution).
//
// Parts, in order:
//   1. fragments of every category (incl. letters, numbers and marks from recent Unicode
//      versions), each alone and in 7 contexts (leading space, trailing spaces, \r\n,
//      leading newline, glued to a letter, glued to a digit, in a sentence);
//   2. contractions: 's 't 're 've 'm 'll 'd in every upper/lower-case spelling, in 7 contexts;
//   3. digit runs of 1..64 digits, alone and mixed with letters and punctuation;
//   4. whitespace: every space-like code point (incl. U+0085, U+00A0, U+1680, U+2000-U+200A,
//      U+2028/9, U+202F, U+205F, U+3000, U+FEFF, U+200B, U+180E) in runs of 1-5, in 10
//      contexts; newline and \r\n runs mixed with spaces and tabs;
//   5. every added token of the Qwen vocabulary in 10 contexts (mid-word, adjacent, partial);
//   6. NFC / NFD / mixed-order spellings of the same texts;
//   7. long pre-tokens (> 48 and > 64 bytes: the heap BPE path and the uncached path);
//   8. `n_random` random mixtures of fragments (all but the recent-Unicode ones), digit
//      runs and NFD text.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "vlm/text/unicode.h"

namespace vlm::test {
namespace corpus_detail {

using Strings = std::vector<std::string>;

inline const Strings& english() {
  static const Strings v = {
      "Hello world", "The quick brown fox jumps over the lazy dog.", "it's", "they're",
      "We'LL see", "I'M here", "you'VE", "she'd", "don't", "CAN'T", "o'clock", "rock'n'roll",
      "Mr. O'Neil's book", "isn't it?", "HELLO", "hello", "HeLLo WoRLD", "naïve café", "résumé",
      "supercalifragilisticexpialidocious", "a", "I", "tokenization", "Don't STOP 'TIL",
      "x'S y'T z'RE w'Ve v'M u'Ll t'D", "It’s a curly apostrophe", "‘single’ and “double”",
      "e.g. i.e. etc.", "U.S.A.", "well-known state-of-the-art", "CamelCaseIdentifier",
      "snake_case_identifier", "SCREAMING_SNAKE", "Ünïcödé Ëxtrâ", "Œuvre, ſtraße, ﬁne, ﬀ",
      "Kelvin K and Å angstrom", "İstanbul ıi", "the 'quoted' word", "'tis the season",
      "rock 'n' roll", "'90s kids", "y'all'd've", "O'Reilly's", "ma'am", "the dogs' bones"};
  return v;
}

inline const Strings& chinese() {
  static const Strings v = {
      "你好，世界", "光学字符识别", "北京欢迎你。", "人工智能与机器学习", "中华人民共和国",
      "繁體中文測試", "今天天气很好，我们去公园散步吧！", "《红楼梦》是中国古典小说。",
      "价格：￥1,299.00（含税）", "第３章　第二节", "我爱你❤️中国", "「引号」和『书名号』",
      "深度学习模型在2024年取得了突破", "𠀀𠀁𪚥 (CJK Ext B)", "龘靐齉", "一二三四五六七八九十",
      "〇零壹贰叁", "中文English混合text", "数字123和字母abc", "你好,世界!(半角标点)"};
  return v;
}

inline const Strings& japanese() {
  static const Strings v = {
      "こんにちは世界", "カタカナとひらがな", "東京タワー", "ｶﾀｶﾅ半角", "日本語の文章です。",
      "ー〜・", "ｺﾝﾆﾁﾊ ｾｶｲ", "ﾊﾟﾋﾟﾌﾟﾍﾟﾎﾟ ｶﾞｷﾞｸﾞ", "ｱｲｳｴｵ｡｢ｶｷ｣､ｸｹｺ･ｰ", "がぎぐげご ぱぴぷぺぽ",
      "ヴァイオリン", "㌔㍍㌘", "ＡＢＣ１２３ａｂｃ", "吾輩は猫である。名前はまだ無い。",
      "漢字かな交じり文", "１２：３０〜１５：００", "〒100-0001 東京都千代田区"};
  return v;
}

inline const Strings& korean() {
  static const Strings v = {
      "안녕하세요", "한국어 텍스트 인식", "서울특별시 강남구", "감사합니다!", "대한민국 만세",
      "ㄱㄴㄷ ㅏㅑㅓ", "훈민정음", "읽었습니다", "값이 없습니다", "똠방각하 뷁",
      "한글123English", "ㅋㅋㅋㅋㅋ ㅎㅎ", "ᄒᆞᆫ글 (옛한글)", "\u1100\u1161\u11a8",
      "\u1112\u1161\u11ab\u1100\u116e\u11af", "\u110b\u1161\u11ab\u1102\u1167\u11bc",
      "\u1100\u1161", "\u1100\u119e\u11a8", "ᄀᄁᄂᄃ ᅡᅢᅣ ᆨᆩᆪ", "가\u11a8"};
  return v;
}

inline const Strings& arabic() {
  static const Strings v = {
      "مرحبا بالعالم", "اللغة العربية", "٠١٢٣٤٥٦٧٨٩", "السلام عليكم", "قِرَاءَة",
      "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ", "مُحَمَّدٌ", "كتـــــاب", "۰۱۲۳۴۵۶۷۸۹ فارسی",
      "سلام\u200cدنیا", "\u200fنص\u200e mixed", "عدد ١٢٣ و 456", "ﷺ ﷲ ﻻ", "إِنَّ"};
  return v;
}

inline const Strings& devanagari() {
  static const Strings v = {
      "नमस्ते दुनिया", "क्षत्रिय", "त्रिशूल", "ज्ञान", "श्रीमान", "द्वार", "हिन्दी भाषा",
      "संस्कृतम्", "क्‍ष", "क्‌ष", "राष्ट्रपति", "०१२३४५६७८९", "क़ ख़ ग़ ज़", "\u0915\u093c",
      "ऑफ़िस", "पृथ्वी", "स्त्री", "अंग्रेज़ी", "ॐ नमः शिवाय", "ह्न ह्म ह्य"};
  return v;
}

inline const Strings& thai() {
  static const Strings v = {"สวัสดีครับ", "ภาษาไทย", "ประเทศไทยมีจังหวัด๗๗จังหวัด",
                            "กรุงเทพมหานคร", "น้ำแข็ง", "ผู้ใหญ่", "๑๒๓๔๕", "ฯลฯ ๆ",
                            "ก่ก้ก๊ก๋"};
  return v;
}

inline const Strings& other_scripts() {
  static const Strings v = {
      "Привет мир", "Ελληνικά", "שלום עולם", "Tiếng Việt có dấu", "Zürich Straße",
      "ΑΒΓ αβγ ς", "Ёлка ёжик", "ქართული", "Հայերեն", "தமிழ்", "বাংলা ভাষা", "ኢትዮጵያ",
      "ភាសាខ្មែរ", "မြန်မာ", "བོད་སྐད", "ᠮᠣᠩᠭᠣᠯ", "ᏣᎳᎩ", "ꦧꦱꦗꦮ", "Ⅻ ⅻ ① ⑳ ½ ¾ ² ³",
      "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝", "Ⓐⓑⓒ", "ǅ ǈ ǋ (titlecase)", "ᾈᾼ ΐ", "Ꭰ ꭰ"};
  return v;
}

// Code points newer than some Unicode table involved: HF normalises with Unicode 9.0 data
// and splits with Unicode 16.0 classes (utf8proc 2.8: 15.0, PCRE2 10.42: 14.0). Letters and
// numbers from 15.0-16.0, and marks from 10.0-15.0 next to older marks.
inline const Strings& recent_unicode() {
  static const Strings v = {
      " \U0001D2C0!", "Kaktovik \U0001D2C1\U0001D2C2\U0001D2C3 = 1 2 3", "x \U0001D2D3",
      "\U0001D2C0\U0001D2C1 \U0001D2C2", "1\U0001D2C0 2", "'\U0001D2C0s",
      "CJK H: \U00031350\U00031351\U00031352 I: \U0002EBF0\U0002EBF1", "字\U00031350字",
      "a\u1C89b \u1C8A!", "\uA7CB\uA7CD \uA7DA", "Todhri \U000105C0\U000105C1",
      "Kawi \U00011F04\U00011F05\U00011F41\U00011F42", " \U00011F50\U00011F51 digits",
      "Garay \U00010D4A\U00010D40\U00010D41", " \U0001E5F1\U0001E5F2 \U0001E5D0",
      "Sunuwar \U00011BC0\U00011BF0", " \U000116D0 \U00016D70 \U0001CCF0 \U0001E4F0",
      "\U00016D40\U00016D41 \U00016D70\U00016D71", "\U000113C2\U000113B8 \U000113C5",
      "\U00016D67\U00016D67", "\U00016121\U0001611E", "emoji \U0001FAE9\U0001FAC6 (16.0)",
      "a\u07FD\u0301", "a\u0898\u0316", "\u0915\u093C\u0301\u08CF", "\U00011935\U00011930",
      "\U00011938", "a\u1ABF\u0316\u0301", "\u1DF6\u0316 e\u1DFA\u0301",
      "\u0D3B\u0D3C \u0D3C\u0D3B", "\u09FE\u0301", "\u0C3C\u0C55", "\U0001E130\u0316",
      "\U00010F46\u0301\u0316", "\U00016FF0\U00016FF1", "e\u0301\u1DFA\u0323"};
  return v;
}

inline const Strings& emoji() {
  static const Strings v = {
      "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇰🇷🇯🇵", "❤️", "🧑‍💻 coding", "👩🏾‍🔬", "🤖🤖🤖",
      "✨done✨", "1️⃣", "😀😃😄😁", "👋🏻👋🏼👋🏽👋🏾👋🏿", "🏴‍☠️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🇺🇳🇪🇺🇦🇶",
      "#️⃣ *️⃣ 0️⃣ 9️⃣", "#\u20e3 (no VS)", "☺\ufe0e vs ☺\ufe0f", "↔\ufe0f ©\ufe0f ®\ufe0e",
      "👩‍❤️‍💋‍👨", "🧔🏿‍♂️", "🫠🫡🫶", "🏃‍♀️‍➡️", "🐈‍⬛", "❤️‍🔥", "👁️‍🗨️", "🇦", "🇦🇧🇨",
      "\u200d", "a\u200db", "🙂\u200d", "text😀text", "😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀"};
  return v;
}

inline const Strings& combining() {
  static const Strings v = {
      "Z̴̧̢̛̛͉͎̳͚̥͙̹̲̝̼̜̽̓̈́̒̈́̇̈́͘͝a̷̢̛̤̦̘͇̝͖̼̪̝͙̓͗̆̾̃͋͑̊̕͝l̶̢̛̮̯̣̪̠̟̮̀̀̔̿̿͛͝ǵ̷̢̬͙̗̈́̃̄͐͗̽͊̕o̸̢̟̦̰̙͖̜͗̓̏͑̍̓̾̽͘",
      "a\u0301\u0323", "a\u0323\u0301", "e\u0302\u0301\u0323", "q\u0307\u0323",
      "x\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308\u0309", "\u0301alone",
      " \u0301", "\u0301\u0301\u0301", "o\u031b\u0303", "\u05d1\u05bc\u05b8", "ñ̃", "ä̈̈",
      "i\u0307\u0301", "s\u0323\u0307", "\u1e69", "A\u20dd", "1\u20e3", "ǖ ǘ ǚ ǜ",
      "a\u034fb", "c\u0327\u0301"};
  return v;
}

inline const Strings& punctuation() {
  static const Strings v = {
      "...", "!!!", "?!", "---", "***", "((()))", "[]{}<>", "\"quoted\"", "«guillemets»",
      "—–-", "、。！？", "@#$%^&*", "~`|\\", ";;", "::", "''", "'", "<<>>", "</div>", "=>", "!=",
      "…", "‽⁇", "§¶†‡", "•◦‣", "€£¥₩₹₿", "°C ℃ ℉", "±×÷√∞≠≤≥", "→←↑↓⇒", "™©®", "¿¡",
      "'''", "'s'", "''s", "\"'\"", "¯\\_(ツ)_/¯", "(╯°□°)╯︵ ┻━┻", "<!-- -->", "&amp;&lt;&#39;",
      "\\n\\t", "%s %d %%", "?.", ".?", "_", "__init__", "--flag=value", "a-b_c.d/e\\f"};
  return v;
}

inline const Strings& urls() {
  static const Strings v = {
      "https://example.com/path?q=1&r=two#frag", "http://localhost:8080/", "www.qwen.ai",
      "mailto:someone@example.org", "ftp://files.example.net/a/b/c.tar.gz",
      "https://ko.wikipedia.org/wiki/한국어", "first.last+tag@sub.example.co.uk",
      "user_name123@gmail.com", "https://github.com/org/repo/blob/main/src/file.cpp#L42-L57",
      "http://[::1]:8000/api/v2/items?id=7", "https://例え.jp/パス",
      "s3://bucket/key/part-00000.parquet",
      "https://www.youtube.com/watch?v=dQw4w9WgXcQ&t=42s", "file:///home/user/.bashrc",
      "https://xn--n3h.com", "192.168.1.254:22", "Contact: <admin@example.com>",
      "https://example.com/a%20b%2Fc?x=%E2%9C%93"};
  return v;
}

inline const Strings& code() {
  static const Strings v = {
      "int main() {\n    return 0;\n}\n", "def f(x):\n\treturn x ** 2\n",
      "for (size_t i = 0; i < n; ++i) sum += a[i];", "if x != None and y >= 3:",
      "const auto& [k, v] = *it;", "#include <vector>", "SELECT * FROM t WHERE id = 42;",
      "  \"key\": [1, 2, 3],\r\n", "λx.x", "a_b_c = 0x1F; b = 1e-9",
      "template <typename T>\nstd::vector<T> f(const T& x) {\n  return {x};\n}\n",
      "std::unique_ptr<Foo> p = std::make_unique<Foo>(1, 2.5f, \"s\");",
      "auto [it, ok] = m.try_emplace(key, std::move(value));  // C++17",
      "#define CHECK(x) do { if (!(x)) abort(); } while (0)",
      "class A:\n    def __init__(self, n: int = 0) -> None:\n        self.n = n\n",
      "print(f\"{x!r:>10} {y:.3f}\")", "lambda *args, **kwargs: None",
      "@dataclass\nclass P:\n    x: float\n    y: float\n",
      "[i**2 for i in range(10) if i % 2 == 0]",
      "{\"name\": \"vlmtrain\", \"version\": \"1.0.0\", \"deps\": [\"torch\"], \"ok\": true, "
      "\"n\": null}",
      "{\n  \"a\": {\n    \"b\": [1.5e10, -2, 0.0]\n  }\n}", "[{\"k\":\"v\"},{\"k\":\"\\u00e9\"}]",
      "#!/usr/bin/env bash\nset -euo pipefail\n", "for f in *.txt; do echo \"$f\"; done",
      "ls -la | grep -v '^d' | awk '{print $9}' > out.txt 2>&1",
      "export PATH=\"$HOME/.local/bin:$PATH\"", "cmake -S . -B build -G Ninja && ninja -C build",
      "if [[ -z \"${VAR:-}\" ]]; then exit 1; fi", "x=$((a+b)); echo ${x}",
      "    \tmixed indent\n\t    here", "fn main() { println!(\"hi\"); }",
      "<div class=\"a\">\n  <p>Hello</p>\n</div>", "SELECT a, COUNT(*) FROM t GROUP BY a;",
      "// comment\n/* block */\n", "#pragma once", "i++; j--; k += 1; l <<= 2; m >>>= 3;",
      "x => x * 2", "a ?? b ?: c", "0b1010 0o777 0xDEADBEEF 1_000_000 3.14e-10 .5 5."};
  return v;
}

// Every added token of the Qwen3 vocabulary, plus near misses.
inline const Strings& added_tokens() {
  static const Strings v = {
      "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
      "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
      "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
      "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
      "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
      "</think>"};
  return v;
}

inline const Strings& near_misses() {
  static const Strings v = {"<|im_", "<|im_end", "|>", "<|", "<|im_start|", "|im_start|>",
                            "<|IM_START|>", "< |im_start|>", "<think", "think>", "</ think>",
                            "<|im_start|>>", "<<|im_end|>", "<|image_pad|><|image_pad|>",
                            "<|im_start|><|im_end|>", "<|endoftext|>\n<|im_start|>"};
  return v;
}

inline const Strings& spaces() {
  static const Strings v = {" ",       "  ",       "   ",      "\t",       "\t\t",     "\n",
                            "\n\n",    "\n\n\n",   "\r\n",     "\r\n\r\n", " \n",      "\n ",
                            "  \n  ",  "\u00a0",   "\u3000",   " \t \n",   "\u2003",   "\r",
                            "\v",      "\f",       "\u0085",   "\ufeff",   "\u2028",   "\u2029",
                            "\u200b",  "\u202f",   "\u205f",   "\u1680",   "\u180e",   "\u2009",
                            "\r\r",    "\n\r",     " \r\n ",   "\t\n\t"};
  return v;
}

// Single space-like code points (and near relatives that are not `\s`).
inline const Strings& space_chars() {
  static const Strings v = {
      " ",      "\t",     "\n",     "\r",     "\v",     "\f",     "\u0085", "\u00a0", "\u1680",
      "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008",
      "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff", "\u200b",
      "\u180e", "\u200c", "\u200d", "\u2060", "\u001c", "\u001f", "\r\n"};
  return v;
}

// Texts whose NFC and NFD spellings differ (NFD is built with vlm::unicode::nfd).
inline const Strings& composed_texts() {
  static const Strings v = {
      "é", "Å", "ñ", "한국어", "ệ", "ü", "Ǻ", "が", "café au lait", "Tiếng Việt có dấu",
      "naïve résumé façade", "Ångström", "Düsseldorf Köln München", "Ελληνικά ΐΰ",
      "Привет й ё", "ガギグゲゴ パピプペポ", "읽었습니다 똠방각하", "ḍḥṣṭẓ", "ǖǘǚǜ",
      "Crème brûlée à la française", "हिंदी", "ক্ষ কো", "ஔ கொ", "Ǆemal", "ṩ ḉ ẫ ổ",
      "Ω K Å (singletons)", "ﬀ ﬁ ½ (compatibility, unchanged by NFC)", "אָב"};
  return v;
}

inline std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// Uniform integer in [0, n) from raw mt19937 output (distributions differ across
// standard libraries; this does not).
inline uint32_t below(std::mt19937& rng, uint32_t n) {
  return static_cast<uint32_t>((static_cast<uint64_t>(rng()) * n) >> 32);
}

inline std::string digits(std::mt19937& rng, int len) {
  std::string d;
  for (int i = 0; i < len; ++i) d += static_cast<char>('0' + below(rng, 10));
  return d;
}

}  // namespace corpus_detail

inline std::vector<std::string> tokenizer_corpus(size_t n_random = 2000, uint32_t seed = 1234) {
  using namespace corpus_detail;
  std::mt19937 rng(seed);
  auto pick = [&](const Strings& v) -> const std::string& {
    return v[below(rng, static_cast<uint32_t>(v.size()))];
  };
  std::vector<std::string> out;

  // 1. Fragments alone and in context.
  const std::vector<const Strings*> groups = {
      &english(), &chinese(), &japanese(), &korean(), &arabic(), &devanagari(), &thai(),
      &other_scripts(), &recent_unicode(), &emoji(), &combining(), &punctuation(), &urls(),
      &code(), &added_tokens(), &near_misses(), &spaces()};
  for (const Strings* g : groups) {
    for (const auto& s : *g) {
      out.push_back(s);
      out.push_back(" " + s);
      out.push_back(s + "  ");
      out.push_back(s + "\r\n");
      out.push_back("\n" + s);
      out.push_back("x" + s + "y");
      out.push_back("7" + s + "8");
      out.push_back("Text: " + s + ", more text.");
    }
  }

  // 2. Contractions in every case spelling ('s 'S 'll 'lL 'Ll 'LL ...), in context.
  for (std::string suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
    for (uint32_t mask = 0; mask < (1u << suffix.size()); ++mask) {
      std::string c = "'";
      for (size_t k = 0; k < suffix.size(); ++k)
        c += static_cast<char>((mask >> k) & 1 ? suffix[k] - 'a' + 'A' : suffix[k]);
      for (const char* f : {"%", "it%", "IT% OK", "x%y", " %\n", "we%%ve 1%2", "\u00e9%\u00e9"}) {
        std::string s;
        for (const char* p = f; *p; ++p) s += *p == '%' ? c : std::string(1, *p);
        out.push_back(s);
      }
    }
  }
  for (const char* s : {"'\u017f", "it'\u017f", "'\u212a", "'\u0130", "I'\u1e9e", "'\u0073\u0307",
                        "’s ’S ’ll", "\u02bcs", "`s", "''ll", "'''s", "'s's's", "'LLama",
                        "'dd", "'ree", "'m'm", "don't'", "'s\n's", "'\n", "'1", "'é"})
    out.push_back(s);

  // 3. Digit runs of 1..64 digits, alone and mixed with letters and punctuation.
  for (int len = 1; len <= 64; ++len) {
    const std::string d = digits(rng, len), e = digits(rng, len);
    out.push_back(d);
    out.push_back(" " + d);
    out.push_back("v" + d + "x " + d.substr(0, len / 2) + "," + d);
    out.push_back(d + "." + e);
    out.push_back("-" + d + "e-" + std::to_string(len));
    out.push_back("abc" + d + "def" + e + "ghi");
    out.push_back("(" + d + ")[" + e + "]{" + d + "}");
    out.push_back(d + "%" + e + "$" + d + "€");
    out.push_back(d + " " + e + "\n" + d);
    out.push_back("ID_" + d + "_" + e);
    out.push_back("数字" + d + "번호" + e);
  }
  for (const char* s : {"1,234,567.89", "3.14159265358979323846", "2024-01-31T23:59:59Z",
                        "+1 (555) 123-4567", "192.168.0.1", "v1.2.3-rc.4+build.5", "0.000001",
                        "1e10 1E-10 1.5e+3", "12:34:56", "1/2 3/4", "١٢٣٤٥", "१२३४५", "๑๒๓",
                        "１２３４５", "¹²³⁴⁵", "₀₁₂₃", "①②③", "ⅠⅡⅢⅣ", "٣.١٤", "𝟎𝟏𝟐𝟑",
                        "1st 2nd 3rd 4th", "10x faster", "x86_64", "H2O CO2", "COVID-19"})
    out.push_back(s);

  // 4. Whitespace: every space-like code point in runs, in context; newline runs.
  for (const auto& w : space_chars()) {
    for (int n : {1, 2, 3, 5}) {
      const std::string r = repeat(w, n);
      out.push_back(r);
      out.push_back("a" + r + "b");
      out.push_back(r + "a");
      out.push_back("a" + r);
      out.push_back(r + "\n");
      out.push_back("\n" + r);
      out.push_back(" " + r + " ");
      out.push_back("1" + r + "2");
      out.push_back("!" + r + "?");
      out.push_back("字" + r + "한");
    }
  }
  for (int len = 1; len <= 24; ++len) {
    std::string mixed;
    for (int i = 0; i < len; ++i) mixed += pick(spaces());
    out.push_back(mixed);
    out.push_back("w" + mixed + "w");
    out.push_back(std::string(len, ' ') + "x" + std::string(len, ' '));
    out.push_back("x" + std::string(len, '\t') + "\n");
    out.push_back(repeat("\n", len));
    out.push_back(repeat("\r\n", len));
    out.push_back("line" + repeat("\n", len) + "line");
    out.push_back("line" + repeat(" \n", len) + "  line");
    out.push_back("a" + std::string(len, ' ') + "b");
    out.push_back("end" + std::string(len % 7 + 1, ' '));
  }

  // 5. Added tokens mid-word, adjacent, and between whitespace.
  for (const auto& t : added_tokens()) {
    for (const auto& ctx : {std::string("ab%cd"), std::string("%%"), std::string(" % "),
                            std::string("\n%\n"), std::string("%hello%"), std::string("<%>"),
                            std::string("%<|im_end|>"), std::string("한%字"),
                            std::string("  %  "), std::string("x%\r\n%y")}) {
      std::string s;
      for (char ch : ctx) s += ch == '%' ? t : std::string(1, ch);
      out.push_back(s);
    }
  }

  // 6. NFC / NFD spellings of the same text.
  for (const auto& c : composed_texts()) {
    const std::string d = vlm::unicode::nfd(c);
    out.push_back(c);
    out.push_back(d);
    out.push_back(" " + d);
    out.push_back(c + " " + d);
    out.push_back("caf" + d + " and " + c + "!");
    out.push_back(d + d + " " + d);
  }

  // 7. Long pre-tokens: > 48 bytes (heap BPE) and > 64 bytes (not cached).
  for (int n : {17, 33, 49, 65, 100, 300}) {
    out.push_back(repeat("a", n));
    out.push_back(" " + repeat("ab", n / 2));
    out.push_back(repeat("字", n / 3 + 1));
    out.push_back(repeat("😀", n / 4 + 1));
    out.push_back(repeat("!", n));
    out.push_back(repeat("-=", n / 2));
    out.push_back(repeat(" ", n) + "x");
    out.push_back("Pneumonoultramicroscopicsilicovolcanoconiosis" + repeat("x", n));
    out.push_back(repeat("한국어", n / 9 + 1));
    out.push_back(repeat("\u0e01\u0e48", n / 6 + 1));
  }

  // 8. Random mixtures. recent_unicode() stays out: the bench joins these into documents,
  // and such rare code points in most of them would not be typical text.
  const std::vector<const Strings*> mix = {
      &english(), &english(), &english(), &chinese(), &japanese(), &korean(), &arabic(),
      &devanagari(), &thai(), &other_scripts(), &emoji(), &emoji(), &combining(),
      &punctuation(), &urls(), &code(), &added_tokens(), &near_misses(), &spaces(), &spaces(),
      &space_chars(), &composed_texts()};
  for (size_t i = 0; i < n_random; ++i) {
    std::string s;
    const uint32_t parts = 1 + below(rng, 8);
    for (uint32_t p = 0; p < parts; ++p) {
      const uint32_t sep = below(rng, 10);
      if (p > 0) s += sep < 6 ? " " : sep < 8 ? "" : pick(spaces());
      const uint32_t kind = below(rng, 20);
      if (kind == 0) {
        s += vlm::unicode::nfd(pick(composed_texts()));
      } else if (kind == 1) {
        s += digits(rng, 1 + static_cast<int>(below(rng, 16)));
      } else {
        s += pick(*mix[below(rng, static_cast<uint32_t>(mix.size()))]);
      }
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace vlm::test

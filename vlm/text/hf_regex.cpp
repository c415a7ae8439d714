// Translating HF tokenizers' (Oniguruma) pre-tokenizer regexes for PCRE2.
#include "vlm/text/hf_regex.h"

#include "vlm/runtime/check.h"
#include "vlm/text/unicode.h"

namespace vlm {
namespace {

// HF tokenizers runs its regexes with Oniguruma, whose Unicode `\s` is
// [\t-\r U+0085 \p{Z}]. PCRE2's differs (no U+0085), so spell it out.
constexpr const char* kSpaceSet = "\\t-\\r\\x{85}\\p{Z}";

// Oniguruma in HF tokenizers 0.23 has Unicode 16.0 tables, PCRE2 10.42 (Debian 12) 14.0 ones.
// These are the letters (L), marks (M) and numbers (N) assigned in Unicode 15.0-16.0 (CJK
// Extensions H and I, Kawi, Kaktovik numerals, Todhri, Tulu-Tigalari marks, ...): Oniguruma's
// \p{L} / \p{M} / \p{N} (HF's Split pre-tokenizer with that pattern, on every code point)
// minus PCRE2 10.42's (Python 3.11's unicodedata, also Unicode 14.0, for M). Sorted, disjoint.
// The marks matter for Qwen3.5's pattern ([\p{L}\p{M}]+); tiktoken's regex agrees with HF's
// on every code point there (the Qwen3.5 tokenizer test in tests/vlm/text/).
struct RecentRange {
  char32_t lo, hi;
  char cls;  // 'L', 'M' or 'N'
};
constexpr RecentRange kRecentClasses[] = {
    {0x897, 0x897, 'M'}, {0xCF3, 0xCF3, 'M'}, {0xECE, 0xECE, 'M'}, {0x1C89, 0x1C8A, 'L'},
    {0xA7CB, 0xA7CD, 'L'}, {0xA7DA, 0xA7DC, 'L'}, {0x105C0, 0x105F3, 'L'}, {0x10D40, 0x10D49, 'N'},
    {0x10D4A, 0x10D65, 'L'}, {0x10D69, 0x10D6D, 'M'}, {0x10D6F, 0x10D85, 'L'},
    {0x10EC2, 0x10EC4, 'L'}, {0x10EFC, 0x10EFF, 'M'}, {0x1123F, 0x11240, 'L'},
    {0x11241, 0x11241, 'M'}, {0x11380, 0x11389, 'L'}, {0x1138B, 0x1138B, 'L'},
    {0x1138E, 0x1138E, 'L'}, {0x11390, 0x113B5, 'L'}, {0x113B7, 0x113B7, 'L'},
    {0x113B8, 0x113C0, 'M'}, {0x113C2, 0x113C2, 'M'}, {0x113C5, 0x113C5, 'M'},
    {0x113C7, 0x113CA, 'M'}, {0x113CC, 0x113D0, 'M'}, {0x113D1, 0x113D1, 'L'},
    {0x113D2, 0x113D2, 'M'}, {0x113D3, 0x113D3, 'L'}, {0x113E1, 0x113E2, 'M'},
    {0x116D0, 0x116E3, 'N'}, {0x11BC0, 0x11BE0, 'L'}, {0x11BF0, 0x11BF9, 'N'},
    {0x11F00, 0x11F01, 'M'}, {0x11F02, 0x11F02, 'L'}, {0x11F03, 0x11F03, 'M'},
    {0x11F04, 0x11F10, 'L'}, {0x11F12, 0x11F33, 'L'}, {0x11F34, 0x11F3A, 'M'},
    {0x11F3E, 0x11F42, 'M'}, {0x11F50, 0x11F59, 'N'}, {0x11F5A, 0x11F5A, 'M'},
    {0x1342F, 0x1342F, 'L'}, {0x13440, 0x13440, 'M'}, {0x13441, 0x13446, 'L'},
    {0x13447, 0x13455, 'M'}, {0x13460, 0x143FA, 'L'}, {0x16100, 0x1611D, 'L'},
    {0x1611E, 0x1612F, 'M'}, {0x16130, 0x16139, 'N'}, {0x16D40, 0x16D6C, 'L'},
    {0x16D70, 0x16D79, 'N'}, {0x18CFF, 0x18CFF, 'L'}, {0x1B132, 0x1B132, 'L'},
    {0x1B155, 0x1B155, 'L'}, {0x1CCF0, 0x1CCF9, 'N'}, {0x1D2C0, 0x1D2D3, 'N'},
    {0x1DF25, 0x1DF2A, 'L'}, {0x1E030, 0x1E06D, 'L'}, {0x1E08F, 0x1E08F, 'M'},
    {0x1E4D0, 0x1E4EB, 'L'}, {0x1E4EC, 0x1E4EF, 'M'}, {0x1E4F0, 0x1E4F9, 'N'},
    {0x1E5D0, 0x1E5ED, 'L'}, {0x1E5EE, 0x1E5EF, 'M'}, {0x1E5F0, 0x1E5F0, 'L'},
    {0x1E5F1, 0x1E5FA, 'N'}, {0x2B739, 0x2B739, 'L'}, {0x2EBF0, 0x2EE5D, 'L'},
    {0x31350, 0x323AF, 'L'},
};

}  // namespace

// True when `s` holds a code point of kRecentClasses (all are >= U+0897; the 3-byte ones
// start with E0, E1 or EA, the 4-byte ones with F0).
bool has_recent_letter_mark_or_number(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b != 0xE0 && b != 0xE1 && b != 0xEA && b != 0xF0) continue;
    size_t j = i;
    const char32_t cp = unicode::next_code_point(s, j);
    for (const auto& r : kRecentClasses) {
      if (cp < r.lo) break;
      if (cp <= r.hi) return true;
    }
    i = j - 1;
  }
  return false;
}

// Rewrites an HF (Oniguruma) pattern for PCRE2: `\s` and `\S` get HF's set; with `recent`,
// \p{L}, \p{M} and \p{N} get the Unicode 15.0-16.0 letters, marks and numbers added (which makes the
// classes slower to test: used only on text that holds such code points).
std::string hf_regex_to_pcre2(std::string_view p, const std::string& source, bool recent) {
  std::string out;
  bool in_class = false;
  auto set = [&](const std::string& members, bool negated, std::string_view name) {
    if (in_class) {
      VLM_CHECK(!negated, source, ": pre-tokenizer regex uses ", name, " inside a character "
                "class, which is not supported (pattern: ", p, ")");
      out += members;
    } else {
      out += (negated ? "[^" : "[") + members + "]";
    }
  };
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      const std::string_view prop = p.substr(i + 1, 3);
      if (e == 's' || e == 'S') {
        set(kSpaceSet, e == 'S', "\\S");
      } else if (recent && (e == 'p' || e == 'P') &&
                 (prop == "{L}" || prop == "{M}" || prop == "{N}")) {
        std::string members = str("\\p", prop);
        for (const auto& r : kRecentClasses)
          if (r.cls == prop[1])
            members += str("\\x{", std::hex, uint32_t{r.lo}, "}-\\x{", uint32_t{r.hi}, "}");
        set(members, e == 'P', p.substr(i - 1, 5));
        i += 3;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // literal ] first
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace vlm

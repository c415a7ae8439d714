// HF tokenizers runs pre-tokenizer regexes with Oniguruma (Unicode 16.0 tables); vlmtrain
// runs them with PCRE2 (Debian 12: 10.42, Unicode 14.0). These close the gaps.
#pragma once
#include <string>
#include <string_view>

namespace vlm {

// True when `s` holds a letter, mark or number assigned in Unicode 15.0-16.0 (CJK Extensions
// H and I, Kawi, Kaktovik numerals, Todhri, ...), which PCRE2 10.42's \p{L} / \p{M} / \p{N} miss.
bool has_recent_letter_mark_or_number(std::string_view s);

// Rewrites an HF (Oniguruma) pattern for PCRE2: `\s` and `\S` get HF's set; with `recent`,
// \p{L}, \p{M} and \p{N} also take the Unicode 15.0-16.0 letters, marks and numbers (slower
// classes: use that version only on text where has_recent_letter_mark_or_number). `source` names the
// tokenizer file in errors.
std::string hf_regex_to_pcre2(std::string_view pattern, const std::string& source, bool recent);

}  // namespace vlm

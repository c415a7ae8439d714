// OCR metrics: normalisation, code point / word edit distance, the Scorer accumulator.
#include "app/eval/metrics.h"

#include <utf8proc.h>

#include <algorithm>
#include <unordered_map>

#include "app/config/recipe.h"
#include "vlm/runtime/check.h"
#include "vlm/text/unicode.h"

namespace vlm::app {

// ---------------------------------------------------------------- normalisation

Normalization Normalization::from_eval(const EvalSection& eval) {
  Normalization n;
  n.nfc = eval.nfc;
  n.case_sensitive = eval.case_sensitive;
  n.strip_punctuation = eval.strip_punctuation;
  n.collapse_whitespace = eval.collapse_whitespace;
  return n;
}

nlohmann::json Normalization::to_json() const {
  return {{"nfc", nfc},
          {"case_sensitive", case_sensitive},
          {"strip_punctuation", strip_punctuation},
          {"collapse_whitespace", collapse_whitespace}};
}

bool is_unicode_space(char32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85)
    return true;
  if (cp < 0xA0 || cp > 0x10FFFF) return false;
  const utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool is_unicode_punctuation(char32_t cp) {
  if (cp > 0x10FFFF) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

std::u32string to_code_points(std::string_view utf8) {
  const size_t bad = vlm::unicode::first_invalid_utf8(utf8);
  VLM_CHECK(bad == std::string::npos, "metrics: expected valid UTF-8 text, found an invalid byte 0x",
            std::hex, static_cast<int>(static_cast<unsigned char>(utf8[bad])), std::dec,
            " at byte offset ", bad, " (hint: convert predictions and references to UTF-8)");
  std::u32string out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) out.push_back(vlm::unicode::next_code_point(utf8, i));
  return out;
}

std::string to_utf8(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) vlm::unicode::append_utf8(out, cp);
  return out;
}

namespace {

char32_t lower(char32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}

// The code point steps of normalisation (everything but NFC), in a fixed order:
// lowercase, drop punctuation, then whitespace (so removed punctuation cannot leave a
// double space behind).
struct Steps {
  bool lowercase = false;
  bool strip_punctuation = false;
  bool collapse_whitespace = false;  // runs -> ' ', ends stripped
  bool strip_ends = false;           // ends stripped only (OCRBench)
  bool newline_to_space = false;     // '\n' -> ' ' (OCRBench)
};

std::u32string apply_steps(std::u32string_view in, const Steps& st) {
  std::u32string out;
  out.reserve(in.size());
  bool pending_space = false;  // collapse: a run of whitespace seen since the last kept cp
  for (char32_t cp : in) {
    if (st.lowercase) cp = lower(cp);
    if (st.strip_punctuation && is_unicode_punctuation(cp)) continue;
    if (st.collapse_whitespace && is_unicode_space(cp)) {
      pending_space = true;
      continue;
    }
    if (pending_space && !out.empty()) out.push_back(U' ');
    pending_space = false;
    out.push_back(cp);
  }
  if (st.strip_ends && !st.collapse_whitespace) {
    size_t b = 0, e = out.size();
    while (b < e && is_unicode_space(out[b])) ++b;
    while (e > b && is_unicode_space(out[e - 1])) --e;
    out = out.substr(b, e - b);
  }
  if (st.newline_to_space) std::replace(out.begin(), out.end(), U'\n', U' ');
  return out;
}

}  // namespace

std::u32string normalize(std::string_view utf8, const Normalization& norm) {
  std::u32string cps = to_code_points(utf8);  // validates before utf8proc sees the text
  if (norm.nfc) {
    bool ascii = true;
    for (char32_t cp : cps) ascii = ascii && cp < 0x80;
    if (!ascii) cps = to_code_points(vlm::unicode::nfc(utf8));
  }
  Steps st;
  st.lowercase = !norm.case_sensitive;
  st.strip_punctuation = norm.strip_punctuation;
  st.collapse_whitespace = norm.collapse_whitespace;
  return apply_steps(cps, st);
}

std::string normalize_utf8(std::string_view utf8, const Normalization& norm) {
  return to_utf8(normalize(utf8, norm));
}

std::vector<std::u32string> split_words(std::u32string_view text) {
  std::vector<std::u32string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_unicode_space(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && !is_unicode_space(text[j])) ++j;
    if (j > i) words.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

// ---------------------------------------------------------------- edit distances

namespace {

// Levenshtein distance over any random-access sequences of comparable symbols. Trims the
// common prefix and suffix (free for near-identical OCR output), then runs the classic
// dynamic programme row by row over the longer sequence, keeping one row of
// min(n, m) + 1 cells and the diagonal in a register.
template <class T>
size_t levenshtein(const T* a, size_t n, const T* b, size_t m) {
  while (n > 0 && m > 0 && a[0] == b[0]) ++a, ++b, --n, --m;
  while (n > 0 && m > 0 && a[n - 1] == b[m - 1]) --n, --m;
  if (n < m) std::swap(a, b), std::swap(n, m);  // b is the shorter: the row has m + 1 cells
  if (m == 0) return n;
  std::vector<size_t> row(m + 1);
  for (size_t j = 0; j <= m; ++j) row[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    const T ai = a[i - 1];
    size_t diag = row[0];  // D[i-1][j-1]
    size_t left = i;       // D[i][j-1]
    row[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t up = row[j];  // D[i-1][j]
      size_t v = diag + (ai == b[j - 1] ? 0 : 1);
      v = std::min(v, std::min(up, left) + 1);
      diag = up;
      row[j] = left = v;
    }
  }
  return row[m];
}

}  // namespace

size_t edit_distance(std::u32string_view a, std::u32string_view b) {
  return levenshtein(a.data(), a.size(), b.data(), b.size());
}

size_t word_edit_distance(const std::vector<std::u32string>& a,
                          const std::vector<std::u32string>& b) {
  // One integer id per distinct word, then the same programme over the ids.
  std::unordered_map<std::u32string, uint32_t> ids;
  auto encode = [&](const std::vector<std::u32string>& words) {
    std::vector<uint32_t> out;
    out.reserve(words.size());
    for (const auto& w : words)
      out.push_back(ids.emplace(w, static_cast<uint32_t>(ids.size())).first->second);
    return out;
  };
  const std::vector<uint32_t> ia = encode(a), ib = encode(b);
  return levenshtein(ia.data(), ia.size(), ib.data(), ib.size());
}

// ---------------------------------------------------------------- metrics

const std::vector<std::string>& all_metric_names() {
  static const std::vector<std::string> names = {"cer", "wer", "ned", "em", "anls", "ocrbench"};
  return names;
}

std::vector<std::string> parse_metric_list(std::string_view csv) {
  const auto& known = all_metric_names();
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= csv.size()) {
    size_t end = csv.find(',', start);
    if (end == std::string_view::npos) end = csv.size();
    std::string name(csv.substr(start, end - start));
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    VLM_CHECK(std::find(known.begin(), known.end(), name) != known.end(),
              "metrics: expected one of cer, wer, ned, em, anls, ocrbench, got '", name,
              "' in '", csv, "' (hint: a comma-separated list such as cer,wer,anls)");
    VLM_CHECK(std::find(out.begin(), out.end(), name) == out.end(),
              "metrics: '", name, "' is listed twice in '", csv, "'");
    out.push_back(name);
    start = end + 1;
  }
  return out;
}

Scorer::Scorer(ScoreOptions options) : options_(std::move(options)) {
  const auto& known = all_metric_names();
  for (const std::string& m : options_.metrics)
    VLM_CHECK(std::find(known.begin(), known.end(), m) != known.end(),
              "metrics: expected one of cer, wer, ned, em, anls, ocrbench, got '", m, "'");
  cer_ = enabled("cer");
  wer_ = enabled("wer");
  ned_ = enabled("ned");
  em_ = enabled("em");
  anls_ = enabled("anls");
  ocrbench_ = enabled("ocrbench");
}

bool Scorer::enabled(const std::string& metric) const {
  return std::find(options_.metrics.begin(), options_.metrics.end(), metric) !=
         options_.metrics.end();
}

SampleScores Scorer::score(std::string_view prediction,
                           const std::vector<std::string>& references) const {
  VLM_CHECK(!references.empty(), "metrics: expected at least one reference per sample, got none "
            "(hint: give `text` or a non-empty `answers` list)");
  SampleScores s;
  const std::u32string pred = normalize(prediction, options_.norm);
  std::vector<std::u32string> refs;
  refs.reserve(references.size());
  for (const std::string& r : references) refs.push_back(normalize(r, options_.norm));
  const std::u32string& ref0 = refs[0];

  if (cer_ || ned_) {
    s.char_edits = edit_distance(pred, ref0);
    s.ref_chars = ref0.size();
    s.pred_chars = pred.size();
    const size_t len = std::max(pred.size(), ref0.size());
    s.ned = len == 0 ? 0.0 : static_cast<double>(s.char_edits) / static_cast<double>(len);
  }
  if (wer_) {
    const auto pw = split_words(pred), rw = split_words(ref0);
    s.word_edits = word_edit_distance(pw, rw);
    s.ref_words = rw.size();
  }
  if (em_) s.exact = std::find(refs.begin(), refs.end(), pred) != refs.end();
  if (anls_) {
    // DocVQA: lowercase + collapse whitespace; s = 1 - NL kept when s >= 0.5 (the official
    // script zeroes only question results *below* the threshold). The threshold test is
    // done in integers, 2 * edits <= len, so s == 0.5 exactly is never lost to rounding.
    Steps st;
    st.lowercase = st.collapse_whitespace = true;
    const std::u32string p = apply_steps(pred, st);
    for (size_t k = 0; k < refs.size(); ++k) {
      const std::u32string a = apply_steps(refs[k], st);
      const size_t len = std::max(a.size(), p.size());
      // Page texts: when the ANLS steps change neither side, reuse the CER distance.
      const bool same = k == 0 && (cer_ || ned_) && p == pred && a == refs[0];
      const size_t e = same ? s.char_edits : edit_distance(a, p);
      const double v = len == 0 ? 1.0
                       : 2 * e <= len ? 1.0 - static_cast<double>(e) / static_cast<double>(len)
                                      : 0.0;
      s.anls = std::max(s.anls, v);
    }
  }
  if (ocrbench_) {
    // OCRBench: lower(), strip(), replace("\n", " "), then `answer in predict`.
    Steps st;
    st.lowercase = st.strip_ends = st.newline_to_space = true;
    const std::u32string p = apply_steps(pred, st);
    for (const std::u32string& r : refs)
      if (p.find(apply_steps(r, st)) != std::u32string::npos) s.ocrbench = true;
  }
  return s;
}

void Scorer::add(const SampleScores& s) {
  ++n_;
  char_edits_ += s.char_edits;
  ref_chars_ += s.ref_chars;
  word_edits_ += s.word_edits;
  ref_words_ += s.ref_words;
  ned_sum_ += s.ned;
  anls_sum_ += s.anls;
  em_count_ += s.exact ? 1 : 0;
  ocrbench_count_ += s.ocrbench ? 1 : 0;
}

SampleScores Scorer::add(std::string_view prediction, const std::vector<std::string>& references) {
  SampleScores s = score(prediction, references);
  add(s);
  return s;
}

Summary Scorer::summary() const {
  Summary sum;
  sum.n = n_;
  sum.char_edits = char_edits_;
  sum.ref_chars = ref_chars_;
  sum.word_edits = word_edits_;
  sum.ref_words = ref_words_;
  if (ref_chars_ > 0) sum.cer = static_cast<double>(char_edits_) / static_cast<double>(ref_chars_);
  if (ref_words_ > 0) sum.wer = static_cast<double>(word_edits_) / static_cast<double>(ref_words_);
  if (n_ > 0) {
    const double n = static_cast<double>(n_);
    sum.ned = ned_sum_ / n;
    sum.em = static_cast<double>(em_count_) / n;
    sum.anls = anls_sum_ / n;
    sum.ocrbench = static_cast<double>(ocrbench_count_) / n;
  }
  return sum;
}

nlohmann::json summary_json(const Summary& s, const ScoreOptions& options) {
  nlohmann::json j = nlohmann::json::object();
  j["n"] = s.n;
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  for (const std::string& m : options.metrics) {
    if (m == "cer") j["cer"] = opt(s.cer);
    if (m == "wer") j["wer"] = opt(s.wer);
    if (m == "ned") j["ned"] = s.ned;
    if (m == "em") j["em"] = s.em;
    if (m == "anls") j["anls"] = s.anls;
    if (m == "ocrbench") j["ocrbench"] = s.ocrbench;
  }
  auto has = [&](const char* m) {
    return std::find(options.metrics.begin(), options.metrics.end(), m) != options.metrics.end();
  };
  if (has("cer") || has("ned")) {
    j["char_edits"] = s.char_edits;
    j["ref_chars"] = s.ref_chars;
  }
  if (has("wer")) {
    j["word_edits"] = s.word_edits;
    j["ref_words"] = s.ref_words;
  }
  return j;
}

}  // namespace vlm::app

// OCR metrics: Unicode-correct edit distances, text normalisation, and an accumulator
// that turns (prediction, references) pairs into CER, WER, NED, exact match, ANLS and
// OCRBench-style accuracy, as the public evaluation kits define them (corpus-level CER / WER
// over the first reference; DocVQA's ANLS with its 0.5 threshold; OCRBench's substring match).
//
//   Scorer scorer(ScoreOptions{});                 // default normalisation, all metrics
//   SampleScores s = scorer.add(prediction, {"reference", "other answer"});
//   Summary sum = scorer.summary();                // corpus-level numbers
//   nlohmann::json j = summary_json(sum, scorer.options());
//
// Lengths and edit distances count Unicode code points (never bytes), so "안녕하세요" vs
// "안녕하세여" is one substitution. Words are runs of non-whitespace code points (like
// Python's str.split()).
//
// Which reference each metric uses:
//   cer, wer, ned  the first reference only (page OCR has one ground truth)
//   em, anls, ocrbench  every reference ("any answer", the VQA convention)
//
// Normalisation: one `Normalization` (NFC, case, punctuation, whitespace) is applied to the
// prediction and to every reference before any metric. ANLS then also lowercases and
// collapses whitespace (DocVQA), and OCRBench lowercases, strips the ends and turns
// newlines into spaces (OCRBench), whatever the options say.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlm::app {
struct EvalSection;

// ---------------------------------------------------------------- normalisation

struct Normalization {
  bool nfc = true;                  // canonical composition (utf8proc) first
  bool case_sensitive = true;       // false: simple per-code-point lowercase (utf8proc_tolower)
  bool strip_punctuation = false;   // drop code points in the Unicode P* categories
  bool collapse_whitespace = true;  // runs of Unicode whitespace -> one ' ', ends stripped

  static Normalization from_eval(const EvalSection& eval);
  nlohmann::json to_json() const;   // {"nfc":…, "case_sensitive":…, …}
};

// True for the code points Python's str.isspace() accepts: \t \n \v \f \r, U+001C..U+001F,
// U+0085 and the Unicode categories Zs, Zl, Zp (U+00A0, U+3000, …).
bool is_unicode_space(char32_t cp);
// True for the Unicode punctuation categories Pc Pd Ps Pe Pi Pf Po.
bool is_unicode_punctuation(char32_t cp);

// Decodes UTF-8 into code points. Throws vlm::Error (with the byte offset) on invalid UTF-8.
std::u32string to_code_points(std::string_view utf8);
std::string to_utf8(std::u32string_view cps);

// Applies `norm` to UTF-8 text and returns the code points.
std::u32string normalize(std::string_view utf8, const Normalization& norm);
// The same, returned as UTF-8.
std::string normalize_utf8(std::string_view utf8, const Normalization& norm);

// Whitespace-separated words (runs of non-space code points), like Python's str.split().
std::vector<std::u32string> split_words(std::u32string_view text);

// ---------------------------------------------------------------- edit distances

// Levenshtein distance (unit insert / delete / substitute) between two code point strings.
// O(n*m) time after trimming the common prefix and suffix, O(min(n, m)) memory.
size_t edit_distance(std::u32string_view a, std::u32string_view b);
// Levenshtein distance between two word sequences (each word one symbol), for WER.
size_t word_edit_distance(const std::vector<std::u32string>& a,
                          const std::vector<std::u32string>& b);

// ---------------------------------------------------------------- metrics

// The metric names accepted by --metrics and [eval] metrics, in report order.
const std::vector<std::string>& all_metric_names();
// Parses "cer,wer,anls" (comma-separated, spaces allowed, no duplicates). Throws
// vlm::Error naming the bad entry and the accepted names.
std::vector<std::string> parse_metric_list(std::string_view csv);

struct ScoreOptions {
  Normalization norm;
  std::vector<std::string> metrics = all_metric_names();  // only these are computed
};

// Per-sample numbers. Counts of the page metrics refer to the first reference; fields of
// metrics that are not enabled stay 0.
struct SampleScores {
  size_t char_edits = 0;   // edit_distance(pred, ref0) in code points       (cer, ned)
  size_t ref_chars = 0;    // code points of ref0                            (cer)
  size_t pred_chars = 0;   // code points of the prediction                  (ned)
  size_t word_edits = 0;   // word_edit_distance(pred, ref0)                  (wer)
  size_t ref_words = 0;    // words of ref0                                  (wer)
  double ned = 0;          // char_edits / max(pred_chars, ref_chars); 0 when both empty
  double anls = 0;         // max over answers of 1 - NL, 0 when that is < 0.5
  bool exact = false;      // some normalised reference equals the normalised prediction
  bool ocrbench = false;   // some OCRBench-normalised reference is a substring of the prediction
};

// Corpus-level numbers over the samples added so far.
struct Summary {
  size_t n = 0;                  // samples
  size_t char_edits = 0, ref_chars = 0, word_edits = 0, ref_words = 0;
  std::optional<double> cer;     // char_edits / ref_chars; nullopt when ref_chars == 0
  std::optional<double> wer;     // word_edits / ref_words; nullopt when ref_words == 0
  double ned = 0;                // means over samples (0 when n == 0)
  double em = 0;
  double anls = 0;
  double ocrbench = 0;
};

class Scorer {
 public:
  explicit Scorer(ScoreOptions options = {});

  // Scores one sample without accumulating it. `references` must not be empty
  // (throws vlm::Error); texts must be valid UTF-8 (throws vlm::Error).
  SampleScores score(std::string_view prediction,
                     const std::vector<std::string>& references) const;
  // Accumulates scores computed by score() (by this or an identically configured Scorer).
  void add(const SampleScores& s);
  // score() + add().
  SampleScores add(std::string_view prediction, const std::vector<std::string>& references);

  Summary summary() const;
  size_t size() const { return n_; }
  const ScoreOptions& options() const { return options_; }
  bool enabled(const std::string& metric) const;

 private:
  ScoreOptions options_;
  bool cer_ = false, wer_ = false, ned_ = false, em_ = false, anls_ = false, ocrbench_ = false;
  size_t n_ = 0;
  size_t char_edits_ = 0, ref_chars_ = 0, word_edits_ = 0, ref_words_ = 0;
  double ned_sum_ = 0, anls_sum_ = 0;
  size_t em_count_ = 0, ocrbench_count_ = 0;
};

// {"n":…, <each enabled metric>: value or null, "char_edits":…, "ref_chars":…, …}.
nlohmann::json summary_json(const Summary& s, const ScoreOptions& options);

}  // namespace vlm::app

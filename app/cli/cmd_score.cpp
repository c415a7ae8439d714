// `vlmtrain score`: score an existing predictions.jsonl (no model needed).
//
// Reads the file line by line; each well-formed line is one sample for app/eval/metrics.h.
// Malformed lines are reported (file:line: reason), counted, and skipped; the rest is
// scored per dataset and overall.
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "app/cli/commands.h"
#include "app/eval/metrics.h"
#include "vlm/runtime/check.h"
#include "vlm/text/unicode.h"

namespace vlm::app {

namespace {

constexpr size_t kPrintedErrors = 20;
constexpr size_t kListedErrors = 100;
const char* const kNoDataset = "(none)";

const char* json_type(const nlohmann::json& j) { return j.type_name(); }

// One parsed line: a sample to score, or the reason it cannot be scored.
struct Line {
  std::string prediction;
  std::vector<std::string> references;
  std::optional<std::string> dataset;
  std::string error;  // empty when well-formed
};

Line parse_line(const std::string& text) {
  Line out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    const size_t cut = what.find("] ");  // drop "[json.exception.parse_error.101] "
    // The parser quotes what it last read, which may be the invalid bytes themselves.
    out.error = vlm::unicode::repair_utf8(
        "invalid JSON: " + (cut == std::string::npos ? what : what.substr(cut + 2)));
    return out;
  }
  if (!j.is_object()) {
    out.error = vlm::str("expected a JSON object, got ", json_type(j));
    return out;
  }
  // `dataset` first, so that a line with a readable dataset counts against that dataset.
  if (auto it = j.find("dataset"); it != j.end()) {
    if (!it->is_string()) {
      out.error = vlm::str("`dataset` must be a string, got ", json_type(*it));
      return out;
    }
    out.dataset = it->get<std::string>();
  }
  if (auto it = j.find("id"); it != j.end() && !it->is_string() && !it->is_number_integer()) {
    out.error = vlm::str("`id` must be a string or an integer, got ", json_type(*it));
    return out;
  }
  auto pred = j.find("prediction");
  if (pred == j.end()) {
    out.error = "missing field `prediction` (string)";
    return out;
  }
  if (!pred->is_string()) {
    out.error = vlm::str("`prediction` must be a string, got ", json_type(*pred));
    return out;
  }
  out.prediction = pred->get<std::string>();
  auto text_it = j.find("text");
  auto answers = j.find("answers");
  if (text_it == j.end() && answers == j.end()) {
    out.error = "missing reference: expected `text` (string) or `answers` (list of strings)";
    return out;
  }
  if (text_it != j.end()) {
    if (!text_it->is_string()) {
      out.error = vlm::str("`text` must be a string, got ", json_type(*text_it));
      return out;
    }
    out.references.push_back(text_it->get<std::string>());
  }
  if (answers != j.end()) {
    if (!answers->is_array()) {
      out.error = vlm::str("`answers` must be a list of strings, got ", json_type(*answers));
      return out;
    }
    if (answers->empty()) {
      out.error = "`answers` is an empty list (expected at least one answer)";
      return out;
    }
    for (size_t k = 0; k < answers->size(); ++k) {
      const auto& a = (*answers)[k];
      if (!a.is_string()) {
        out.error = vlm::str("`answers`[", k, "] must be a string, got ", json_type(a));
        return out;
      }
      out.references.push_back(a.get<std::string>());
    }
  }
  return out;
}

struct Group {
  explicit Group(const ScoreOptions& o) : scorer(o) {}
  Scorer scorer;
  size_t skipped = 0;
};

nlohmann::json group_json(const Group& g) {
  nlohmann::json j = summary_json(g.scorer.summary(), g.scorer.options());
  j["skipped"] = g.skipped;
  return j;
}

std::string cell(const std::optional<double>& v) {
  return v ? vlm::str(std::fixed, std::setprecision(4), *v) : std::string("n/a");
}

void print_row(const std::string& name, const Group& g, const std::vector<std::string>& metrics) {
  const Summary s = g.scorer.summary();
  std::printf("%-24s %8zu %8zu", name.c_str(), s.n, g.skipped);
  for (const std::string& m : metrics) {
    std::optional<double> v;
    if (m == "cer") v = s.cer;
    if (m == "wer") v = s.wer;
    if (m == "ned") v = s.ned;
    if (m == "em") v = s.em;
    if (m == "anls") v = s.anls;
    if (m == "ocrbench") v = s.ocrbench;
    std::printf(" %9s", s.n == 0 ? "n/a" : cell(v).c_str());
  }
  std::printf("\n");
}

struct ScoreArgs {
  std::optional<std::string> pred;     // --pred FILE (required)
  std::optional<std::string> metrics;  // --metrics a,b,c
  std::optional<std::string> out;      // --out FILE
  bool case_insensitive = false, no_nfc = false, strip_punctuation = false, keep_whitespace = false;
};

int score(const ScoreArgs& a) {
  const std::optional<std::string>& pred_path = a.pred;
  const std::optional<std::string>& metrics_csv = a.metrics;
  const std::optional<std::string>& out_path = a.out;
  ScoreOptions options;
  options.norm.case_sensitive = !a.case_insensitive;
  options.norm.nfc = !a.no_nfc;
  options.norm.strip_punctuation = a.strip_punctuation;
  options.norm.collapse_whitespace = !a.keep_whitespace;
  VLM_CHECK(pred_path && !pred_path->empty(),
            "vlmtrain score: missing --pred predictions.jsonl (see `vlmtrain score --help`)");
  if (metrics_csv) options.metrics = parse_metric_list(*metrics_csv);

  std::ifstream in(*pred_path, std::ios::binary);
  VLM_CHECK(in, "vlmtrain score: cannot open --pred file '", *pred_path,
            "' (hint: check the path; predictions are written by `vlmtrain eval`)");

  Group overall(options);
  std::map<std::string, Group> datasets;
  auto group = [&](const std::string& name) -> Group& {
    return datasets.try_emplace(name, options).first->second;
  };
  nlohmann::json listed = nlohmann::json::array();
  size_t lines = 0, line_no = 0;
  std::string text;
  while (std::getline(in, text)) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (line_no == 1 && text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // UTF-8 BOM
    if (text.find_first_not_of(" \t") == std::string::npos) continue;           // blank line
    ++lines;
    Line line = parse_line(text);
    if (line.error.empty()) {
      try {
        const SampleScores s = overall.scorer.score(line.prediction, line.references);
        overall.scorer.add(s);
        group(line.dataset.value_or(kNoDataset)).scorer.add(s);
        continue;
      } catch (const vlm::Error& e) {
        line.error = e.what();
      }
    }
    ++overall.skipped;
    if (line.dataset) ++group(*line.dataset).skipped;
    if (overall.skipped <= kPrintedErrors)
      std::fprintf(stderr, "%s:%zu: skipped: %s\n", pred_path->c_str(), line_no, line.error.c_str());
    if (listed.size() < kListedErrors) listed.push_back({{"line", line_no}, {"reason", line.error}});
  }
  VLM_CHECK(!in.bad(), "vlmtrain score: read error in '", *pred_path, "' after line ", line_no);
  if (overall.skipped > kPrintedErrors)
    std::fprintf(stderr, "%s: ... %zu more malformed lines not shown (%zu skipped in all)\n",
                 pred_path->c_str(), overall.skipped - kPrintedErrors, overall.skipped);
  VLM_CHECK(overall.scorer.size() > 0, "vlmtrain score: no scorable line in '", *pred_path, "' (",
            lines, " non-blank lines, ", overall.skipped,
            " malformed; hint: each line needs `prediction` and `text` or `answers`)");

  // Table: one row per dataset (when the file names any) and the overall row.
  std::printf("%-24s %8s %8s", "dataset", "n", "skipped");
  for (const std::string& m : options.metrics) std::printf(" %9s", m.c_str());
  std::printf("\n");
  const bool named = !(datasets.size() == 1 && datasets.count(kNoDataset));
  if (named)
    for (const auto& [name, g] : datasets) print_row(name, g, options.metrics);
  print_row("overall", overall, options.metrics);
  nlohmann::json norm = options.norm.to_json();
  std::printf("normalisation: %s\n", norm.dump().c_str());

  if (out_path) {
    nlohmann::json summary = {{"pred_file", *pred_path},
                              {"metrics", options.metrics},
                              {"normalization", norm},
                              {"lines", lines},
                              {"scored", overall.scorer.size()},
                              {"skipped", overall.skipped},
                              {"overall", group_json(overall)},
                              {"datasets", nlohmann::json::object()},
                              {"malformed", listed}};
    if (named)
      for (const auto& [name, g] : datasets) summary["datasets"][name] = group_json(g);
    std::ofstream out(*out_path, std::ios::binary | std::ios::trunc);
    VLM_CHECK(out, "vlmtrain score: cannot write --out file '", *out_path,
              "' (hint: does its folder exist?)");
    out << summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    VLM_CHECK(out.good(), "vlmtrain score: write failed for '", *out_path, "'");
    std::printf("wrote %s\n", out_path->c_str());
  }
  return 0;
}

}  // namespace

CommandRun declare_score(CLI::App& app) {
  auto a = std::make_shared<ScoreArgs>();
  app.description(R"HELP(usage: vlmtrain score --pred predictions.jsonl [--metrics cer,wer,ned,em,anls,ocrbench]
                      [--out summary.json] [--case-insensitive] [--no-nfc]
                      [--strip-punctuation] [--keep-whitespace]

Scores a predictions file written by `vlmtrain eval` or by any other system. Each line is
a JSON object:
  prediction  string (required)
  text        string: the reference (page OCR), and/or
  answers     non-empty list of strings (VQA: any answer counts)
  dataset     string (optional): summaries per dataset and overall
  id          string or integer (optional)
When both are given the references are `text` followed by `answers`.

Metrics (default: all):
  cer       corpus CER: sum of code point edit distances / sum of reference lengths
  wer       corpus WER: the same over whitespace-separated words
  ned       mean of edit / max(len(pred), len(ref)) per sample (0 when both are empty)
  em        exact match with any reference after normalisation
  anls      DocVQA ANLS (also lowercased, whitespace collapsed; 1 - NL kept when >= 0.5)
  ocrbench  1 when any reference is a substring of the prediction (lowercased, ends
            stripped, newlines -> spaces)
cer, wer and ned use the first reference; em, anls and ocrbench use all of them.

Normalisation by default: NFC, case-sensitive, punctuation kept, whitespace runs collapsed
to one space and ends stripped; the flags below change it.
)HELP");
  add_value(app, "--pred", a->pred, "FILE", "the predictions (JSONL, one object per line as above)");
  add_value(app, "--metrics", a->metrics, "LIST", "comma-separated metrics to compute (default: all)");
  add_value(app, "--out", a->out, "FILE",
            "write the summary JSON: metrics, normalisation, lines, scored, skipped,\n"
            "overall and per-dataset {n, skipped, <metrics>, edit counts}, and the\n"
            "first 100 malformed lines {line, reason}");
  const std::string norm = "normalisation (of predictions and references, before every metric)";
  add_flag(app, "--case-insensitive", a->case_insensitive, "lowercase (Unicode simple case mapping)")->group(norm);
  add_flag(app, "--no-nfc", a->no_nfc, "skip canonical composition")->group(norm);
  add_flag(app, "--strip-punctuation", a->strip_punctuation,
           "drop Unicode punctuation (categories Pc Pd Ps Pe Pi Pf Po)")->group(norm);
  add_flag(app, "--keep-whitespace", a->keep_whitespace, "keep whitespace as written (words are still split on runs)")
      ->group(norm);
  app.footer(R"HELP(Malformed lines (invalid JSON, missing fields, wrong types, invalid UTF-8) are reported
as FILE:LINE: reason (the first 20 printed, all counted in `skipped`) and skipped; blank
lines are ignored. A file with no scorable line is an error. A malformed line counts
against its dataset too when its `dataset` field could be read. Lines without `dataset`
are grouped as "(none)" when other lines name one.)HELP");
  return [a] { return score(*a); };
}

}  // namespace vlm::app

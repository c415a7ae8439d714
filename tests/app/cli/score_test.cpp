// `vlmtrain score`: a predictions file with good and malformed lines. Checks the reported
// FILE:LINE reasons, the counts, and the summary JSON against numbers worked out by hand
// here (edit distances of short strings), per dataset and overall.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace {

using nlohmann::json;

vlm::test::RunResult score(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "score"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return vlm::test::run(argv, std::chrono::seconds(120));
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// Line numbers are 1-based positions in this list.
const std::vector<std::string> kLines = {
    /* 1 */ R"({"id": 1, "dataset": "pages", "prediction": "안녕하세여", "text": "안녕하세요"})",
    /* 2 */ R"({"id": "q1", "dataset": "vqa", "prediction": "abcd", "answers": ["abef", "zz"]})",
    /* 3 */ R"({"prediction": "x", )",
    /* 4 */ "",
    /* 5 */ R"({"dataset": "vqa", "answers": ["a"]})",
    /* 6 */ R"({"prediction": 5, "text": "a"})",
    /* 7 */ R"({"prediction": "x", "answers": []})",
    /* 8 */ R"({"prediction": "x", "answers": ["a", 3]})",
    /* 9 */ R"([1, 2])",
    /* 10 */ R"({"dataset": "pages", "prediction": "the cat  sat on", "text": "the cat\tsat"})",
    /* 11 */ R"({"dataset": 7, "prediction": "x", "text": "x"})",
    /* 12 */ R"({"dataset": "vqa", "prediction": "Seoul", "answers": ["Seoul city", "Seoul"]})",
    /* 13 */ R"({"prediction": "x"})",
    /* 14 */ R"({"dataset": "pages", "prediction": "a", "text": "a", "id": [1]})",
    /* 15 */ "{\"prediction\": \"\xff\", \"text\": \"a\"}",
    /* 16 */ R"({"prediction": "xyz", "text": "xy"})",
    /* 17 */ R"({"prediction": "x", "text": null})",
};

// Hand-computed per sample (normalised: NFC, whitespace collapsed, case kept):
//   line  pred / first ref                 char e/ref  words e/ref  ned     em  anls     ocrbench
//   1     안녕하세여 / 안녕하세요            1/5         1/1          1/5     0   4/5      0
//   10    "the cat sat on" / "the cat sat"  3/11        1/3          3/14    0   11/14    1
//   2     abcd / abef (| zz)                2/4         1/1          2/4     0   1/2      0
//   12    Seoul / "Seoul city" (| Seoul)    5/10        1/2          5/10    1   1        1
//   16    xyz / xy                          1/2         1/1          1/3     0   2/3      1
TEST(Score, MixedFile) {
  vlm::test::TempDir dir("score");
  const std::string pred = dir / "pred.jsonl";
  vlm::test::write_file(pred, join_lines(kLines));
  auto r = score({"--pred", pred, "--out", dir / "summary.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // Each malformed line is reported with its line number and a reason.
  const std::vector<std::pair<int, std::string>> bad = {
      {3, "invalid JSON"},
      {5, "missing field `prediction`"},
      {6, "`prediction` must be a string, got number"},
      {7, "`answers` is an empty list"},
      {8, "`answers`[1] must be a string, got number"},
      {9, "expected a JSON object, got array"},
      {11, "`dataset` must be a string, got number"},
      {13, "missing reference"},
      {14, "`id` must be a string or an integer, got array"},
      {15, "invalid JSON"},
      {17, "`text` must be a string, got null"}};
  for (const auto& [line, reason] : bad)
    EXPECT_NE(r.output.find(pred + ":" + std::to_string(line) + ": skipped: " + reason),
              std::string::npos)
        << "line " << line << "\n" << r.output;
  for (int good : {1, 2, 4, 10, 12, 16})
    EXPECT_EQ(r.output.find(pred + ":" + std::to_string(good) + ":"), std::string::npos) << good;

  const json s = json::parse(vlm::test::read_file(dir / "summary.json"));
  EXPECT_EQ(s.at("lines"), 16);  // 17 minus the blank line
  EXPECT_EQ(s.at("scored"), 5);
  EXPECT_EQ(s.at("skipped"), 11);
  ASSERT_EQ(s.at("malformed").size(), 11u);
  for (size_t k = 0; k < bad.size(); ++k) EXPECT_EQ(s["malformed"][k].at("line"), bad[k].first);
  EXPECT_EQ(s.at("metrics"), json({"cer", "wer", "ned", "em", "anls", "ocrbench"}));
  EXPECT_EQ(s.at("normalization"), json({{"nfc", true}, {"case_sensitive", true},
                                         {"strip_punctuation", false},
                                         {"collapse_whitespace", true}}));

  const json& o = s.at("overall");
  EXPECT_EQ(o.at("n"), 5);
  EXPECT_EQ(o.at("skipped"), 11);
  EXPECT_EQ(o.at("char_edits"), 1 + 3 + 2 + 5 + 1);
  EXPECT_EQ(o.at("ref_chars"), 5 + 11 + 4 + 10 + 2);
  EXPECT_DOUBLE_EQ(o.at("cer").get<double>(), 12.0 / 32);
  EXPECT_DOUBLE_EQ(o.at("wer").get<double>(), 5.0 / 8);
  EXPECT_NEAR(o.at("ned").get<double>(), (0.2 + 3.0 / 14 + 0.5 + 0.5 + 1.0 / 3) / 5, 1e-12);
  EXPECT_DOUBLE_EQ(o.at("em").get<double>(), 0.2);
  EXPECT_NEAR(o.at("anls").get<double>(), (0.8 + 11.0 / 14 + 0.5 + 1 + 2.0 / 3) / 5, 1e-12);
  EXPECT_DOUBLE_EQ(o.at("ocrbench").get<double>(), 0.6);

  const json& ds = s.at("datasets");
  ASSERT_EQ(ds.size(), 3u) << ds.dump();  // pages, vqa, and "(none)" for line 16
  const json& pages = ds.at("pages");
  EXPECT_EQ(pages.at("n"), 2);
  EXPECT_EQ(pages.at("skipped"), 1);  // line 14
  EXPECT_DOUBLE_EQ(pages.at("cer").get<double>(), 4.0 / 16);
  EXPECT_DOUBLE_EQ(pages.at("wer").get<double>(), 2.0 / 4);
  EXPECT_NEAR(pages.at("ned").get<double>(), (0.2 + 3.0 / 14) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(pages.at("em").get<double>(), 0.0);
  EXPECT_NEAR(pages.at("anls").get<double>(), (0.8 + 11.0 / 14) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(pages.at("ocrbench").get<double>(), 0.5);
  const json& vqa = ds.at("vqa");
  EXPECT_EQ(vqa.at("n"), 2);
  EXPECT_EQ(vqa.at("skipped"), 1);  // line 5
  EXPECT_DOUBLE_EQ(vqa.at("cer").get<double>(), 7.0 / 14);
  EXPECT_DOUBLE_EQ(vqa.at("wer").get<double>(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(vqa.at("ned").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(vqa.at("em").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(vqa.at("anls").get<double>(), 0.75);  // 0.5 (the edge is kept) and 1
  EXPECT_DOUBLE_EQ(vqa.at("ocrbench").get<double>(), 0.5);
  const json& none = ds.at("(none)");
  EXPECT_EQ(none.at("n"), 1);
  EXPECT_DOUBLE_EQ(none.at("cer").get<double>(), 0.5);

  // The table has one row per dataset and the overall row.
  EXPECT_NE(r.output.find("pages"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("overall"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0.3750"), std::string::npos) << "overall CER\n" << r.output;
}

TEST(Score, MetricSubsetAndNormalisationFlags) {
  vlm::test::TempDir dir("score");
  const std::string pred = dir / "pred.jsonl";
  // Case-insensitive + punctuation stripped: "Hello, World!" == "hello world".
  vlm::test::write_file(pred, join_lines({R"({"prediction": "Hello, World!", "answers": ["hello world"]})",
                                        R"({"prediction": "ABC", "text": "abd"})"}));
  auto r = score({"--pred", pred, "--metrics", "em,cer", "--case-insensitive",
                  "--strip-punctuation", "--no-nfc", "--keep-whitespace", "--out",
                  dir / "s.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json s = json::parse(vlm::test::read_file(dir / "s.json"));
  EXPECT_EQ(s.at("metrics"), json({"em", "cer"}));
  EXPECT_EQ(s.at("normalization"), json({{"nfc", false}, {"case_sensitive", false},
                                         {"strip_punctuation", true},
                                         {"collapse_whitespace", false}}));
  const json& o = s.at("overall");
  EXPECT_DOUBLE_EQ(o.at("em").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(o.at("cer").get<double>(), 1.0 / 14);  // 0 of 11, then abc/abd 1 of 3
  EXPECT_FALSE(o.contains("anls"));
  EXPECT_FALSE(o.contains("wer"));
  EXPECT_TRUE(s.at("datasets").empty());  // no line names a dataset

  // Default options keep the case: no exact match at all.
  r = score({"--pred", pred, "--metrics", "em", "--out", dir / "d.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_DOUBLE_EQ(json::parse(vlm::test::read_file(dir / "d.json"))["overall"]["em"].get<double>(), 0.0);
}

TEST(Score, ManyMalformedLinesAreCountedButNotAllPrinted) {
  vlm::test::TempDir dir("score");
  const std::string pred = dir / "pred.jsonl";
  std::vector<std::string> lines(30, R"({"prediction": "x"})");
  lines.push_back(R"({"prediction": "a", "text": "a"})");
  vlm::test::write_file(pred, join_lines(lines));
  auto r = score({"--pred", pred, "--out", dir / "s.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(pred + ":20: skipped"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(pred + ":21: skipped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("10 more malformed lines not shown (30 skipped in all)"),
            std::string::npos) << r.output;
  const json s = json::parse(vlm::test::read_file(dir / "s.json"));
  EXPECT_EQ(s.at("skipped"), 30);
  EXPECT_EQ(s.at("scored"), 1);
  EXPECT_DOUBLE_EQ(s["overall"]["cer"].get<double>(), 0.0);
}

TEST(Score, Errors) {
  vlm::test::TempDir dir("score");
  const std::string pred = dir / "pred.jsonl";
  vlm::test::write_file(pred, join_lines({"not json", R"({"text": "a"})", ""}));
  auto r = score({"--pred", pred});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no scorable line"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(pred + ":1: skipped: invalid JSON"), std::string::npos) << r.output;

  r = score({"--pred", dir / "missing.jsonl"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot open"), std::string::npos) << r.output;

  vlm::test::write_file(pred, R"({"prediction": "a", "text": "a"})" "\n");
  r = score({"--pred", pred, "--metrics", "cer,bleu"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'bleu'"), std::string::npos) << r.output;

  r = score({});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--pred"), std::string::npos) << r.output;

  r = score({"--pred", pred, "--unknown-flag"});
  EXPECT_NE(r.exit_code, 0) << r.output;
}

}  // namespace

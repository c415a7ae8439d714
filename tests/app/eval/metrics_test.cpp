// app/metrics: hand-computed edit distances (code points, not bytes), normalisation
// options, every metric on small cases (the ANLS 0.5 edge included), and a property test
// against a straightforward full-matrix Levenshtein written here.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <sstream>

#include "app/eval/metrics.h"
#include "vlm/runtime/check.h"

namespace {

using vlm::app::edit_distance;
using vlm::app::normalize;
using vlm::app::Normalization;
using vlm::app::Scorer;
using vlm::app::ScoreOptions;
using vlm::app::to_code_points;

// Independent reference: the textbook (n+1) x (m+1) matrix.
template <class Seq>
size_t full_matrix_levenshtein(const Seq& a, const Seq& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j)
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
  return d[a.size()][b.size()];
}

size_t ed(const std::string& a, const std::string& b) {
  return edit_distance(to_code_points(a), to_code_points(b));
}

std::string norm(const std::string& s, Normalization n = {}) {
  return vlm::app::normalize_utf8(s, n);
}

TEST(EditDistance, HandComputed) {
  EXPECT_EQ(ed("", ""), 0u);
  EXPECT_EQ(ed("", "abc"), 3u);
  EXPECT_EQ(ed("abc", ""), 3u);
  EXPECT_EQ(ed("same text", "same text"), 0u);
  EXPECT_EQ(ed("kitten", "sitting"), 3u);  // 2 substitutions + 1 insertion
  EXPECT_EQ(ed("flaw", "lawn"), 2u);       // delete f, insert n
  EXPECT_EQ(ed("abc", "abxc"), 1u);        // insertion
  EXPECT_EQ(ed("abxc", "abc"), 1u);        // deletion
  EXPECT_EQ(ed("abcdef", "azcdyf"), 2u);   // 2 substitutions
  EXPECT_EQ(ed("ab", "ba"), 2u);           // no transpositions in Levenshtein
}

TEST(EditDistance, CodePointsNotBytes) {
  // 요 (U+C694) and 여 (U+C5EC) differ in two of their three UTF-8 bytes.
  EXPECT_EQ(ed("안녕하세요", "안녕하세여"), 1u);
  EXPECT_EQ(ed("안녕하세요", "안녕"), 3u);
  EXPECT_EQ(ed("東京都", "京都"), 1u);
  EXPECT_EQ(ed("中文识别", "中文辨识"), 2u);
  EXPECT_EQ(ed("日本語テキスト", "日本語のテキスト"), 1u);
  EXPECT_EQ(ed("😀", "a"), 1u);              // 4 bytes vs 1
  EXPECT_EQ(ed("👍🏽ok", "👍ok"), 1u);          // the skin-tone modifier is its own code point
  EXPECT_EQ(ed("a😀b", "a😃b"), 1u);
  EXPECT_EQ(to_code_points("안녕하세요").size(), 5u);
  EXPECT_EQ(to_code_points("👍🏽").size(), 2u);
}

TEST(EditDistance, WordLevel) {
  auto words = [](const std::string& s) { return vlm::app::split_words(to_code_points(s)); };
  EXPECT_EQ(words("  the cat \t sat\n").size(), 3u);
  EXPECT_EQ(words("a\u3000b\u00a0c").size(), 3u);  // ideographic space, no-break space
  EXPECT_TRUE(words(" \n\t ").empty());
  EXPECT_EQ(vlm::app::word_edit_distance(words("the cat sat"), words("the  cat sit on")), 2u);
  EXPECT_EQ(vlm::app::word_edit_distance(words(""), words("one two")), 2u);
  EXPECT_EQ(vlm::app::word_edit_distance(words("나는 학생 입니다"), words("나는 학생입니다")), 2u);
}

TEST(EditDistance, InvalidUtf8Throws) {
  EXPECT_THROW(to_code_points("ab\xff"), vlm::Error);
  EXPECT_THROW(normalize("\xc3", Normalization{}), vlm::Error);
  Scorer s;
  EXPECT_THROW(s.add("ok", {"bad \xed\xa0\x80 surrogate"}), vlm::Error);
  EXPECT_THROW(s.add("ok", {}), vlm::Error);  // no reference
}

TEST(Normalization, Defaults) {
  Normalization d;
  EXPECT_TRUE(d.nfc);
  EXPECT_TRUE(d.case_sensitive);
  EXPECT_FALSE(d.strip_punctuation);
  EXPECT_TRUE(d.collapse_whitespace);
  EXPECT_EQ(norm("  Hello, \t\n World!  "), "Hello, World!");
  EXPECT_EQ(norm("a\u3000\u3000b\u00a0c\u2028d"), "a b c d");
  EXPECT_EQ(norm(" \n "), "");
  // NFC: e + combining acute -> é (one code point).
  EXPECT_EQ(norm("caf\x65\xcc\x81"), "caf\xc3\xa9");
  EXPECT_EQ(normalize("\xe1\x84\x8b\xe1\x85\xa1\xe1\x86\xab", d).size(), 1u);  // 안 from jamo
}

TEST(Normalization, Options) {
  Normalization n;
  n.nfc = false;
  EXPECT_EQ(norm("caf\x65\xcc\x81", n), "caf\x65\xcc\x81");
  EXPECT_EQ(normalize("\x65\xcc\x81", n).size(), 2u);

  n = {};
  n.case_sensitive = false;
  EXPECT_EQ(norm("ABC Déjà ΣΑΣ", n), "abc déjà σασ");

  n = {};
  n.strip_punctuation = true;
  // , ! « » — 。 「 」 _ are punctuation (P*); $ + are symbols (S*) and stay. The removed
  // em dash leaves two spaces, which the whitespace step collapses.
  EXPECT_EQ(norm("Hello, world! «ok» — 你好。「引用」 snake_case $5+1", n),
            "Hello world ok 你好引用 snakecase $5+1");

  n = {};
  n.collapse_whitespace = false;
  EXPECT_EQ(norm("  a  b\n", n), "  a  b\n");

  EXPECT_EQ(Normalization{}.to_json(),
            (nlohmann::json{{"nfc", true}, {"case_sensitive", true},
                             {"strip_punctuation", false}, {"collapse_whitespace", true}}));
}

TEST(Metrics, ParseList) {
  EXPECT_EQ(vlm::app::parse_metric_list("cer, wer,anls"),
            (std::vector<std::string>{"cer", "wer", "anls"}));
  EXPECT_EQ(vlm::app::parse_metric_list("ocrbench"), std::vector<std::string>{"ocrbench"});
  EXPECT_THROW(vlm::app::parse_metric_list("cer,bleu"), vlm::Error);
  EXPECT_THROW(vlm::app::parse_metric_list("cer,cer"), vlm::Error);
  EXPECT_THROW(vlm::app::parse_metric_list(""), vlm::Error);
  EXPECT_THROW(vlm::app::parse_metric_list("cer,"), vlm::Error);
}

TEST(Metrics, CorpusCerWerNed) {
  Scorer s;
  // 1) "abc" vs "abd": 1 char edit of 3; words: 1 of 1.
  auto a = s.add("abc", {"abd"});
  EXPECT_EQ(a.char_edits, 1u);
  EXPECT_EQ(a.ref_chars, 3u);
  EXPECT_DOUBLE_EQ(a.ned, 1.0 / 3);
  // 2) "" vs "xy": 2 of 2; NED 1.
  auto b = s.add("", {"xy"});
  EXPECT_EQ(b.char_edits, 2u);
  EXPECT_DOUBLE_EQ(b.ned, 1.0);
  // 3) both empty: NED 0, nothing added to the sums.
  auto c = s.add("  ", {"\n"});
  EXPECT_EQ(c.char_edits, 0u);
  EXPECT_DOUBLE_EQ(c.ned, 0.0);
  // 4) whitespace runs normalised: "the  cat sit on" vs "the cat sat" -> "the cat sit on"
  //    (14) vs "the cat sat" (11): a->i + " on" = 4 chars; sat->sit + on = 2 words of 3.
  auto d = s.add("the  cat sit on", {"the cat\tsat", "ignored second answer"});
  EXPECT_EQ(d.char_edits, 4u);
  EXPECT_EQ(d.ref_chars, 11u);
  EXPECT_EQ(d.pred_chars, 14u);
  EXPECT_EQ(d.word_edits, 2u);
  EXPECT_EQ(d.ref_words, 3u);
  EXPECT_DOUBLE_EQ(d.ned, 4.0 / 14);
  // 5) Korean: one syllable of five.
  auto e = s.add("안녕하세여", {"안녕하세요"});
  EXPECT_EQ(e.char_edits, 1u);
  EXPECT_EQ(e.ref_chars, 5u);

  const auto sum = s.summary();
  EXPECT_EQ(sum.n, 5u);
  ASSERT_TRUE(sum.cer.has_value());
  EXPECT_DOUBLE_EQ(*sum.cer, (1.0 + 2 + 0 + 4 + 1) / (3 + 2 + 0 + 11 + 5));
  ASSERT_TRUE(sum.wer.has_value());
  // words: abd/abc 1 of 1, xy/"" 1 of 1, empty 0 of 0, 2 of 3, 안녕하세요 1 of 1
  EXPECT_DOUBLE_EQ(*sum.wer, (1.0 + 1 + 0 + 2 + 1) / (1 + 1 + 0 + 3 + 1));
  EXPECT_DOUBLE_EQ(sum.ned, (1.0 / 3 + 1 + 0 + 4.0 / 14 + 1.0 / 5) / 5);

  // keep-whitespace: characters count the runs, words still split on them.
  ScoreOptions ko;
  ko.norm.collapse_whitespace = false;
  Scorer k(ko);
  auto kw = k.add("the  cat sit on", {"the cat\tsat"});
  EXPECT_EQ(kw.ref_chars, 11u);
  EXPECT_EQ(kw.pred_chars, 15u);
  EXPECT_EQ(kw.char_edits, 6u);  // +1 space, \t->' ', a->i, + " on"
  EXPECT_EQ(kw.word_edits, 2u);
}

TEST(Metrics, CerUndefinedWithoutReferenceText) {
  Scorer s;
  s.add("abc", {""});
  const auto sum = s.summary();
  EXPECT_FALSE(sum.cer.has_value());
  EXPECT_FALSE(sum.wer.has_value());
  EXPECT_DOUBLE_EQ(sum.ned, 1.0);
  const auto j = vlm::app::summary_json(sum, s.options());
  EXPECT_TRUE(j.at("cer").is_null());
  EXPECT_EQ(j.at("char_edits"), 3);
}

TEST(Metrics, AnlsThresholdEdge) {
  Scorer s;
  EXPECT_DOUBLE_EQ(s.score("hello   WORLD", {"Hello World"}).anls, 1.0);  // lower + collapse
  EXPECT_DOUBLE_EQ(s.score("abcd", {"abef"}).anls, 0.5);      // NL = 2/4: s = 0.5 is kept
  EXPECT_DOUBLE_EQ(s.score("abcdef", {"abcxyz"}).anls, 0.5);  // NL = 3/6
  EXPECT_DOUBLE_EQ(s.score("abc", {"axy"}).anls, 0.0);        // NL = 2/3: s = 1/3 < 0.5
  EXPECT_DOUBLE_EQ(s.score("abcde", {"abxyz"}).anls, 0.0);    // s = 0.4
  EXPECT_DOUBLE_EQ(s.score("abcde", {"abcxy"}).anls, 0.6);    // NL = 2/5
  EXPECT_DOUBLE_EQ(s.score("abcd", {"zzzz", "abcx", "wxyz"}).anls, 0.75);  // best answer
  EXPECT_DOUBLE_EQ(s.score("", {""}).anls, 1.0);
  EXPECT_DOUBLE_EQ(s.score("", {"a"}).anls, 0.0);
  EXPECT_DOUBLE_EQ(s.score("서울특별시", {"서울특별시청"}).anls, 1.0 - 1.0 / 6);

  Scorer t;
  t.add("abcd", {"abef"});   // 0.5
  t.add("abc", {"axy"});     // 0
  t.add("same", {"SAME"});   // 1
  EXPECT_DOUBLE_EQ(t.summary().anls, 1.5 / 3);
}

TEST(Metrics, ExactMatch) {
  Scorer s;
  EXPECT_TRUE(s.score("Seoul", {"Busan", " Seoul\n"}).exact);
  EXPECT_FALSE(s.score("seoul", {"Seoul"}).exact);  // case-sensitive by default
  EXPECT_TRUE(s.score("caf\x65\xcc\x81", {"caf\xc3\xa9"}).exact);  // NFC
  EXPECT_FALSE(s.score("Seoul.", {"Seoul"}).exact);
  EXPECT_TRUE(s.score("", {""}).exact);

  ScoreOptions o;
  o.norm.case_sensitive = false;
  o.norm.strip_punctuation = true;
  Scorer ci(o);
  EXPECT_TRUE(ci.score("seoul", {"Seoul"}).exact);
  EXPECT_TRUE(ci.score("Seoul.", {"Seoul"}).exact);

  o = {};
  o.norm.nfc = false;
  EXPECT_FALSE(Scorer(o).score("caf\x65\xcc\x81", {"caf\xc3\xa9"}).exact);

  Scorer t;
  t.add("a", {"a"});
  t.add("b", {"c", "b"});
  t.add("x", {"y"});
  t.add("z", {"Z"});
  EXPECT_DOUBLE_EQ(t.summary().em, 0.5);
}

TEST(Metrics, OcrBench) {
  Scorer s;
  EXPECT_TRUE(s.score("The total is $12.50\nThanks", {"$12.50"}).ocrbench);
  EXPECT_TRUE(s.score("The total is $12.50\nThanks", {"TOTAL IS"}).ocrbench);
  EXPECT_TRUE(s.score("The total is $12.50\nThanks", {"nope", "is $12.50 thanks"}).ocrbench);
  EXPECT_FALSE(s.score("The total is $12.50", {"$12.5O"}).ocrbench);
  EXPECT_FALSE(s.score("abc", {"abcd"}).ocrbench);
  EXPECT_TRUE(s.score("대한민국 서울", {"서울"}).ocrbench);

  ScoreOptions o;
  o.norm.collapse_whitespace = false;
  Scorer k(o);
  EXPECT_TRUE(k.score("a\nb", {" a b "}).ocrbench);  // ends stripped, newline -> space
  EXPECT_FALSE(k.score("a\n\nb", {"a b"}).ocrbench);  // two spaces stay two

  Scorer t;
  t.add("x 42 y", {"42"});
  t.add("x 41 y", {"42"});
  t.add("HELLO", {"hell"});
  EXPECT_DOUBLE_EQ(t.summary().ocrbench, 2.0 / 3);
}

TEST(Metrics, SelectedMetricsOnly) {
  ScoreOptions o;
  o.metrics = {"em", "anls"};
  Scorer s(o);
  auto r = s.add("abcd", {"abef"});
  EXPECT_EQ(r.char_edits, 0u);  // cer/ned not computed
  EXPECT_DOUBLE_EQ(r.anls, 0.5);
  const auto j = vlm::app::summary_json(s.summary(), s.options());
  EXPECT_EQ(j, (nlohmann::json{{"n", 1}, {"em", 0.0}, {"anls", 0.5}}));
  ScoreOptions bad;
  bad.metrics = {"bleu"};
  EXPECT_THROW(Scorer{bad}, vlm::Error);
}

// ---------------------------------------------------------------- property tests

TEST(EditDistance, MatchesFullMatrixOnRandomStrings) {
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "A", "é", "e\xcc\x81", "안",
                                             "녕", "中", "文", "😀", "👍🏽", "\n"};
  std::mt19937 rng(12345);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> len(0, 40);
  auto random_text = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += alphabet[pick(rng)];
    return s;
  };
  for (int trial = 0; trial < 400; ++trial) {
    std::string a = random_text(len(rng));
    // Half the pairs are mutations of `a`, so prefix/suffix trimming gets exercised.
    std::string b = trial % 2 ? random_text(len(rng)) : a;
    if (trial % 2 == 0) {
      std::u32string cb = to_code_points(b);
      for (int k = len(rng) % 5; k >= 0 && !cb.empty(); --k) cb[rng() % cb.size()] = U'x';
      if (trial % 4 == 0) cb.insert(cb.begin() + rng() % (cb.size() + 1), U'中');
      b = vlm::app::to_utf8(cb);
    }
    const std::u32string ca = to_code_points(a), cb = to_code_points(b);
    const size_t want = full_matrix_levenshtein(ca, cb);
    EXPECT_EQ(edit_distance(ca, cb), want) << a << " | " << b;
    EXPECT_EQ(edit_distance(cb, ca), want) << "symmetry: " << a << " | " << b;
  }
}

TEST(EditDistance, WordLevelMatchesFullMatrix) {
  const std::vector<std::u32string> vocab = {U"the", U"cat", U"고양이", U"猫", U"😀", U"a"};
  std::mt19937 rng(777);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::u32string> a, b;
    for (int i = static_cast<int>(rng() % 15); i > 0; --i) a.push_back(vocab[rng() % vocab.size()]);
    for (int i = static_cast<int>(rng() % 15); i > 0; --i) b.push_back(vocab[rng() % vocab.size()]);
    EXPECT_EQ(vlm::app::word_edit_distance(a, b), full_matrix_levenshtein(a, b));
  }
}

// The whole Scorer against the definitions written out plainly, on random ASCII samples
// (where NFC and Unicode case mapping are the identity / std::tolower).
TEST(Metrics, ScorerMatchesPlainDefinitionsOnRandomSamples) {
  auto collapse = [](const std::string& s) {  // Python: " ".join(s.split())
    std::istringstream in(s);
    std::string w, out;
    while (in >> w) out += (out.empty() ? "" : " ") + w;
    return out;
  };
  auto words = [](const std::string& s) {
    std::istringstream in(s);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
  };
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string alphabet = "aabbcAB  \n\t";
  std::mt19937 rng(4242);
  auto text = [&]() {
    std::string s;
    for (int i = static_cast<int>(rng() % 9); i > 0; --i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  Scorer scorer;
  double char_e = 0, char_n = 0, word_e = 0, word_n = 0, ned = 0, em = 0, anls = 0, ocr = 0;
  const int n = 300;
  for (int k = 0; k < n; ++k) {
    const std::string pred = text();
    std::vector<std::string> refs(1 + rng() % 3);
    for (auto& r : refs) r = text();
    if (rng() % 4 == 0) refs.back() = pred;  // some exact matches

    const std::string p = collapse(pred), r0 = collapse(refs[0]);
    const size_t e = full_matrix_levenshtein(p, r0);
    char_e += e;
    char_n += r0.size();
    word_e += full_matrix_levenshtein(words(p), words(r0));
    word_n += words(r0).size();
    ned += std::max(p.size(), r0.size()) == 0 ? 0.0 : double(e) / std::max(p.size(), r0.size());
    double min_nl = 1e9;
    bool exact = false, found = false;
    for (const auto& r : refs) {
      const std::string a = lower(collapse(r)), lp = lower(p);
      const size_t len = std::max(a.size(), lp.size());
      min_nl = std::min(min_nl, len == 0 ? 0.0 : double(full_matrix_levenshtein(a, lp)) / len);
      exact = exact || collapse(r) == p;
      found = found || lp.find(a) != std::string::npos;
    }
    const double s = 1.0 - min_nl;
    anls += s < 0.5 ? 0.0 : s;
    em += exact;
    ocr += found;
    scorer.add(pred, refs);
  }
  const auto sum = scorer.summary();
  ASSERT_TRUE(sum.cer && sum.wer);
  EXPECT_NEAR(*sum.cer, char_e / char_n, 1e-12);
  EXPECT_NEAR(*sum.wer, word_e / word_n, 1e-12);
  EXPECT_NEAR(sum.ned, ned / n, 1e-12);
  EXPECT_NEAR(sum.em, em / n, 1e-12);
  EXPECT_NEAR(sum.anls, anls / n, 1e-12);
  EXPECT_NEAR(sum.ocrbench, ocr / n, 1e-12);
  EXPECT_GT(sum.em, 0.1);  // the generator does produce matches and misses
  EXPECT_LT(sum.em, 0.9);
}

// Page-length texts: a few thousand code points each, in the worst case for the trimming
// (nothing in common at the ends). Prints the time; the bound only catches a blow-up.

}  // namespace

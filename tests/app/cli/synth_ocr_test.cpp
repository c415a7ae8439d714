// `vlmtrain synth-ocr`: identical output for the same seed (whatever the thread count),
// different output for another seed, the dataset loads as plain OCR, and the
// sentencepiece model loads, keeps the ChatML specials whole and round-trips every text.
// The model is checked with the spm_encode / spm_decode CLIs as an independent reference,
// and with vlm::load_tokenizer (the dlopen()ed backend vlmtrain uses).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "data/dataset.h"
#include "data/synth_ocr.h"
#include "tests/require_sentencepiece.h"
#include "tests/testing.h"
#include "vlm/text/chat_template.h"
#include "vlm/text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::vector<std::string> relative_files(const std::string& root) {
  std::vector<std::string> out;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), root).string());
  std::sort(out.begin(), out.end());
  return out;
}

vlm::test::RunResult synth(const std::string& out, const std::string& seed, const std::string& threads) {
  return vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--out", out, "--train", "40",
                       "--val", "8", "--seed", seed, "--threads", threads},
                      std::chrono::seconds(240));
}

TEST(SynthOcr, DeterministicAndLoadable) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();  // synth-ocr trains a sentencepiece tokenizer
  vlm::test::TempDir dir("synth");
  auto r1 = synth(dir / "a", "3", "1");
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = synth(dir / "b", "3", "3");
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  auto r3 = synth(dir / "c", "4", "2");
  ASSERT_EQ(r3.exit_code, 0) << r3.output;

  auto files = relative_files(dir / "a");
  EXPECT_EQ(files, relative_files(dir / "b"));
  EXPECT_EQ(files.size(), 40u + 8u + 6u);  // pngs + 2 jsonl + model + vocab + corpus + meta
  for (const std::string& f : files)
    EXPECT_TRUE(vlm::test::read_file(dir / "a/" + f) == vlm::test::read_file(dir / "b/" + f)) << f;
  EXPECT_TRUE(vlm::test::read_file(dir / "a/train.jsonl") != vlm::test::read_file(dir / "c/train.jsonl"));

  vlm::data::DatasetOptions opts;
  opts.warn = [](const std::string&) {};
  vlm::data::Dataset train = vlm::data::load_dataset({dir / "a/train.jsonl"}, opts);
  vlm::data::Dataset val = vlm::data::load_dataset({dir / "a/val.jsonl"}, opts);
  ASSERT_EQ(train.records.size(), 40u);
  ASSERT_EQ(val.records.size(), 8u);
  EXPECT_TRUE(train.bad.empty());
  std::vector<std::string> texts;
  for (const auto& rec : train.records) {
    EXPECT_EQ(rec.format, vlm::data::DatasetFormat::kPlainOcr);
    ASSERT_EQ(rec.images.size(), 1u);
    EXPECT_GE(rec.images[0].height, 28);
    EXPECT_LE(rec.images[0].height, 56);
    const std::string& t = rec.turns[1].content;
    EXPECT_GE(t.size(), 4u);
    EXPECT_LE(t.size(), 16u);
    texts.push_back(t);
  }

  const std::string model = dir / "a/tokenizer.model";
  const std::string vocab = vlm::test::read_file(dir / "a/tokenizer.vocab");
  const auto pieces = std::count(vocab.begin(), vocab.end(), '\n');
  EXPECT_GT(pieces, 256 + 8 + 3) << "more than the byte pieces and specials";
  EXPECT_LE(pieces, 2048);
  EXPECT_NE(r1.output.find("with " + std::to_string(pieces) + " pieces"), std::string::npos)
      << r1.output;
  // Specials stay single pieces.
  std::string special_lines;
  for (const std::string& s : vlm::data::chatml_special_tokens()) special_lines += "a" + s + "b\n";
  vlm::test::write_file(dir / "specials.txt", special_lines);
  auto enc = vlm::test::run({"spm_encode", "--model=" + model, "--output_format=piece",
                           "--output=" + dir / "specials.pieces", dir / "specials.txt"});
  ASSERT_EQ(enc.exit_code, 0) << enc.output;
  const std::string special_pieces = vlm::test::read_file(dir / "specials.pieces");
  for (const std::string& s : vlm::data::chatml_special_tokens())
    EXPECT_NE(special_pieces.find(" " + s + " "), std::string::npos) << s << "\n" << special_pieces;
  // Every training text encodes without <unk> (id 0) and decodes back exactly.
  std::string all;
  for (const std::string& t : texts) all += t + "\n";
  vlm::test::write_file(dir / "texts.txt", all);
  enc = vlm::test::run({"spm_encode", "--model=" + model, "--output_format=id",
                      "--output=" + dir / "texts.ids", dir / "texts.txt"});
  ASSERT_EQ(enc.exit_code, 0) << enc.output;
  const std::string ids = vlm::test::read_file(dir / "texts.ids");
  std::istringstream lines(ids);
  std::string line;
  int64_t n_lines = 0;
  while (std::getline(lines, line)) {
    ++n_lines;
    std::istringstream toks(line);
    int id;
    while (toks >> id) EXPECT_NE(id, 0) << "unk in line " << n_lines << ": " << line;
  }
  EXPECT_EQ(n_lines, int64_t(texts.size()));
  auto dec = vlm::test::run({"spm_decode", "--model=" + model, "--input_format=id",
                           "--output=" + dir / "texts.back", dir / "texts.ids"});
  ASSERT_EQ(dec.exit_code, 0) << dec.output;
  EXPECT_EQ(vlm::test::read_file(dir / "texts.back"), all);
  // The in-process backend loads the same model and agrees with spm_encode; the chat
  // renderer works with it (no dummy prefix, so byte offsets are exact).
  auto tok = vlm::load_tokenizer(model);
  std::istringstream id_lines(ids);
  for (const std::string& t : texts) {
    std::getline(id_lines, line);
    std::istringstream toks(line);
    std::vector<int64_t> want;
    for (int64_t id; toks >> id;) want.push_back(id);
    EXPECT_EQ(tok->encode(t), want) << t;
  }
  vlm::RenderedChat rc = vlm::render_chat(
      *tok, {{"user", {vlm::ChatItem::Image(), vlm::ChatItem::Text("Read.")}},
             {"assistant", {vlm::ChatItem::Text(texts[0])}}},
      {3});
  EXPECT_EQ(std::count(rc.input_ids.begin(), rc.input_ids.end(), tok->special_id("<|image_pad|>")), 3);
  EXPECT_GT(std::count_if(rc.labels.begin(), rc.labels.end(), [](int64_t l) { return l >= 0; }), 0);
}

TEST(SynthOcr, TextsStayInRange) {
  for (uint64_t s = 0; s < 2000; ++s) {
    std::string t = vlm::data::synth_text(s);
    ASSERT_GE(t.size(), 4u) << t;
    ASSERT_LE(t.size(), 16u) << t;
    for (char c : t) ASSERT_TRUE(c >= 32 && c < 127) << t;
  }
  EXPECT_EQ(vlm::data::synth_text(11), vlm::data::synth_text(11));
}

// Stroke width of the ink in an image: Otsu-binarise, take the minority class as ink,
// width ~= 2 * ink area / ink perimeter (a long stroke of width w has area w*L and
// perimeter ~2L). Anti-aliasing and binarisation inflate it: putText strokes of 1/2/3 px
// measure about 1.9/4.0/5.9 on these lines.
double stroke_width(const cv::Mat& img) {
  cv::Mat grey, ink;
  cv::cvtColor(img, grey, cv::COLOR_BGR2GRAY);
  cv::threshold(grey, ink, 0, 255, cv::THRESH_BINARY | cv::THRESH_OTSU);
  if (cv::countNonZero(ink) > int(ink.total() / 2)) cv::bitwise_not(ink, ink);
  std::vector<std::vector<cv::Point>> contours;
  cv::findContours(ink.clone(), contours, cv::RETR_LIST, cv::CHAIN_APPROX_NONE);
  double perimeter = 0;
  for (const auto& c : contours) perimeter += cv::arcLength(c, true);
  return 2.0 * cv::countNonZero(ink) / std::max(1.0, perimeter);
}

// Both layouts draw strokes of 2 px or more (the tiny preset learns nothing from 1-px
// hairlines; docs/notes/tiny_convergence.md). The control, the same texts drawn by putText at
// 1 px, shows the measure separates the two.
TEST(SynthOcr, StrokesAreAtLeastTwoPixels) {
  std::vector<double> hairline, proportional, grid;
  for (uint64_t s = 0; s < 40; ++s) {
    const std::string t = vlm::data::synth_text(s);
    cv::Mat ref(40, 400, CV_8UC3, cv::Scalar(230, 230, 230));
    cv::putText(ref, t, cv::Point(5, 30), cv::FONT_HERSHEY_SIMPLEX + int(s % 4), 0.6 + 0.02 * double(s),
                cv::Scalar(20, 20, 20), 1, cv::LINE_AA);
    hairline.push_back(stroke_width(ref));
    proportional.push_back(stroke_width(vlm::data::render_text_line(t, s)));
    grid.push_back(stroke_width(vlm::data::render_grid_line(t, s, 28, 17, 56)));
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  EXPECT_LT(median(hairline), 2.5);
  EXPECT_GT(*std::min_element(proportional.begin(), proportional.end()), 2.8);
  EXPECT_GT(*std::min_element(grid.begin(), grid.end()), 2.8);
}

// Grid layout: character i is drawn in cell i and nowhere else. Independent check on the
// pixels: a cell's central half holds ink (contrast > 60 grey levels against the image
// median) exactly when its character is not a space; the canvas is (cells x cell) wide.
TEST(SynthOcr, GridPutsCharacterIInCellI) {
  const int64_t cell = 28, cells = 17, height = 56;
  for (uint64_t s = 0; s < 60; ++s) {
    const std::string t = vlm::data::synth_text(s);
    cv::Mat img = vlm::data::render_grid_line(t, s, cell, cells, height);
    ASSERT_EQ(img.rows, height);
    ASSERT_EQ(img.cols, cells * cell);
    cv::Mat grey;
    cv::cvtColor(img, grey, cv::COLOR_BGR2GRAY);
    std::vector<uint8_t> v(grey.begin<uint8_t>(), grey.end<uint8_t>());
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const int median = v[v.size() / 2];
    for (int64_t c = 0; c < cells; ++c) {
      const cv::Mat mid = grey(cv::Rect(int(c * cell + cell / 4), 0, int(cell / 2), int(height)));
      double lo = 0, hi = 0;
      cv::minMaxLoc(mid, &lo, &hi);
      const bool ink = std::max(std::abs(hi - median), std::abs(lo - median)) > 60;
      const bool want = c < int64_t(t.size()) && t[size_t(c)] != ' ';
      EXPECT_EQ(ink, want) << "seed " << s << " text '" << t << "' cell " << c;
    }
  }
}

// `--layout grid --tokenizer-type char`: fixed-size canvases, and the char model gives
// exactly one token per character of every text (checked with the in-process backend).
TEST(SynthOcr, GridLayoutWithCharTokenizer) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();
  vlm::test::TempDir dir("synth_grid");
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--out", dir / "g", "--train", "24",
                         "--val", "4", "--layout", "grid", "--tokenizer-type", "char",
                         "--max-height", "56", "--threads", "2"},
                        std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  vlm::data::DatasetOptions opts;
  opts.warn = [](const std::string&) {};
  vlm::data::Dataset train = vlm::data::load_dataset({dir / "g/train.jsonl"}, opts);
  ASSERT_EQ(train.records.size(), 24u);
  auto tok = vlm::load_tokenizer(dir / "g/tokenizer.model");
  for (const auto& rec : train.records) {
    ASSERT_EQ(rec.images.size(), 1u);
    EXPECT_EQ(rec.images[0].height, 56);
    EXPECT_EQ(rec.images[0].width, 17 * 28);
    const std::string& t = rec.turns[1].content;
    EXPECT_EQ(tok->encode(t).size(), t.size()) << t;
  }
  auto bad = vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--out", dir / "x", "--layout", "diagonal"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("layout 'diagonal'"), std::string::npos) << bad.output;
}

// synth_ocr_refresh_reason: a trainer with data.synth.generate_if_missing re-renders a
// cached set exactly when it is missing, was rendered with other options or by an older
// renderer; a folder synth-ocr did not write (no synth_ocr.json) is left alone.
TEST(SynthOcr, RefreshReasonSpotsMissingStaleAndForeignSets) {
  vlm::test::TempDir dir("synth_refresh");
  vlm::data::SynthOcrOptions o;
  o.out_dir = dir / "s";
  o.train = 6;
  o.val = 2;
  o.train_tokenizer = false;
  EXPECT_NE(vlm::data::synth_ocr_refresh_reason(o).find("train.jsonl is missing"), std::string::npos);
  vlm::data::write_synth_ocr(o);
  EXPECT_EQ(vlm::data::synth_ocr_refresh_reason(o), "");

  vlm::data::SynthOcrOptions more = o;
  more.train = 7;
  EXPECT_NE(vlm::data::synth_ocr_refresh_reason(more).find("train = 6, wanted 7"), std::string::npos)
      << vlm::data::synth_ocr_refresh_reason(more);
  vlm::data::SynthOcrOptions grid = o;
  grid.layout = "grid";
  EXPECT_NE(vlm::data::synth_ocr_refresh_reason(grid), "");  // grid: other layout and heights

  // A set from before renderer versions were recorded (version 1).
  const std::string meta_path = dir / "s/synth_ocr.json";
  std::string meta = vlm::test::read_file(meta_path);
  const size_t at = meta.find("\"renderer_version\"");
  ASSERT_NE(at, std::string::npos) << meta;
  meta.erase(at, meta.find('\n', at) + 1 - at);
  vlm::test::write_file(meta_path, meta);
  EXPECT_NE(vlm::data::synth_ocr_refresh_reason(o).find("renderer version 1"), std::string::npos)
      << vlm::data::synth_ocr_refresh_reason(o);

  vlm::test::write_file(meta_path, "{ not json");
  EXPECT_NE(vlm::data::synth_ocr_refresh_reason(o).find("not valid JSON"), std::string::npos);

  fs::remove(meta_path);  // the user's own data in the same layout: never stale
  EXPECT_EQ(vlm::data::synth_ocr_refresh_reason(more), "");
}

// The trainer side: with data.synth.generate_if_missing, `vlmtrain train` re-renders a set
// that synth-ocr wrote with other settings (here 6 instead of 8 training lines), trains on
// the new one, and leaves a current set alone on the next run.
TEST(SynthOcr, TrainerReRendersAStaleSet) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();
  vlm::test::TempDir dir("synth_trainer");
  const std::string set = dir / "s";
  auto made = vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--out", set, "--train", "6", "--val", "2",
                            "--seed", "1234", "--layout", "grid", "--max-height", "28", "--style", "clean",
                            "--tokenizer-type", "char"},
                           std::chrono::seconds(240));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto train = [&](const std::string& run) {
    std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "train", vlm::test::source_dir() + "/recipes/ocr_tiny.toml"};
    const std::vector<std::string> sets = {
        "run.output_dir=" + dir.path() + "/" + run, "model.tokenizer=" + set + "/tokenizer.model",
        "data.train=[\"" + set + "/train.jsonl\"]", "data.eval=[]", "data.synth.train=8",
        "data.synth.val=2", "batch.samples_per_rank=2", "schedule.steps=1", "schedule.warmup_steps=0",
        "eval.every=0", "eval.at_end=false", "checkpoint.every=0", "checkpoint.save_final=false",
        "data.num_workers=1"};
    for (const std::string& kv : sets)
      argv.insert(argv.end(), {"--set", kv});
    return vlm::test::run(argv, std::chrono::seconds(240));
  };
  auto first = train("run1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("has train = 6, wanted 8: rendering 8 + 2"), std::string::npos) << first.output;
  const nlohmann::json meta = nlohmann::json::parse(vlm::test::read_file(set + "/synth_ocr.json"));
  EXPECT_EQ(meta["train"], 8);
  EXPECT_EQ(meta["renderer_version"], vlm::data::kSynthRendererVersion);
  auto second = train("run2");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.output.find("rendering"), std::string::npos) << second.output;
}

TEST(SynthOcr, BadArguments) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--train", "3"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--out"), std::string::npos) << r.output;
}

}  // namespace

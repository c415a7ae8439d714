// Dataset formats, path resolution, bad-record accounting, the bad-fraction limit and the
// image index cache.
#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>

#include <filesystem>

#include "data/dataset.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"

namespace {

using namespace vlm::data;

void png(const std::string& path, int h, int w) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  ASSERT_TRUE(cv::imwrite(path, cv::Mat(h, w, CV_8UC3, cv::Scalar(10, 200, 30))));
}

DatasetOptions quiet(std::vector<std::string>* warnings = nullptr) {
  DatasetOptions o;
  o.warn = [warnings](const std::string& m) { if (warnings) warnings->push_back(m); };
  return o;
}

TEST(Dataset, ParsesEachFormat) {
  vlm::test::TempDir dir("ds");
  png(dir / "a.png", 20, 30);
  png(dir / "sub/b.png", 40, 10);
  vlm::test::write_file(dir / "messages.jsonl",
      R"({"messages":[{"role":"user","content":"<image>Read the text."},{"role":"assistant","content":"hello"}],"images":["a.png"]})" "\n"
      R"({"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"image"},{"type":"text","text":" and "},{"type":"image"}]},{"role":"assistant","content":"two"}],"images":["a.png","sub/b.png"]})" "\n"
      R"({"messages":[{"role":"user","content":"no image here"},{"role":"assistant","content":"text only"}]})" "\n");
  vlm::test::write_file(dir / "llava.jsonl",
      R"({"image":"sub/b.png","conversations":[{"from":"human","value":"<image>\nWhat?"},{"from":"gpt","value":"ok"}]})" "\n");
  vlm::test::write_file(dir / "plain.jsonl",
      "\n" R"({"image":"a.png","text":"ground truth"})" "\n"
      R"({"image":"a.png","answers":["x","y"]})" "\n");
  Dataset ds = load_dataset({dir / "messages.jsonl", dir / "llava.jsonl", dir / "plain.jsonl"},
                            quiet());
  ASSERT_EQ(ds.records.size(), 6u) << ds.summary();
  EXPECT_TRUE(ds.bad.empty());
  EXPECT_EQ(ds.lines, 6);
  const Record& m0 = ds.records[0];
  EXPECT_EQ(m0.format, DatasetFormat::kMessages);
  ASSERT_EQ(m0.turns.size(), 2u);
  EXPECT_EQ(m0.turns[1].role, "assistant");
  ASSERT_EQ(m0.images.size(), 1u);
  EXPECT_EQ(m0.images[0].width, 30);
  EXPECT_EQ(m0.images[0].height, 20);
  EXPECT_EQ(m0.location(), dir / "messages.jsonl:1");
  const Record& m1 = ds.records[1];
  EXPECT_EQ(m1.turns[1].content, "<image> and <image>");
  ASSERT_EQ(m1.images.size(), 2u);
  EXPECT_EQ(m1.images[1].path, dir / "sub/b.png");
  EXPECT_EQ(m1.images[1].width, 10);
  EXPECT_TRUE(ds.records[2].images.empty());  // text-only
  const Record& l = ds.records[3];
  EXPECT_EQ(l.format, DatasetFormat::kLlava);
  EXPECT_EQ(l.turns[0].role, "user");
  EXPECT_EQ(l.turns[1].content, "ok");
  const Record& p = ds.records[4];
  EXPECT_EQ(p.format, DatasetFormat::kPlainOcr);
  EXPECT_EQ(p.line, 2);  // blank first line is skipped but counted in line numbers
  EXPECT_EQ(p.turns[0].content, "<image>Read the text in the image.");
  EXPECT_EQ(p.turns[1].content, "ground truth");
  EXPECT_EQ(p.answers, std::vector<std::string>{"ground truth"});
  EXPECT_EQ(ds.records[5].turns[1].content, "x");
  EXPECT_EQ(ds.records[5].answers, (std::vector<std::string>{"x", "y"}));
}

TEST(Dataset, ImageRootAndForcedFormat) {
  vlm::test::TempDir dir("ds");
  png(dir / "imgs/a.png", 28, 28);
  vlm::test::write_file(dir / "d.jsonl", R"({"image":"a.png","text":"t"})" "\n");
  DatasetOptions o = quiet();
  o.image_root = dir / "imgs";
  o.format = DatasetFormat::kPlainOcr;
  o.ocr_prompt = "OCR:";  // no marker: one is prepended per image
  Dataset ds = load_dataset({dir / "d.jsonl"}, o);
  ASSERT_EQ(ds.records.size(), 1u);
  EXPECT_EQ(ds.records[0].images[0].path, dir / "imgs/a.png");
  EXPECT_EQ(ds.records[0].turns[0].content, "<image>OCR:");
  EXPECT_THROW(parse_dataset_format("csv"), vlm::Error);
}

TEST(Dataset, EachBadKindIsSkippedAndCounted) {
  vlm::test::TempDir dir("ds");
  png(dir / "ok.png", 30, 40);
  png(dir / "wide.png", 2, 500);    // aspect 250 > 200
  png(dir / "fine_wide.png", 2, 400);  // aspect 200 is allowed
  vlm::test::write_file(dir / "garbage.png", "not a png at all");
  {  // A PNG whose header says width 0.
    std::vector<uint8_t> b;
    ASSERT_TRUE(cv::imencode(".png", cv::Mat(4, 4, CV_8UC3), b));
    b[16] = b[17] = b[18] = b[19] = 0;
    vlm::test::write_file(dir / "zero.png", std::string(b.begin(), b.end()));
  }
  std::string lines;
  auto good = [] { return std::string(R"({"image":"ok.png","text":"fine"})") + "\n"; };
  lines += good();                                                       // 1
  lines += "{not json\n";                                                // 2 invalid json
  lines += R"({"image":"ok.png"})" "\n";                                 // 3 missing field
  lines += R"({"image":"missing.png","text":"x"})" "\n";                 // 4 missing image
  lines += R"({"image":"garbage.png","text":"x"})" "\n";                 // 5 unreadable
  lines += R"({"image":"wide.png","text":"x"})" "\n";                    // 6 aspect
  lines += R"({"image":"fine_wide.png","text":"x"})" "\n";               // 7 ok
  lines += R"({"image":"zero.png","text":"x"})" "\n";                   // 8 zero-size
  vlm::test::write_file(dir / "plain.jsonl", lines);
  vlm::test::write_file(dir / "msg.jsonl",
      R"({"messages":[{"role":"user","content":"<image><image>two?"},{"role":"assistant","content":"a"}],"images":["ok.png"]})" "\n"   // 1 count mismatch
      R"({"messages":[{"role":"robot","content":"x"}]})" "\n"                   // 2 unknown role
      R"({"messages":[{"role":"user","content":"<image>"},{"role":"assistant","content":"a"}],"images":["ok.png"]})" "\n");
  std::vector<std::string> warnings;
  DatasetOptions o = quiet(&warnings);
  o.max_bad_fraction = 1.0;
  o.max_printed_warnings = 3;
  Dataset ds = load_dataset({dir / "plain.jsonl", dir / "msg.jsonl"}, o);
  EXPECT_EQ(ds.lines, 11);
  EXPECT_EQ(ds.records.size(), 3u);
  ASSERT_EQ(ds.bad.size(), 8u);
  auto by = ds.bad_by_reason();
  EXPECT_EQ(by["invalid json"], 1);
  EXPECT_EQ(by["missing field"], 1);
  EXPECT_EQ(by["missing image"], 1);
  EXPECT_EQ(by["unreadable image"], 1);
  EXPECT_EQ(by["extreme aspect ratio"], 1);
  EXPECT_EQ(by["image count mismatch"], 1);
  EXPECT_EQ(by["unknown role"], 1);
  EXPECT_EQ(by["zero-size image"], 1);
  EXPECT_EQ(ds.bad[0].location(), dir / "plain.jsonl:2");
  EXPECT_EQ(ds.bad[6].location(), dir / "msg.jsonl:1");
  // First 3 printed with file:line, a "further ... not printed" note, and the summary.
  ASSERT_EQ(warnings.size(), 5u);
  EXPECT_NE(warnings[0].find("plain.jsonl:2"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("invalid json"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings.back().find("skipped 8"), std::string::npos) << warnings.back();
}

TEST(Dataset, BadFractionLimitRaises) {
  vlm::test::TempDir dir("ds");
  png(dir / "ok.png", 30, 40);
  std::string lines;
  for (int i = 0; i < 99; ++i) lines += R"({"image":"ok.png","text":"fine"})" "\n";
  lines += "{bad\n";
  vlm::test::write_file(dir / "one_bad.jsonl", lines);
  EXPECT_NO_THROW(load_dataset({dir / "one_bad.jsonl"}, quiet()));  // 1/100 <= 0.01
  lines += "{bad\n";
  vlm::test::write_file(dir / "two_bad.jsonl", lines);
  try {
    load_dataset({dir / "two_bad.jsonl"}, quiet());
    ADD_FAILURE() << "expected too many bad records";
  } catch (const vlm::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("max_bad_fraction"), std::string::npos) << msg;
    EXPECT_NE(msg.find("two_bad.jsonl:100"), std::string::npos) << msg;
  }
  vlm::test::write_file(dir / "none.jsonl", "{bad\n");
  DatasetOptions o = quiet();
  o.max_bad_fraction = 1.0;
  EXPECT_THROW(load_dataset({dir / "none.jsonl"}, o), vlm::Error);  // nothing usable
}

TEST(Dataset, VerifyDecodeCatchesCorruptBodies) {
  vlm::test::TempDir dir("ds");
  png(dir / "ok.png", 64, 64);
  std::vector<uint8_t> bytes;
  cv::Mat noise(64, 64, CV_8UC3);
  cv::randu(noise, 0, 255);
  ASSERT_TRUE(cv::imencode(".png", noise, bytes));
  vlm::test::write_file(dir / "cut.png", std::string(bytes.begin(), bytes.begin() + bytes.size() / 2));
  vlm::test::write_file(dir / "d.jsonl", R"({"image":"ok.png","text":"a"})" "\n"
                                       R"({"image":"cut.png","text":"b"})" "\n");
  DatasetOptions o = quiet();
  o.max_bad_fraction = 1.0;
  o.use_index_cache = false;
  EXPECT_EQ(load_dataset({dir / "d.jsonl"}, o).records.size(), 2u);  // header looks fine
  o.verify_decode = true;
  Dataset ds = load_dataset({dir / "d.jsonl"}, o);
  ASSERT_EQ(ds.records.size(), 1u);
  ASSERT_EQ(ds.bad.size(), 1u);
  EXPECT_EQ(ds.bad[0].reason, "unreadable image");
  EXPECT_EQ(ds.bad[0].line, 2);
}

TEST(Dataset, IndexCacheIsWrittenAndUsed) {
  vlm::test::TempDir dir("ds");
  png(dir / "a.png", 20, 30);
  vlm::test::write_file(dir / "d.jsonl", R"({"image":"a.png","text":"t"})" "\n");
  Dataset first = load_dataset({dir / "d.jsonl"}, quiet());
  ASSERT_TRUE(vlm::test::file_exists(dir / "d.jsonl.index.json"));
  // Replace the image behind the cache's back: a cache hit still reports the old size.
  png(dir / "a.png", 50, 60);
  Dataset cached = load_dataset({dir / "d.jsonl"}, quiet());
  EXPECT_EQ(cached.records[0].images[0].width, 30);
  DatasetOptions o = quiet();
  o.use_index_cache = false;
  Dataset fresh = load_dataset({dir / "d.jsonl"}, o);
  EXPECT_EQ(fresh.records[0].images[0].width, 60);
}

// Regression test from tests/fuzz/jsonl_record_fuzz.cpp: a line with an out-of-range number
// ("3333333e33333333333") made nlohmann throw out_of_range, not parse_error, which escaped
// load_dataset and ended the whole run; it is one "invalid json" record like any other.
TEST(Dataset, JsonlLineWithOverflowingNumberIsAnInvalidRecord) {
  vlm::test::TempDir dir("ds_overflow");
  png(dir / "a.png", 20, 30);
  std::string lines;
  for (int i = 0; i < 9; ++i) lines += R"({"image":"a.png","text":"t"})" "\n";
  lines += "3333333e33333333333\n";
  lines += R"({"image":"a.png","text":1e999})" "\n";
  vlm::test::write_file(dir / "d.jsonl", lines);
  DatasetOptions o = quiet();
  o.max_bad_fraction = 0.5;
  Dataset ds = load_dataset({dir / "d.jsonl"}, o);
  EXPECT_EQ(ds.records.size(), 9u);
  ASSERT_EQ(ds.bad.size(), 2u);
  EXPECT_EQ(ds.bad[0].reason, "invalid json");
  EXPECT_EQ(ds.bad[0].line, 10);
  EXPECT_EQ(ds.bad[1].line, 11);
}

// A damaged index cache (sizes that are not positive integers) is rebuilt, not trusted:
// a float such as 1e300 used to be cast to int64 (undefined behaviour).
TEST(Dataset, IndexCacheWithBadSizesIsRebuilt) {
  vlm::test::TempDir dir("ds_badindex");
  png(dir / "a.png", 20, 30);
  vlm::test::write_file(dir / "d.jsonl", R"({"image":"a.png","text":"t"})" "\n");
  load_dataset({dir / "d.jsonl"}, quiet());
  const std::string index = vlm::test::read_file(dir / "d.jsonl.index.json");
  const size_t at = index.find("\"w\":30");
  ASSERT_NE(at, std::string::npos) << index;
  for (const std::string bad : {"\"w\":1e300", "\"w\":-30", "\"w\":0", "\"w\":\"30\""}) {
    std::string damaged = index;
    damaged.replace(at, 7, bad);
    vlm::test::write_file(dir / "d.jsonl.index.json", damaged);
    Dataset ds = load_dataset({dir / "d.jsonl"}, quiet());
    EXPECT_EQ(ds.records[0].images[0].width, 30) << bad;
    EXPECT_EQ(ds.records[0].images[0].height, 20) << bad;
  }
}

}  // namespace

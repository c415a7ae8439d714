// Datasets users already have: JSON arrays read streaming (data/record_reader.h), base64
// images (data/image_source.h), LLaMA-Factory's dataset_info.json with its sharegpt and
// alpaca formats (data/dataset_info.h, data/record_formats.h) and ms-swift's messages with
// embedded images. The records are written here in the shapes LLaMA-Factory's
// data/README.md and ms-swift's "Custom dataset" page document.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include <filesystem>

#include "data/dataset.h"
#include "data/dataset_info.h"
#include "data/image.h"
#include "data/image_source.h"
#include "data/record_reader.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"

namespace {

using namespace vlm::data;
using nlohmann::json;

void fmt_png(const std::string& path, int h, int w) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  ASSERT_TRUE(cv::imwrite(path, cv::Mat(h, w, CV_8UC3, cv::Scalar(10, 200, 30))));
}

DatasetOptions fmt_quiet() {
  DatasetOptions o;
  o.warn = [](const std::string&) {};
  o.max_bad_fraction = 1.0;
  return o;
}

std::vector<RawRecord> read_all(const std::string& path, bool* is_array = nullptr) {
  RecordReader r(path);
  if (is_array) *is_array = r.is_array();
  std::vector<RawRecord> out;
  RawRecord rec;
  while (r.next(rec)) out.push_back(rec);
  return out;
}

TEST(RecordReader, JsonArrayElementsWithOffsetsAndLines) {
  vlm::test::TempDir dir("rr");
  const std::string text = "\xEF\xBB\xBF  [\n"
                           "  {\"a\": \"x ] } , [ { \\\" \\\\\"},\n"
                           "  {\"b\": [1, {\"c\": 2}]}  ,\n"
                           "  42, \"s]\", {\"d\"\n: null}\n"
                           "]\n\n";
  vlm::test::write_file(dir / "a.json", text);
  bool array = false;
  auto recs = read_all(dir / "a.json", &array);
  EXPECT_TRUE(array);
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs[0].text, R"({"a": "x ] } , [ { \" \\"})");
  EXPECT_EQ(recs[1].text, R"({"b": [1, {"c": 2}]})");
  EXPECT_EQ(recs[2].text, "42");
  EXPECT_EQ(recs[3].text, "\"s]\"");
  EXPECT_EQ(recs[4].text, "{\"d\"\n: null}");
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].number, int64_t(i) + 1);
    EXPECT_TRUE(recs[i].error.empty());
    EXPECT_EQ(text.substr(size_t(recs[i].offset), recs[i].text.size()), recs[i].text);
  }
  EXPECT_EQ(recs[0].line, 2);
  EXPECT_EQ(recs[1].line, 3);
  EXPECT_EQ(recs[4].line, 4);
  EXPECT_NO_THROW(json::parse(recs[0].text));
}

TEST(RecordReader, MalformedArraysEndWithOneErrorRecord) {
  vlm::test::TempDir dir("rr");
  vlm::test::write_file(dir / "open.json", "[{\"a\":1},\n{\"b\":2}\n");
  auto open = read_all(dir / "open.json");
  ASSERT_EQ(open.size(), 3u);
  EXPECT_NE(open[2].error.find("not closed"), std::string::npos) << open[2].error;
  vlm::test::write_file(dir / "cut.json", "[{\"a\":1}, {\"b\": \"unterminated}]\n");
  auto cut = read_all(dir / "cut.json");
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[1].number, 2);
  EXPECT_NE(cut[1].error.find("end of file"), std::string::npos) << cut[1].error;
  vlm::test::write_file(dir / "tail.json", "[{\"a\":1}] {\"b\":2}\n");
  auto tail = read_all(dir / "tail.json");
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_NE(tail[1].error.find("after the closing"), std::string::npos) << tail[1].error;
}

TEST(RecordReader, JsonlKeepsLineNumbersAndOffsets) {
  vlm::test::TempDir dir("rr");
  const std::string text = "\n{\"a\":1}\r\n   \n{\"b\":[\n";
  vlm::test::write_file(dir / "a.jsonl", text);
  bool array = true;
  auto recs = read_all(dir / "a.jsonl", &array);
  EXPECT_FALSE(array);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].text, "{\"a\":1}");
  EXPECT_EQ(recs[0].number, 2);
  EXPECT_EQ(text.substr(size_t(recs[0].offset), 7), "{\"a\":1}");
  EXPECT_EQ(recs[1].text, "{\"b\":[");  // the caller reports it as invalid json
  EXPECT_EQ(recs[1].number, 4);
}

// Records crossing the reader's 1 MiB buffer, and one record larger than the buffer.
TEST(RecordReader, RecordsAcrossBufferBoundaries) {
  vlm::test::TempDir dir("rr");
  json arr = json::array();
  for (int i = 0; i < 30000; ++i) arr.push_back({{"i", i}, {"s", std::string(size_t(i % 97), 'x') + "]}\"{"}});
  arr.push_back({{"big", std::string(size_t(3) << 20, 'b')}});
  arr.push_back({{"i", -1}});
  const std::string text = arr.dump(1);
  ASSERT_GT(text.size(), size_t(5) << 20);
  vlm::test::write_file(dir / "big.json", text);
  auto recs = read_all(dir / "big.json");
  ASSERT_EQ(recs.size(), arr.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    ASSERT_TRUE(recs[i].error.empty()) << i;
    ASSERT_EQ(json::parse(recs[i].text), arr[i]) << i;
    ASSERT_EQ(text.compare(size_t(recs[i].offset), recs[i].text.size(), recs[i].text), 0) << i;
  }
}

TEST(ImageSource, Base64AndClassification) {
  const std::vector<uint8_t> bytes = {0, 1, 2, 250, 251, 252, 253, 254, 255, 'x'};
  for (size_t n = 0; n <= bytes.size(); ++n) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + long(n));
    EXPECT_EQ(decode_base64(encode_base64(b)), b) << n;
  }
  EXPECT_EQ(encode_base64({'M', 'a', 'n'}), "TWFu");
  EXPECT_EQ(decode_base64("TW\nFu"), (std::vector<uint8_t>{'M', 'a', 'n'}));
  EXPECT_EQ(decode_base64("-_8"), decode_base64("+/8="));  // URL-safe, padding optional
  EXPECT_THROW(decode_base64("TW*u"), vlm::Error);
  EXPECT_THROW(decode_base64("TWFuT"), vlm::Error);
  EXPECT_THROW(decode_base64("TQ==TQ"), vlm::Error);
  EXPECT_EQ(classify_image_source("images/a.png"), ImageSourceKind::kPath);
  EXPECT_EQ(classify_image_source("data:image/png;base64,AAAA"), ImageSourceKind::kDataUri);
  EXPECT_EQ(classify_image_source(std::string(300, 'A')), ImageSourceKind::kBase64);
  EXPECT_EQ(classify_image_source(std::string(300, 'A') + ".png"), ImageSourceKind::kPath);
  EXPECT_EQ(base64_payload("data:image/png;base64,QUJD"), "QUJD");
  EXPECT_THROW(base64_payload("data:image/png,QUJD"), vlm::Error);
}

// LLaMA-Factory's data/README.md: sharegpt multimodal ("conversations", from/value,
// human/gpt, "images") and the OpenAI variant (tags role/content/user/assistant/system).
TEST(DatasetInfo, LlamaFactorySharegptAndOpenAiEntries) {
  vlm::test::TempDir dir("lf");
  fmt_png(dir / "imgs/a.png", 20, 30);
  fmt_png(dir / "imgs/b.png", 40, 10);
  const json mllm = json::array({
      {{"conversations", {{{"from", "human"}, {"value", "<image>Who are they?"}},
                          {{"from", "gpt"}, {"value", "They are players."}},
                          {{"from", "human"}, {"value", "What are they doing?<image>"}},
                          {{"from", "gpt"}, {"value", "Celebrating."}}}},
       {"images", {"imgs/a.png", "imgs/b.png"}}},
      {{"conversations", {{{"from", "human"}, {"value", "<image>Read."}},  // two users in a row
                          {{"from", "human"}, {"value", "Again."}}}},
       {"images", {"imgs/a.png"}}},
      {{"conversations", {{{"from", "human"}, {"value", "<image>Read."}}}},  // odd count
       {"images", {"imgs/a.png"}}},
      {{"conversations", {{{"from", "robot"}, {"value", "x"}}, {{"from", "gpt"}, {"value", "y"}}}}},
      {{"conversations", {{{"from", "human"}, {"value", "q"}},
                          {{"from", "function_call"}, {"value", "{}"}}}}},
      {{"conversations", {{{"from", "human"}, {"value", "<image>q"}}, {{"from", "gpt"}, {"value", "a"}}}},
       {"images", {"imgs/gone.png"}}},
      {{"conversations", {{{"from", "human"}, {"value", "<image><image>q"}},
                          {{"from", "gpt"}, {"value", "a"}}}},
       {"images", {"imgs/a.png"}}},
  });
  vlm::test::write_file(dir / "sub/mllm.json", mllm.dump(2));
  const json openai = json::array({
      {{"messages", {{{"role", "system"}, {"content", "Be brief."}},
                     {{"role", "user"}, {"content", "<image>Read it."}},
                     {{"role", "assistant"}, {"content", "abc"}}}},
       {"images", {"imgs/b.png"}}},
  });
  vlm::test::write_file(dir / "openai.jsonl", openai[0].dump() + "\n");  // LLaMA-Factory reads JSONL too
  const json info = {
      {"mllm_demo", {{"file_name", "sub/mllm.json"}, {"formatting", "sharegpt"},
                     {"columns", {{"messages", "conversations"}, {"images", "images"}}}}},
      {"openai_demo", {{"file_name", "openai.jsonl"}, {"formatting", "sharegpt"},
                       {"columns", {{"messages", "messages"}, {"images", "images"}}},
                       {"tags", {{"role_tag", "role"}, {"content_tag", "content"}, {"user_tag", "user"},
                                 {"assistant_tag", "assistant"}, {"system_tag", "system"}}}}},
      {"hub", {{"hf_hub_url", "someone/data"}}},
      {"dpo", {{"file_name", "openai.jsonl"}, {"ranking", true}}},
  };
  vlm::test::write_file(dir / "dataset_info.json", info.dump(2));

  Dataset ds = load_dataset({dir / "dataset_info.json#mllm_demo", dir.path() + "#openai_demo"}, fmt_quiet());
  ASSERT_EQ(ds.records.size(), 2u) << ds.summary();
  const Record& r0 = ds.records[0];
  EXPECT_EQ(r0.format, DatasetFormat::kSharegpt);
  ASSERT_EQ(r0.turns.size(), 4u);
  EXPECT_EQ(r0.turns[2].role, "user");
  EXPECT_EQ(r0.turns[2].content, "What are they doing?<image>");
  EXPECT_EQ(r0.turns[3].role, "assistant");
  ASSERT_EQ(r0.images.size(), 2u);
  EXPECT_EQ(r0.images[0].path, dir / "imgs/a.png");  // against the dataset_info.json folder
  EXPECT_EQ(r0.images[1].width, 10);
  EXPECT_EQ(r0.location(), dir / "sub/mllm.json:record 1");
  const Record& r1 = ds.records[1];
  ASSERT_EQ(r1.turns.size(), 3u);
  EXPECT_EQ(r1.turns[0].role, "system");
  EXPECT_EQ(r1.turns[0].content, "Be brief.");
  EXPECT_EQ(r1.location(), dir / "openai.jsonl:1");

  ASSERT_EQ(ds.bad.size(), 6u);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"sub/mllm.json:record 2", "invalid turn order"}, {"sub/mllm.json:record 3", "invalid turn order"},
      {"sub/mllm.json:record 4", "unknown role"},       {"sub/mllm.json:record 5", "unsupported role"},
      {"sub/mllm.json:record 6", "missing image"},      {"sub/mllm.json:record 7", "image count mismatch"}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(ds.bad[i].location(), dir / want[i].first) << i;
    EXPECT_EQ(ds.bad[i].reason, want[i].second) << i << ": " << ds.bad[i].detail;
  }
  ASSERT_EQ(ds.files.size(), 2u);
  EXPECT_EQ(ds.files[0].spec, dir / "dataset_info.json#mllm_demo");
  EXPECT_EQ(ds.files[0].container, "json array");
  EXPECT_EQ(ds.files[0].format, DatasetFormat::kSharegpt);
  EXPECT_EQ(ds.files[0].records, 1);
  EXPECT_EQ(ds.files[0].bad, 6);
  EXPECT_EQ(ds.files[1].container, "jsonl");

  // Entries vlmtrain cannot read are errors naming the entry.
  auto error_of = [&](const std::string& entry) {
    try {
      load_dataset({entry}, fmt_quiet());
    } catch (const vlm::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(dir / "dataset_info.json#nope").find("no dataset \"nope\""), std::string::npos);
  EXPECT_NE(error_of(dir / "dataset_info.json#hub").find("hf_hub_url"), std::string::npos);
  EXPECT_NE(error_of(dir / "dataset_info.json#dpo").find("ranking"), std::string::npos);
}

// data.format = sharegpt without a dataset_info.json: conversations with from/value, or the
// OpenAI variant (messages with role/content), and a "system" column.
TEST(DatasetInfo, SharegptWithoutDatasetInfo) {
  vlm::test::TempDir dir("lf");
  fmt_png(dir / "a.png", 20, 30);
  vlm::test::write_file(dir / "d.jsonl",
      R"({"conversations":[{"from":"human","value":"<image>q"},{"from":"gpt","value":"a"}],"system":"S","images":["a.png"]})" "\n"
      R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]})" "\n"
      R"({"messages":[{"role":"assistant","content":"a"},{"role":"user","content":"q"}]})" "\n");
  DatasetOptions o = fmt_quiet();
  o.format = DatasetFormat::kSharegpt;
  Dataset ds = load_dataset({dir / "d.jsonl"}, o);
  ASSERT_EQ(ds.records.size(), 2u) << ds.summary();
  ASSERT_EQ(ds.records[0].turns.size(), 3u);
  EXPECT_EQ(ds.records[0].turns[0].content, "S");
  EXPECT_EQ(ds.records[0].images.at(0).path, dir / "a.png");  // the file's folder
  EXPECT_EQ(ds.records[1].turns.size(), 2u);
  ASSERT_EQ(ds.bad.size(), 1u);
  EXPECT_EQ(ds.bad[0].reason, "invalid turn order");
  EXPECT_EQ(ds.bad[0].location(), dir / "d.jsonl:3");
}

// LLaMA-Factory's alpaca format (the default formatting) with history, system and images.
TEST(DatasetInfo, LlamaFactoryAlpacaEntryAndAutoDetection) {
  vlm::test::TempDir dir("lf");
  fmt_png(dir / "a.png", 20, 30);
  const json data = json::array({
      {{"instruction", "<image>Read the text."}, {"input", "Line 2."}, {"output", "hello"},
       {"system", "You read."}, {"history", json::array({json::array({"hi", "hey"})})}, {"images", {"a.png"}}},
      {{"instruction", "No image."}, {"input", ""}, {"output", "ok"}},
      {{"instruction", "x"}, {"output", 3}},
  });
  vlm::test::write_file(dir / "alpaca.json", data.dump());
  vlm::test::write_file(dir / "dataset_info.json",
                      json{{"alpaca_demo", {{"file_name", "alpaca.json"},
                                            {"columns", {{"prompt", "instruction"}, {"query", "input"},
                                                         {"response", "output"}, {"system", "system"},
                                                         {"history", "history"}, {"images", "images"}}}}},
                           {"no_columns", {{"file_name", "alpaca.json"}}}}.dump());
  for (const std::string& entry : {dir / "dataset_info.json#alpaca_demo", dir / "alpaca.json"}) {
    Dataset ds = load_dataset({entry}, fmt_quiet());
    ASSERT_EQ(ds.records.size(), 2u) << entry << ": " << ds.summary();
    EXPECT_EQ(ds.files[0].format, DatasetFormat::kAlpaca) << entry;  // auto-detected for the plain path
    const Record& r = ds.records[0];
    ASSERT_EQ(r.turns.size(), 5u);
    EXPECT_EQ(r.turns[0].role, "system");
    EXPECT_EQ(r.turns[1].content, "hi");
    EXPECT_EQ(r.turns[2].content, "hey");
    EXPECT_EQ(r.turns[3].content, "<image>Read the text.\nLine 2.");
    EXPECT_EQ(r.turns[4].content, "hello");
    EXPECT_EQ(r.images.at(0).width, 30);
    EXPECT_EQ(ds.records[1].turns[0].content, "No image.");
    ASSERT_EQ(ds.bad.size(), 1u);
    EXPECT_EQ(ds.bad[0].reason, "invalid field");
    EXPECT_EQ(ds.bad[0].location(), dir / "alpaca.json:record 3");
  }
  // LLaMA-Factory's default columns have no images column: the <image> marker is unmatched.
  Dataset plain = load_dataset({dir / "dataset_info.json#no_columns"}, fmt_quiet());
  ASSERT_EQ(plain.bad.size(), 2u);
  EXPECT_EQ(plain.bad[0].reason, "image count mismatch");
}

// ms-swift: messages + images as data URIs, raw base64 or paths; content parts.
TEST(DatasetFormats, SwiftEmbeddedImagesAreLocatedInTheFile) {
  vlm::test::TempDir dir("swift");
  fmt_png(dir / "a.png", 20, 30);
  cv::Mat noise(12, 50, CV_8UC3);
  cv::randu(noise, 0, 255);  // incompressible: its base64 is longer than 200 characters
  ASSERT_TRUE(cv::imwrite(dir / "wide.png", noise));
  const std::vector<uint8_t> a = read_file_bytes(dir / "a.png");
  const std::vector<uint8_t> wide = read_file_bytes(dir / "wide.png");
  const std::string a64 = encode_base64(a), wide64 = encode_base64(wide);
  ASSERT_GT(wide64.size(), 200u);
  const json data = json::array({
      {{"messages", {{{"role", "user"}, {"content", "<image><image>Compare."}},
                     {{"role", "assistant"}, {"content", "Two."}}}},
       {"images", {"data:image/png;base64," + a64, wide64}}},
      {{"messages", {{{"role", "user"}, {"content", json::array({{{"type", "image_url"},
                                                                 {"image_url", {{"url", "data:image/png;base64," + a64}}}},
                                                                {{"type", "text"}, {"text", "Read."}}})}},
                     {{"role", "assistant"}, {"content", "ok"}}}}},
      {{"messages", {{{"role", "user"}, {"content", "<image>Read."}}, {{"role", "assistant"}, {"content", "x"}}}},
       {"images", {"a.png"}}},
      {{"messages", {{{"role", "user"}, {"content", "<image>Read."}}, {{"role", "assistant"}, {"content", "x"}}}},
       {"images", {"data:image/png;base64,QUJD*"}}},
      {{"messages", {{{"role", "user"}, {"content", "<image>Read."}}, {{"role", "assistant"}, {"content", "x"}}}},
       {"images", {"data:image/png;base64," + std::string(400, 'A')}}},
  });
  std::string text = data.dump();
  // A writer that escapes '/' (allowed by JSON): that image's text is kept in memory.
  json escaped = data[2];
  escaped["images"] = {"data:image/png;base64," + a64};
  std::string esc = escaped.dump();
  for (size_t p = esc.find('/', esc.find("base64,")); p != std::string::npos; p = esc.find('/', p + 2))
    esc.replace(p, 1, "\\/");
  text.insert(text.size() - 1, "," + esc);
  vlm::test::write_file(dir / "swift.json", text);

  DatasetOptions o = fmt_quiet();
  o.format = DatasetFormat::kSwift;
  Dataset ds = load_dataset({dir / "swift.json"}, o);
  ASSERT_EQ(ds.records.size(), 4u) << ds.summary();
  const Record& r0 = ds.records[0];
  EXPECT_EQ(r0.format, DatasetFormat::kSwift);
  ASSERT_EQ(r0.images.size(), 2u);
  EXPECT_TRUE(r0.images[0].embedded);
  EXPECT_EQ(r0.images[0].embedded_text, nullptr);  // located in the file
  EXPECT_GE(r0.images[0].embedded_offset, 0);
  EXPECT_EQ(r0.images[0].width, 30);
  EXPECT_EQ(r0.images[1].width, 50);
  EXPECT_EQ(read_image_bytes(r0.images[0]), a);
  EXPECT_EQ(read_image_bytes(r0.images[1]), wide);
  EXPECT_NE(r0.images[0].path.find("swift.json:record 1 image 0"), std::string::npos) << r0.images[0].path;
  EXPECT_EQ(ds.records[1].turns[0].content, "<image>Read.");
  EXPECT_EQ(read_image_bytes(ds.records[1].images.at(0)), a);
  EXPECT_FALSE(ds.records[2].images.at(0).embedded);
  const Record& r3 = ds.records[3];  // the escaped one
  ASSERT_NE(r3.images.at(0).embedded_text, nullptr);
  EXPECT_EQ(read_image_bytes(r3.images[0]), a);
  EXPECT_EQ(r3.location(), dir / "swift.json:record 6");
  ASSERT_EQ(ds.bad.size(), 2u);
  EXPECT_EQ(ds.bad[0].reason, "bad base64");
  EXPECT_EQ(ds.bad[0].location(), dir / "swift.json:record 4");
  EXPECT_EQ(ds.bad[1].reason, "unreadable image");  // valid base64, not an image
  EXPECT_EQ(ds.files.at(0).container, "json array");

  // Auto-detection reads the same file as the messages shape.
  Dataset autod = load_dataset({dir / "swift.json"}, fmt_quiet());
  EXPECT_EQ(autod.records.size(), 4u);
  EXPECT_EQ(autod.files.at(0).format, DatasetFormat::kMessages);
}

}  // namespace

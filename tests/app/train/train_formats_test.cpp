// `vlmtrain train` and `vlmtrain inspect data` on datasets in other trainers' shapes: a
// LLaMA-Factory sharegpt JSON array named through dataset_info.json, and an ms-swift JSON
// array whose images are base64 data URIs (records written as their docs show them, from
// the synthetic OCR set rendered here).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "data/image.h"
#include "data/image_source.h"
#include "tests/app/train/train_testing.h"
#include "tests/testing.h"

namespace {

using nlohmann::json;

struct OcrLine {
  std::string image;  // relative to the synth folder
  std::string text;
};

std::vector<OcrLine> synth_lines(const std::string& dir) {
  std::vector<OcrLine> out;
  std::ifstream in(dir + "/train.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) {
      const json j = json::parse(line);
      out.push_back({j.at("image").get<std::string>(), j.at("text").get<std::string>()});
    }
  return out;
}

// Replaces data.train (and data.format) in the tiny recipe's arguments.
std::vector<std::string> train_args_on(const std::string& run, const std::string& data_dir,
                                       const std::string& train, const std::string& format) {
  std::vector<std::string> a = vlm::test::tiny_train_args(run, data_dir, 2, 0);
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i + 1].rfind("data.train=", 0) == 0) a[i + 1] = "data.train=[\"" + train + "\"]";
  a.insert(a.end(), {"--set", "data.format=" + format});
  return a;
}

TEST(TrainFormats, LlamaFactoryDatasetInfoAndSwiftBase64) {
  vlm::test::TempDir dir("train_formats");
  const std::string synth = dir / "synth";
  vlm::test::make_synth_data(synth, 6, 7);
  const std::vector<OcrLine> lines = synth_lines(synth);
  ASSERT_EQ(lines.size(), 6u);

  // LLaMA-Factory: data/README.md "Multimodal Image Dataset" (sharegpt) + its
  // dataset_info.json entry; the data file sits in a subfolder, image paths are relative
  // to the dataset_info.json folder (LLaMA-Factory's media_dir).
  json lf = json::array();
  for (const OcrLine& l : lines)
    lf.push_back({{"conversations", {{{"from", "human"}, {"value", "<image>Read the text."}},
                                     {{"from", "gpt"}, {"value", l.text}}}},
                  {"images", {l.image}}});
  lf.push_back({{"conversations", {{{"from", "human"}, {"value", "<image>Read."}}}},  // refused
                {"images", {lines[0].image}}});
  vlm::test::write_file(synth + "/lf/ocr.json", lf.dump(2));
  vlm::test::write_file(synth + "/dataset_info.json",
                      json{{"ocr_lines", {{"file_name", "lf/ocr.json"}, {"formatting", "sharegpt"},
                                          {"columns", {{"messages", "conversations"}, {"images", "images"}}}}}}
                          .dump(2));
  // ms-swift: messages + images as data URIs.
  json sw = json::array();
  for (const OcrLine& l : lines)
    sw.push_back({{"messages", {{{"role", "user"}, {"content", "<image>Read the text."}},
                                {{"role", "assistant"}, {"content", l.text}}}},
                  {"images", {"data:image/png;base64," +
                              vlm::data::encode_base64(vlm::data::read_file_bytes(synth + "/" + l.image))}}});
  sw.push_back({{"messages", {{{"role", "user"}, {"content", "<image>Read."}},  // refused: bad base64
                              {{"role", "assistant"}, {"content", "x"}}}},
                {"images", {"data:image/png;base64,@@@"}}});
  vlm::test::write_file(dir / "swift.json", sw.dump());

  const std::string lf_entry = synth + "/dataset_info.json#ocr_lines";
  struct Case {
    std::string name, entry, format, container, recognised, bad_reason, bad_location;
  };
  const std::vector<Case> cases = {
      {"lf", lf_entry, "auto", "json array", "sharegpt", "invalid turn order", synth + "/lf/ocr.json:record 7"},
      {"swift", dir / "swift.json", "swift", "json array", "swift", "bad base64", dir / "swift.json:record 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // Training: 2 steps run, loss is finite.
    const std::string run = dir / ("run_" + c.name);
    std::vector<std::string> args = train_args_on(run, synth, c.entry, c.format);
    args.insert(args.end(), {"--set", "data.max_bad_fraction=0.2"});
    auto r = vlm::test::run(args, std::chrono::seconds(240));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto losses = vlm::test::losses_by_step(run);
    ASSERT_EQ(losses.size(), 2u) << r.output;
    for (const auto& [step, loss] : losses) EXPECT_TRUE(std::isfinite(loss)) << step;
    EXPECT_NE(r.output.find(c.bad_location), std::string::npos) << r.output;

    // Inspecting: the container and format per file, refused records by reason.
    auto in = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", vlm::test::source_dir() + "/recipes/ocr_tiny.toml", "--json",
                            "--set", "data.train=[\"" + c.entry + "\"]", "--set", "data.eval=[]",
                            "--set", "data.format=" + c.format,
                            "--set", "model.tokenizer=" + synth + "/tokenizer.model"});
    ASSERT_EQ(in.exit_code, 0) << in.output;
    const json t = vlm::test::last_json_line(in.output).at("splits").at("train");
    EXPECT_EQ(t.at("records"), 6);
    ASSERT_EQ(t.at("sources").size(), 1u);
    const json& s = t.at("sources")[0];
    EXPECT_EQ(s.at("entry"), c.entry);
    EXPECT_EQ(s.at("container"), c.container);
    EXPECT_EQ(s.at("format"), c.recognised);
    EXPECT_EQ(s.at("records"), 6);
    EXPECT_EQ(s.at("bad"), 1);
    ASSERT_EQ(t.at("bad_records").size(), 1u);
    EXPECT_EQ(t.at("bad_records")[0].at("location"), c.bad_location);
    EXPECT_EQ(t.at("bad_records")[0].at("reason"), c.bad_reason);
    EXPECT_EQ(t.at("bad_by_reason"), json({{c.bad_reason, 1}}));
  }
}

}  // namespace

// TensorBoard event files (app/report/tensorboard.h): CRC-32C against RFC 3720's vectors, the
// TFRecord framing and Event bytes written out by hand from event.proto / summary.proto,
// and end to end: `vlmtrain train` (then a resume) read back with TensorBoard's own reader
// (scripts/tensorboard_reference.py, EventAccumulator) must hold every number of
// metrics.jsonl, tag for tag and step for step, rounded to float32.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "app/report/tensorboard.h"
#include "tests/app/train/train_testing.h"
#include "tests/require_sentencepiece.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

std::string tb_bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

uint32_t tb_le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + static_cast<size_t>(i)]);
  return v;
}

}  // namespace

// ---------------------------------------------------------------- wire format

TEST(TensorBoardFormat, Crc32cMatchesRfc3720Vectors) {
  // RFC 3720 (iSCSI), appendix B.4; the CRC bytes there are listed little-endian.
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string up, down;
  for (int i = 0; i < 32; ++i) up.push_back(static_cast<char>(i)), down.push_back(static_cast<char>(31 - i));
  EXPECT_EQ(vlm::app::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(vlm::app::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(vlm::app::crc32c(up.data(), up.size()), 0x46DD794Eu);
  EXPECT_EQ(vlm::app::crc32c(down.data(), down.size()), 0x113FDB5Cu);
  const std::string read10 = tb_bytes({0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,     //
                                       0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,  //
                                       0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0});
  ASSERT_EQ(read10.size(), 48u);
  EXPECT_EQ(vlm::app::crc32c(read10.data(), read10.size()), 0xD9963A56u);
  // The usual check value and the empty string.
  EXPECT_EQ(vlm::app::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(vlm::app::crc32c("", 0), 0u);
}

TEST(TensorBoardFormat, MaskAndRecordFraming) {
  // mask = ((crc >> 15) | (crc << 17)) + 0xa282ead8, worked by hand for 0xE3069283.
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(vlm::app::mask_crc32c(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  EXPECT_EQ(vlm::app::mask_crc32c(c), 0xC78AB0E5u);

  const std::string payload = "brain.Event:2";
  const std::string rec = vlm::app::tfrecord(payload);
  ASSERT_EQ(rec.size(), 8 + 4 + payload.size() + 4);
  EXPECT_EQ(rec.substr(0, 8), tb_bytes({13, 0, 0, 0, 0, 0, 0, 0}));  // uint64 LE length
  EXPECT_EQ(tb_le32(rec, 8), vlm::app::mask_crc32c(vlm::app::crc32c(rec.data(), 8)));
  EXPECT_EQ(tb_le32(rec, 8), 0x34B8373Cu);  // masked CRC of the 8 length bytes of 13
  EXPECT_EQ(rec.substr(12, payload.size()), payload);
  EXPECT_EQ(tb_le32(rec, 12 + payload.size()), vlm::app::mask_crc32c(vlm::app::crc32c(payload.data(), payload.size())));
}

TEST(TensorBoardFormat, EventBytesFollowEventProto) {
  // Event.wall_time = 1 (fixed64 double, key 0x09), step = 2 (varint, key 0x10).
  const std::string head_zero = tb_bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0});
  // file_version = 3 (bytes, key 0x1a).
  EXPECT_EQ(vlm::app::event_file_version(0.0), head_zero + tb_bytes({0x10, 0x00, 0x1a, 13}) + "brain.Event:2");
  // 1.5 = 0x3FF8000000000000; session_log = 7 (key 0x3a) holding SessionLog.status = 1 (START).
  const std::string head_15 = tb_bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f});
  EXPECT_EQ(vlm::app::event_session_start(1.5, 5), head_15 + tb_bytes({0x10, 0x05, 0x3a, 0x02, 0x08, 0x01}));
  // summary = 5 (key 0x2a) { value = 1 (key 0x0a) { tag = 1 (0x0a) "a", simple_value = 2 (fixed32, 0x15) 1.0f } }.
  EXPECT_EQ(vlm::app::event_scalars(1.5, 300, {{"a", 1.0f}, {"bc", -2.0f}}),
            head_15 + tb_bytes({0x10, 0xac, 0x02,  // 300 as a varint
                                0x2a, 21,          //
                                0x0a, 8, 0x0a, 1, 'a', 0x15, 0x00, 0x00, 0x80, 0x3f,
                                0x0a, 9, 0x0a, 2, 'b', 'c', 0x15, 0x00, 0x00, 0x00, 0xc0}));
}

TEST(TensorBoardFormat, ScalarsFromAMetricsLine) {
  const nlohmann::json line = {{"step", 7},        {"loss", 2.5},        {"skipped", true},  {"world_size", 2},
                               {"eval_full", true}, {"eval/val/cer", 0.25}, {"note", "text"}, {"gone", nullptr}};
  std::map<std::string, float> got;
  for (const auto& s : vlm::app::tb_scalars_from_metrics(line)) got[s.tag] = s.value;
  const std::map<std::string, float> want = {
      {"train/loss", 2.5f}, {"train/skipped", 1.0f}, {"train/world_size", 2.0f}, {"eval/val/cer", 0.25f}};
  EXPECT_EQ(got, want);
}

TEST(TensorBoardFormat, UnwritableDirectoryIsInactiveNotAnError) {
  TempDir dir("tb-bad");
  vlm::test::write_file(dir / "tb", "a file where the directory should be");
  vlm::app::TensorBoardWriter w(dir / "tb", 1);
  EXPECT_FALSE(w.active());
  w.write_metrics({{"step", 1}, {"loss", 1.0}});  // a no-op, no throw
  vlm::app::TensorBoardWriter off("", 1);
  EXPECT_FALSE(off.active());
}

// ---------------------------------------------------------------- end to end

namespace {

// tag -> step -> value, as metrics.jsonl says (a resumed run's lines replace the earlier
// run's from its first step on), with the naming rule of app/report/tensorboard.h restated:
// "eval/<set>/<metric>" as is, else "train/<key>".
using TbSeries = std::map<std::string, std::map<int64_t, double>>;

TbSeries tb_expected(const std::string& run_dir) {
  TbSeries out;
  int64_t last_train_step = 0;
  for (const nlohmann::json& j : vlm::test::metrics_lines(run_dir)) {
    const int64_t step = j.at("step").get<int64_t>();
    if (j.contains("loss")) {
      // A training line at or before the last one: a resumed process. TensorBoard drops
      // everything the earlier process logged from this step on (its SessionLog START).
      if (step <= last_train_step)
        for (auto& [tag, series] : out) series.erase(series.lower_bound(step), series.end());
      last_train_step = step;
    }
    for (const auto& [k, v] : j.items()) {
      if (k == "step" || k == "eval_full") continue;
      const std::string tag = k.find('/') == std::string::npos ? "train/" + k : k;
      if (v.is_boolean()) out[tag][step] = v.get<bool>() ? 1 : 0;
      else if (v.is_number()) out[tag][step] = v.get<double>();
      else if (v.is_null()) out[tag][step] = std::nan("");
    }
  }
  return out;
}

// Runs scripts/tensorboard_reference.py on <run_dir>/tb; returns its JSON.
nlohmann::json tb_read(const std::string& run_dir) {
  const std::string py = vlm::test::python_tool("python");  // throws, naming the fix, if missing
  auto r = vlm::test::run({py, vlm::test::source_dir() + "/scripts/tensorboard_reference.py", run_dir + "/tb"},
                        std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << "TensorBoard's reader failed (the tensorboard package is pinned in "
                               "scripts/requirements.txt; install it into .venv):\n"
                            << r.output;
  if (r.exit_code != 0) return nlohmann::json::object();
  return vlm::test::last_json_line(r.output);
}

// Every tag's (step, value) list read by TensorBoard equals metrics.jsonl's, in float32.
void tb_expect_same(const nlohmann::json& tb, const TbSeries& want) {
  ASSERT_TRUE(tb.contains("scalars")) << tb.dump();
  std::set<std::string> tags, want_tags;
  for (const auto& [tag, points] : tb.at("scalars").items()) tags.insert(tag);
  for (const auto& [tag, points] : want) want_tags.insert(tag);
  EXPECT_EQ(tags, want_tags);
  for (const auto& [tag, steps] : want) {
    if (!tb.at("scalars").contains(tag)) continue;
    const nlohmann::json& pts = tb.at("scalars").at(tag);
    std::vector<int64_t> got_steps, want_steps;
    for (const auto& p : pts) got_steps.push_back(p.at(0).get<int64_t>());
    for (const auto& [s, v] : steps) want_steps.push_back(s);
    ASSERT_EQ(got_steps, want_steps) << tag;
    size_t i = 0;
    for (const auto& [s, v] : steps) {
      const nlohmann::json& got = pts.at(i++).at(1);
      if (std::isnan(v)) {
        EXPECT_TRUE(got.is_null() || std::isnan(got.get<double>())) << tag << " step " << s;
        continue;
      }
      EXPECT_EQ(static_cast<float>(got.get<double>()), static_cast<float>(v)) << tag << " step " << s;
    }
  }
}

}  // namespace

TEST(TensorBoardTrain, EventsHoldMetricsJsonlAcrossAResume) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();  // synth-ocr trains a sentencepiece tokenizer
  TempDir dir("tb-train");
  const std::string data = dir / "data", run_dir = dir / "run";
  vlm::test::make_synth_data(data, 16, 11);
  auto args = [&](int steps) {
    // Checkpoint at step 3 only: the first run logs step 4 past its last checkpoint, the
    // resumed run logs 4 again (TensorBoard must show the second one). Periodic eval at 2
    // and 4 (on 2 samples), full eval at the end.
    std::vector<std::string> a = vlm::test::tiny_train_args(run_dir, data, steps, 3);
    for (const std::string& s : {"data.eval=[\"" + data + "/val.jsonl\"]", std::string("eval.every=2"),
                                 std::string("eval.max_samples=2"), std::string("eval.max_new_tokens=4"),
                                 std::string("eval.at_end=true"), std::string("checkpoint.save_final=false")}) {
      a.push_back("--set");
      a.push_back(s);
    }
    return a;
  };
  auto first = vlm::test::run(args(4), std::chrono::seconds(240));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("tensorboard --logdir " + run_dir + "/tb"), std::string::npos) << first.output;

  const nlohmann::json tb1 = tb_read(run_dir);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(tb1.at("files").size(), 1u);
  EXPECT_EQ(tb1.at("file_version").get<double>(), 2.0);
  const TbSeries want1 = tb_expected(run_dir);
  // Every number of the step log line is there, and the eval metrics per set.
  for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/images_per_s",
                          "train/samples_per_s", "train/mfu", "train/peak_rss_bytes", "train/tensor_peak_bytes", "train/data_wait_pct",
                          "train/mem_params_bytes", "eval/val/cer", "eval/overall/cer"})
    EXPECT_TRUE(want1.count(tag)) << tag << " missing from metrics.jsonl's numbers";
  EXPECT_EQ(want1.at("train/loss").size(), 4u);
  tb_expect_same(tb1, want1);

  // Resume from step 3 to step 6: a second events file, step 4 logged again.
  auto second = vlm::test::run(args(6), std::chrono::seconds(240));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  const nlohmann::json tb2 = tb_read(run_dir);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(tb2.at("files").size(), 2u);
  EXPECT_LT(tb2.at("files").at(0).get<std::string>(), tb2.at("files").at(1).get<std::string>());
  const TbSeries want2 = tb_expected(run_dir);
  EXPECT_EQ(want2.at("train/loss").size(), 6u);
  tb_expect_same(tb2, want2);
}

TEST(TensorBoardTrain, OffByKeyAndNeverFatal) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();
  TempDir dir("tb-off");
  const std::string data = dir / "data";
  vlm::test::make_synth_data(data, 4, 12);
  // log.tensorboard = false: no tb/ directory.
  std::vector<std::string> off = vlm::test::tiny_train_args(dir / "off", data, 1, 0);
  off.insert(off.end(), {"--set", "log.tensorboard=false"});
  auto r = vlm::test::run(off, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "off/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "off/tb"));
  // tb/ cannot be created (a file is in the way): a warning, the run completes.
  fs::create_directories(dir / "bad");
  vlm::test::write_file(dir / "bad/tb", "not a directory");
  auto b = vlm::test::run(vlm::test::tiny_train_args(dir / "bad", data, 1, 0), std::chrono::seconds(240));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("tensorboard: cannot create"), std::string::npos) << b.output;
  EXPECT_EQ(vlm::test::metrics_lines(dir / "bad").size(), 1u);
}

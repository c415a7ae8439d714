// `vlmtrain train --set batch.packing=true` (issue #27): the tiny recipe on a synthetic OCR
// set trains on packed rows, and its step losses equal those of the padded run over the
// same samples per step (same sampler, same rank assignment; only the grouping into
// micro-batches differs, and the loss is normalised by the step's supervised tokens either
// way), also with activation checkpointing on the decoder layers. metrics.jsonl reports the
// padding fraction: 0 packed (one rank: no filler), the padded rows' share otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "tests/app/train/train_testing.h"
#include "tests/testing.h"

namespace train_packing_test {

std::vector<nlohmann::json> train_run(const std::string& run_dir, const std::string& data_dir, bool packing,
                                      const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = vlm::test::tiny_train_args(run_dir, data_dir, 4, 0);
  // Four samples per step in micro-batches of at most 160 tokens: several micro-batches per
  // step, grouped differently with and without packing.
  args.insert(args.end(), {"--set", "batch.samples_per_rank=4", "--set", "batch.max_tokens=160", "--set",
                           std::string("batch.packing=") + (packing ? "true" : "false"), "--set",
                           "checkpoint.save_final=false"});
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = vlm::test::run(args, std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(packing ? "packing on" : "packing off"), std::string::npos) << r.output;
  return vlm::test::metrics_lines(run_dir);
}

TEST(TrainPacking, LossesEqualThePaddedRun) {
  vlm::test::TempDir dir("train_packing");
  const std::string synth = dir / "synth";
  vlm::test::make_synth_data(synth, 16, 5);
  const auto padded = train_run(dir / "padded", synth, false);
  const auto packed = train_run(dir / "packed", synth, true);
  // Activation checkpointing reruns each layer in backward, packed segments included.
  const auto packed_ckpt =
      train_run(dir / "packed_ckpt", synth, true, {"--set", "activation_checkpointing.match=model.layers.*"});
  ASSERT_EQ(packed_ckpt.size(), 4u);
  ASSERT_EQ(padded.size(), 4u);
  ASSERT_EQ(packed.size(), 4u);
  double worst = 0;
  for (size_t k = 0; k < padded.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k + 1));
    const double a = padded[k].at("loss").get<double>(), b = packed[k].at("loss").get<double>();
    const double rel = std::abs(a - b) / std::abs(a);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, k == 0 ? 1e-5 : 1e-4) << "padded " << a << ", packed " << b;
    EXPECT_EQ(padded[k].at("supervised_tokens"), packed[k].at("supervised_tokens"));
    EXPECT_NEAR(packed_ckpt[k].at("loss").get<double>(), b, 1e-6 * std::abs(b)) << "with activation checkpointing";
    EXPECT_EQ(packed[k].at("padding_fraction").get<double>(), 0.0);
    EXPECT_GE(padded[k].at("padding_fraction").get<double>(), 0.0);
    std::cout << "step " << k + 1 << ": loss padded " << a << " packed " << b << " (rel " << rel
              << "), micro-batches " << padded[k].at("micro_batches") << " vs " << packed[k].at("micro_batches")
              << ", padding " << 100 * padded[k].at("padding_fraction").get<double>() << "% vs 0%\n";
  }
  std::cout << "max relative loss difference over 4 steps: " << worst << "\n";
}

}  // namespace train_packing_test

namespace inspect_padding_test {

// `vlmtrain inspect data` reports the padding fraction of one epoch's step plans both ways:
// packed rows have none (one rank: no filler), padded rows some, and both hold the same
// real tokens (tokens in micro-batches minus padding).
TEST(InspectPadding, ReportsPaddedAndPackedFractions) {
  vlm::test::TempDir dir("inspect_padding");
  const std::string synth = dir / "synth";
  vlm::test::make_synth_data(synth, 16, 5);
  std::vector<std::string> args = {vlm::test::vlmtrain_bin(), "inspect", "data", vlm::test::source_dir() + "/recipes/ocr_tiny.toml",
                                   "--set", "model.tokenizer=" + synth + "/tokenizer.model",
                                   "--set", "data.train=" + synth + "/train.jsonl", "--set", "data.eval=[]",
                                   "--set", "data.synth.generate_if_missing=false",
                                   "--set", "batch.samples_per_rank=4", "--set", "batch.max_tokens=160"};
  auto text = vlm::test::run(args);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("padded rows (batch.packing = false): "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("packed rows (batch.packing = true):  0.0%"), std::string::npos) << text.output;
  args.push_back("--json");
  auto js = vlm::test::run(args);
  ASSERT_EQ(js.exit_code, 0) << js.output;
  const nlohmann::json p = vlm::test::last_json_line(js.output)["splits"]["train"]["padding"];
  EXPECT_EQ(p["steps"], 4);
  EXPECT_EQ(p["packed_fraction"].get<double>(), 0.0);
  EXPECT_GT(p["padded_fraction"].get<double>(), 0.0);
  const double padded_real = p["padded_tokens"].get<double>() * (1 - p["padded_fraction"].get<double>());
  EXPECT_NEAR(padded_real, p["packed_tokens"].get<double>(), 1e-6);
  std::cout << "inspect data: padding " << 100 * p["padded_fraction"].get<double>() << "% padded, "
            << 100 * p["packed_fraction"].get<double>() << "% packed\n";
}

}  // namespace inspect_padding_test

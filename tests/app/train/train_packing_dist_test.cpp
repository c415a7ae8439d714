// `vlmtrain launch --nproc-per-node 2` with batch.packing (issue #27): two Gloo ranks under
// the tiny recipe's policies (FSDP full_shard vision blocks and decoder layers, DDP for the
// rest) train on packed rows, and the step losses equal those of the padded 2-rank run over
// the same samples (the step plan assigns samples to ranks the same way either way; the
// loss is normalised by the step's global supervised tokens). Every rank runs the same
// number of micro-batches (fillers where short), or the run hangs and the timeout fails it.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "tests/app/train/train_testing.h"
#include "tests/testing.h"

namespace train_packing_dist_test {

std::vector<nlohmann::json> launch_run(const std::string& run_dir, const std::string& data_dir, bool packing) {
  std::vector<std::string> tiny = vlm::test::tiny_train_args(run_dir, data_dir, 3, 0);
  // tiny = {bin, "train", recipe, --set ...}: the launcher takes the recipe and the sets.
  std::vector<std::string> args = {tiny[0], "launch", "--nproc-per-node", "2"};
  args.insert(args.end(), tiny.begin() + 2, tiny.end());
  args.insert(args.end(), {"--set", "batch.samples_per_rank=3", "--set", "batch.max_tokens=160", "--set",
                           std::string("batch.packing=") + (packing ? "true" : "false"), "--set",
                           "checkpoint.save_final=false"});
  auto r = vlm::test::run(args, std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return vlm::test::metrics_lines(run_dir);
}

TEST(TrainPackingDist, TwoRanksLossesEqualThePaddedRun) {
  vlm::test::TempDir dir("train_packing_dist");
  const std::string synth = dir / "synth";
  vlm::test::make_synth_data(synth, 18, 8);
  const auto padded = launch_run(dir / "padded", synth, false);
  const auto packed = launch_run(dir / "packed", synth, true);
  ASSERT_EQ(padded.size(), 3u);
  ASSERT_EQ(packed.size(), 3u);
  double worst = 0;
  for (size_t k = 0; k < padded.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k + 1));
    EXPECT_EQ(packed[k].at("world_size"), 2);
    const double a = padded[k].at("loss").get<double>(), b = packed[k].at("loss").get<double>();
    const double rel = std::abs(a - b) / std::abs(a);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, k == 0 ? 1e-5 : 1e-4) << "padded " << a << ", packed " << b;
    EXPECT_EQ(padded[k].at("supervised_tokens"), packed[k].at("supervised_tokens"));
    EXPECT_LT(packed[k].at("padding_fraction").get<double>(), padded[k].at("padding_fraction").get<double>() + 1e-12);
    std::cout << "step " << k + 1 << ": loss padded " << a << " packed " << b << " (rel " << rel << "), padding "
              << 100 * padded[k].at("padding_fraction").get<double>() << "% vs "
              << 100 * packed[k].at("padding_fraction").get<double>() << "% (fillers only)\n";
  }
  std::cout << "2 ranks: max relative loss difference over 3 steps: " << worst << "\n";
}

}  // namespace train_packing_dist_test

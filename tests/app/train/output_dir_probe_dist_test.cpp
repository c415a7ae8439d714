// The start-up check of run.output_dir (app/train/output_dir_probe.h) on real ranks (Gloo
// over loopback, hard timeouts). Node-local disks are simulated by giving the ranks
// different directories:
//   - one shared directory: every rank passes, the probe file is gone afterwards and what
//     was in the directory is untouched;
//   - a directory per rank (world 2), or rank 0 alone and ranks 1-2 in another (world 3):
//     every rank throws, naming its directory, the ranks that cannot see it with their host,
//     and the fix;
//   - the trainer stops with that error at start-up, before the model or the data: with a
//     recipe whose data does not exist, the error is still the probe's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "app/config/recipe.h"
#include "app/train/output_dir_probe.h"
#include "app/train/trainer.h"
#include "sharding/dist/dist_env.h"
#include "sharding/dist/parallel_dims.h"
#include "tests/dist_testing.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"

namespace fs = std::filesystem;

namespace {

std::string probe_env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string probe_host() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// The directory this rank is given: "shared" -> <base>/out for all; "per-rank" ->
// <base>/node<rank>; "rank0-alone" -> <base>/node0 for rank 0, <base>/node1 for the others.
std::string probe_dir(const std::string& base, const std::string& mode, int rank) {
  if (mode == "shared") return base + "/out";
  if (mode == "per-rank") return base + "/node" + std::to_string(rank);
  return base + (rank == 0 ? "/node0" : "/node1");
}

vlm::sharding::ParallelDims probe_dims() {
  vlm::sharding::ParallelOptions po;
  po.timeout = std::chrono::seconds(60);
  po.device = "cpu";
  return vlm::sharding::ParallelDims::init(vlm::sharding::detect_dist_env(vlm::sharding::process_env()), po);
}

TEST(OutputDirProbeDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  const std::string mode = probe_env("VLMTRAIN_TEST_PROBE_MODE");
  vlm::sharding::ParallelDims dims = probe_dims();
  const int rank = static_cast<int>(dims.rank());
  const std::string dir = probe_dir(probe_env("VLMTRAIN_TEST_PROBE_DIR"), mode, rank);
  if (mode == "shared") {
    EXPECT_NO_THROW(vlm::app::check_output_dir_shared(dir, dims.control()));
  } else {
    try {
      vlm::app::check_output_dir_shared(dir, dims.control());
      ADD_FAILURE() << "rank " << rank << ": ranks that see different directories passed the check";
    } catch (const vlm::Error& e) {
      const std::string msg = e.what();
      const std::string who = mode == "per-rank" ? "rank 1 on host " : "ranks 1-2 on host ";
      for (const std::string& part :
           {"run.output_dir = " + dir + " is not one directory shared by every rank", who + probe_host(),
            std::string("cannot see it"), std::string("writing checkpoints per node is not supported"),
            std::string("Hint: set run.output_dir to a shared filesystem path")})
        EXPECT_NE(msg.find(part), std::string::npos) << "rank " << rank << " lacks \"" << part << "\" in: " << msg;
    }
  }
  dims.control().barrier("end of the probe test");
}

// The trainer itself, in this process: ranks given different output directories stop at
// start-up with the probe's error (the data set named by the recipe does not exist, so any
// later stage would fail with another error).
TEST(OutputDirProbeDist, DISABLED_TrainerWorker) {
  VLM_DIST_WORKER_ONLY();
  const int rank = std::atoi(probe_env("RANK").c_str());
  const std::string base = probe_env("VLMTRAIN_TEST_PROBE_DIR");
  const std::string dir = probe_dir(base, "per-rank", rank);
  const vlm::app::Recipe recipe = vlm::app::load_recipe(
      vlm::test::source_dir() + "/recipes/ocr_tiny.toml",
      {"run.output_dir=" + dir, "model.tokenizer=" + base + "/missing/tokenizer.model",
       "data.train=" + base + "/missing/train.jsonl", "data.eval=[]", "data.synth.generate_if_missing=false",
       "dist.device=cpu", "dist.timeout_s=60"});
  try {
    vlm::app::run_training(recipe);
    ADD_FAILURE() << "rank " << rank << ": training started on directories the ranks do not share";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.output_dir = " + dir + " is not one directory shared by every rank"),
              std::string::npos)
        << "rank " << rank << ": " << e.what();
  }
}

std::vector<vlm::test::WorkerResult> run_probe(int world, const std::string& worker, const std::string& base,
                                               const std::string& mode) {
  vlm::test::DistRun run;
  run.world_size = world;
  run.worker_test = "OutputDirProbeDist." + worker;
  run.timeout = std::chrono::seconds(120);
  run.extra_env = [=](int) {
    return std::vector<std::string>{"VLMTRAIN_TEST_PROBE_DIR=" + base, "VLMTRAIN_TEST_PROBE_MODE=" + mode};
  };
  return vlm::test::run_workers(run);
}

std::set<std::string> probe_listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

TEST(OutputDirProbeDist, OneSharedDirectoryPassesAndIsLeftAsItWas) {
  vlm::test::TempDir base("probe-shared");
  fs::create_directories(base / "out/step-00000003");
  vlm::test::write_file(base / "out/metrics.jsonl", "{\"step\": 1}\n");
  ASSERT_TRUE(vlm::test::all_ok(run_probe(2, "DISABLED_Worker", base.path(), "shared")));
  EXPECT_EQ(probe_listing(base / "out"), (std::set<std::string>{"metrics.jsonl", "step-00000003"}));
  EXPECT_EQ(vlm::test::read_file(base / "out/metrics.jsonl"), "{\"step\": 1}\n");
}

TEST(OutputDirProbeDist, ADirectoryPerRankStopsEveryRank) {
  vlm::test::TempDir base("probe-local");
  ASSERT_TRUE(vlm::test::all_ok(run_probe(2, "DISABLED_Worker", base.path(), "per-rank")));
  EXPECT_TRUE(probe_listing(base / "node0").empty());  // rank 0 created it for its probe, then removed the probe
  EXPECT_FALSE(fs::exists(base / "node1"));            // the other ranks only look
}

TEST(OutputDirProbeDist, RanksThatCannotSeeItAreNamedAsRanges) {
  vlm::test::TempDir base("probe-local3");
  ASSERT_TRUE(vlm::test::all_ok(run_probe(3, "DISABLED_Worker", base.path(), "rank0-alone")));
}

TEST(OutputDirProbeDist, TheTrainerStopsAtStartUp) {
  vlm::test::TempDir base("probe-trainer");
  ASSERT_TRUE(vlm::test::all_ok(run_probe(2, "DISABLED_TrainerWorker", base.path(), "per-rank")));
}

}  // namespace

// The evaluator across real processes (Gloo over loopback): world 2 and 3 give exactly the
// predictions file and the summary numbers of one process, on 11 samples (divisible by
// neither). In lockstep mode every unit call of the model issues an all-reduce (as an
// FSDP unit's all-gather would), so a rank that made fewer forward calls than another
// would hang: ranks with fewer samples run filler batches and all ranks decode the same
// number of steps; the test also compares the per-rank unit call counts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>

#include "app/eval/evaluator.h"
#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "tests/app/eval/eval_fixture.h"
#include "tests/dist_testing.h"

namespace {

using nlohmann::json;
namespace sh = vlm::sharding;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Every unit call first all-reduces a scalar over the world (stands in for FSDP's gather).
struct CollectiveRunner : vlm::UnitRunner {
  explicit CollectiveRunner(sh::Comm& c) : comm(c) {}
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override {
    torch::Tensor one = torch::ones({1});
    comm.all_reduce(one, sh::ReduceOp::kSum, path);
    ++calls;
    return fn(x);
  }
  sh::Comm& comm;
  int64_t calls = 0;
};

// The options every run uses (world 1 in the parent, N in the workers).
vlm::app::EvalOptions run_options(const vlm::app::Recipe& r, bool lockstep, const std::string& out) {
  vlm::app::EvalOptions o = vlm::app::eval_options(r);
  o.batch_size = lockstep ? 3 : 2;
  o.lockstep = lockstep;
  o.output_dir = out;
  return o;
}

// Summary numbers without the timings (which differ run to run).
json numbers(const vlm::app::EvalSummary& s) {
  json j = json::object();
  for (const auto& [k, v] : s.metrics)
    if (k != "eval/seconds" && k != "eval/samples_per_s") j[k] = v;
  return j;
}

// ---------------------------------------------------------------- worker body

TEST(EvalDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  const std::string dir = env_or_empty("VLMTRAIN_TEST_EVAL_DIR");
  const std::string out = env_or_empty("VLMTRAIN_TEST_EVAL_OUT");
  const bool lockstep = env_or_empty("VLMTRAIN_TEST_EVAL_MODE") == "lockstep";
  sh::ParallelOptions po;
  po.timeout = std::chrono::seconds(60);
  po.device = "cpu";
  sh::ParallelDims dims = sh::ParallelDims::init(sh::detect_dist_env(sh::process_env()), po);

  auto tok = vlm::test::tiny_tokenizer();
  auto model = vlm::test::tiny_eval_model(*tok);
  auto runner = std::make_shared<CollectiveRunner>(dims.comm());
  if (lockstep) model->set_runner(runner);
  const vlm::app::Recipe recipe = vlm::test::eval_recipe(dir);
  const auto sets = vlm::app::load_eval_datasets(recipe, recipe.data.eval);
  const auto s = vlm::app::evaluate(*model, *tok, recipe, sets, run_options(recipe, lockstep, out),
                                    &dims.comm());
  std::filesystem::create_directories(out);
  vlm::test::write_file(out + "/numbers_rank" + std::to_string(dims.rank()) + ".json",
                      numbers(s).dump());
  if (lockstep) {
    torch::Tensor mine = torch::tensor({runner->calls}, torch::kInt64);
    torch::Tensor all = torch::empty({dims.world_size()}, torch::kInt64);
    dims.comm().all_gather(all, mine, "unit call counts");
    for (int64_t r = 0; r < dims.world_size(); ++r)
      EXPECT_EQ(all[r].item<int64_t>(), runner->calls) << "rank " << r << " vs rank " << dims.rank();
    EXPECT_GT(runner->calls, 0);
  }
  dims.comm().barrier("end");
}

// ---------------------------------------------------------------- parent

TEST(EvalDist, World2And3MatchWorld1) {
  vlm::test::TempDir dir("eval_dist");
  vlm::test::write_file(dir / "tokenizer.json", vlm::test::tiny_tokenizer_json());
  vlm::test::write_eval_sets(dir.path(), 8);  // 8 + 3 = 11 samples
  const vlm::app::Recipe recipe = vlm::test::eval_recipe(dir.path());
  auto tok = vlm::test::tiny_tokenizer();
  auto model = vlm::test::tiny_eval_model(*tok);
  // Also writes the image index beside each JSONL before the workers read it.
  const auto sets = vlm::app::load_eval_datasets(recipe, recipe.data.eval);

  for (bool lockstep : {false, true}) {
    const std::string mode = lockstep ? "lockstep" : "plain";
    const std::string ref_dir = dir / ("w1_" + mode);
    const auto ref = vlm::app::evaluate(*model, *tok, recipe, sets, run_options(recipe, lockstep, ref_dir));
    ASSERT_EQ(ref.samples, 11);
    const std::string ref_pred = vlm::test::read_file(ref_dir + "/predictions.jsonl");
    const json ref_sum = json::parse(vlm::test::read_file(ref_dir + "/eval_summary.json"));
    for (int world : {2, 3}) {
      SCOPED_TRACE(mode + ", world " + std::to_string(world));
      const std::string out = dir / ("w" + std::to_string(world) + "_" + mode);
      vlm::test::DistRun run;
      run.world_size = world;
      run.worker_test = "EvalDist.DISABLED_Worker";
      run.timeout = std::chrono::seconds(120);
      run.extra_env = [&](int) {
        return std::vector<std::string>{"VLMTRAIN_TEST_EVAL_DIR=" + dir.path(), "VLMTRAIN_TEST_EVAL_OUT=" + out,
                                        "VLMTRAIN_TEST_EVAL_MODE=" + mode};
      };
      const auto results = vlm::test::run_workers(run);
      ASSERT_TRUE(vlm::test::all_ok(results));
      double slowest = 0;
      for (const auto& r : results) slowest = std::max(slowest, r.seconds);
      std::cout << mode << " world " << world << ": slowest worker " << slowest << " s\n";
      EXPECT_EQ(vlm::test::read_file(out + "/predictions.jsonl"), ref_pred);
      const json sum = json::parse(vlm::test::read_file(out + "/eval_summary.json"));
      for (const char* key : {"overall", "datasets", "skipped", "metrics", "normalization", "samples",
                              "generated_tokens"})
        EXPECT_EQ(sum[key], ref_sum[key]) << key;
      EXPECT_EQ(sum["world_size"], world);
      for (int r = 0; r < world; ++r)
        EXPECT_EQ(json::parse(vlm::test::read_file(out + "/numbers_rank" + std::to_string(r) + ".json")),
                  numbers(ref))
            << "rank " << r;
    }
  }
}

}  // namespace

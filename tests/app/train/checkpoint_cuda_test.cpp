// CUDA RNG states in checkpoints (app/train/rng_state.h), on a GPU: ctest label `cuda`; every
// test skips, saying why, when LibTorch sees no CUDA device (this CPU machine: the tests are
// written as they would run on the lent GPU and have not run yet).
//   - a checkpoint saved with the rank's device cuda:0 holds rng/cuda; restoring it after
//     other draws gives exactly the draws an uninterrupted process makes next: torch::rand
//     on CUDA, a dropout mask on CUDA, and the CPU stream;
//   - checkpoint.async captures the CUDA state when the save begins, not when the background
//     write runs;
//   - the trainer on CUDA with LoRA dropout (its masks come from the CUDA generator): a
//     resume from the step-3 checkpoint restores rng/cpu and rng/cuda and logs the
//     uninterrupted run's losses of steps 4-6 (within 1e-6 relative: the same kernels on the
//     same device; a different dropout stream moves them far more: on CPU, the same run
//     resumed without its rng/cpu logs step 4 3.7e-4 relative off).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/train/checkpoint.h"
#include "app/train/checkpointer.h"
#include "app/train/rng_state.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "tests/app/train/train_testing.h"
#include "tests/testing.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

#define CKPT_REQUIRE_CUDA()                                                                          \
  do {                                                                                               \
    if (!torch::cuda::is_available())                                                                \
      GTEST_SKIP() << "no CUDA device visible to LibTorch (torch::cuda::is_available() is false); " \
                      "the GPU run executes the cuda label on a lent GPU";                          \
  } while (0)

// A world-1 tiny model on the rank's device (cuda:0 where a GPU is visible: apply_policies
// refuses parameters that are not on ParallelDims::device()): the checkpoint's state slices.
struct CudaCkptWorld {
  vlm::sharding::ParallelDims dims =
      vlm::sharding::ParallelDims::init(vlm::sharding::DistEnv{}, vlm::sharding::ParallelOptions{});
  vlm::VisionLanguageModel model{nullptr};
  std::unique_ptr<vlm::sharding::ShardedModel> sm;
  CudaCkptWorld() {
    model = vlm::VisionLanguageModel(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
    vlm::materialize(*model, {dims.device(), torch::kFloat32, 5});
    vlm::sharding::ShardingOptions o;
    o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", ""}};
    sm = vlm::sharding::apply_policies(*model, o, dims);
  }
  static vlm::app::TrainerState state(int64_t step) {
    vlm::app::TrainerState st;
    st.step = step;
    return st;
  }
  static vlm::app::CheckpointFiles files() { return {"# recipe\n", "abc", "{}", "/tok"}; }
};

// The next draws of the process's streams: CUDA uniform numbers, a CUDA dropout mask, CPU
// uniform numbers.
struct CudaDraws {
  torch::Tensor rand, mask, cpu;
  static CudaDraws next(const torch::Device& dev) {
    CudaDraws d;
    d.rand = torch::rand({1000}, torch::TensorOptions().device(dev)).cpu();
    d.mask = torch::dropout(torch::ones({4096}, torch::TensorOptions().device(dev)), 0.5, /*train=*/true).cpu();
    d.cpu = torch::rand({16});
    return d;
  }
  bool equals(const CudaDraws& o) const {
    return torch::equal(rand, o.rand) && torch::equal(mask, o.mask) && torch::equal(cpu, o.cpu);
  }
};

TEST(CheckpointCuda, RestoredRngStatesReplayTheUninterruptedDraws) {
  CKPT_REQUIRE_CUDA();
  CudaCkptWorld w;
  TempDir dir("ckpt-cuda-rng");
  const torch::Device dev("cuda:0");
  torch::manual_seed(21);
  torch::rand({7}, torch::TensorOptions().device(dev));  // the CUDA stream is past its seed
  const std::string ck = vlm::app::save_checkpoint(dir.path(), CudaCkptWorld::state(1), *w.sm, w.dims.comm(),
                                                   CudaCkptWorld::files(), 0, dev);
  const CudaDraws want = CudaDraws::next(dev);  // what the uninterrupted process draws next
  vlm::app::CheckpointReader r(ck);
  EXPECT_EQ(r.rng_keys(0), (std::vector<std::string>{"rng/cpu", "rng/cuda"}));
  ASSERT_TRUE(r.rng_state(0, vlm::app::kRngCudaKey).defined());

  torch::manual_seed(77);  // another stream on both devices
  torch::rand({123}, torch::TensorOptions().device(dev));
  EXPECT_FALSE(CudaDraws::next(dev).equals(want));  // the control: other draws without the restore
  const auto restored = vlm::app::restore_rng_states(r, 0, 1, dev);
  EXPECT_EQ(restored.restored, (std::vector<std::string>{"rng/cpu", "rng/cuda"}));
  EXPECT_TRUE(restored.differs.empty());
  EXPECT_TRUE(CudaDraws::next(dev).equals(want));
}

TEST(CheckpointCuda, AsyncSaveCapturesTheCudaStateWhenItBegins) {
  CKPT_REQUIRE_CUDA();
  CudaCkptWorld w;
  TempDir dir("ckpt-cuda-async");
  const torch::Device dev("cuda:0");
  torch::manual_seed(5);
  vlm::app::Checkpointer ck({dir.path(), CudaCkptWorld::files(), 0, /*async=*/true, dev, false}, *w.sm,
                            w.dims.comm());
  ck.save(CudaCkptWorld::state(1), "test");
  const CudaDraws want = CudaDraws::next(dev);  // drawn while the write may still run
  const auto c = ck.finish("test");
  ASSERT_TRUE(c.has_value());
  vlm::app::CheckpointReader r(c->dir);
  torch::manual_seed(6);
  vlm::app::restore_rng_states(r, 0, 1, dev);
  EXPECT_TRUE(CudaDraws::next(dev).equals(want));
}

TempDir* g_ckpt_cuda_data = nullptr;

class CheckpointCudaTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!torch::cuda::is_available()) return;
    g_ckpt_cuda_data = new TempDir("ckpt-cuda-data");
    vlm::test::make_synth_data(g_ckpt_cuda_data->path(), 32, 9);
  }
  static void TearDownTestSuite() {
    delete g_ckpt_cuda_data;
    g_ckpt_cuda_data = nullptr;
  }
  // The tiny recipe on CUDA, 6 steps, a checkpoint every 3, LoRA (r 8, dropout 0.1) on the
  // LLM layers, whose dropout masks come from the CUDA generator, the rest frozen but the
  // vision tower and the merger.
  static vlm::test::RunResult train(const std::string& run_dir) {
    auto args = vlm::test::tiny_train_args(run_dir, g_ckpt_cuda_data->path(), 6, 3);
    for (const char* s : {"dist.device=cuda", "precision.param_dtype=fp32", "sharding.default=freeze",
                          "sharding.module.2.policy=lora", "sharding.module.2.dropout=0.1", "checkpoint.keep_last=5"})
      args.insert(args.end(), {"--set", s});
    return vlm::test::run(args, std::chrono::seconds(300));
  }
};

TEST_F(CheckpointCudaTrain, ResumeContinuesTheCudaDropoutStream) {
  CKPT_REQUIRE_CUDA();
  TempDir dir("ckpt-cuda-train");
  auto full = train(dir / "full");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto want = vlm::test::losses_by_step(dir / "full");
  ASSERT_EQ(want.size(), 6u);
  vlm::app::CheckpointReader ck3(vlm::app::checkpoint_dir(dir / "full", 3));
  EXPECT_EQ(ck3.rng_keys(0), (std::vector<std::string>{"rng/cpu", "rng/cuda"}));

  // The interrupted run: the step-3 checkpoint and the metrics of steps 1-3.
  const std::string resumed = dir / "resumed";
  fs::create_directories(resumed);
  fs::copy(vlm::app::checkpoint_dir(dir / "full", 3), vlm::app::checkpoint_dir(resumed, 3),
           fs::copy_options::recursive);
  {
    std::ifstream in(dir / "full/metrics.jsonl");
    std::ofstream out(resumed + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (nlohmann::json::parse(line).at("step").get<int64_t>() <= 3) out << line << "\n";
  }
  auto res = train(resumed);
  ASSERT_EQ(res.exit_code, 0) << res.output;
  EXPECT_NE(res.output.find("RNG states restored: rng/cpu, rng/cuda"), std::string::npos) << res.output;
  const auto got = vlm::test::losses_by_step(resumed);
  for (int64_t s = 4; s <= 6; ++s) {
    ASSERT_TRUE(got.count(s)) << "step " << s;
    EXPECT_NEAR(got.at(s), want.at(s), 1e-6 * std::abs(want.at(s))) << "step " << s;
  }
}

}  // namespace

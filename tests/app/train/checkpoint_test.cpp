// Checkpoint files in one process: the round trip of a real sharded model's state, the
// reader's re-splitting of slices written by several ranks, pruning, and clear errors for
// incomplete or damaged checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "app/train/checkpoint.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"

namespace fs = std::filesystem;
using namespace vlm::sharding;
using vlm::app::CheckpointReader;
using vlm::test::TempDir;

namespace {

struct World1 {
  ParallelDims dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  vlm::VisionLanguageModel model{nullptr};
  std::unique_ptr<ShardedModel> sm;
  World1() {
    model = vlm::VisionLanguageModel(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
    vlm::materialize(*model, {torch::kCPU, torch::kFloat32, 5});
    ShardingOptions o;
    o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", ""}};
    sm = apply_policies(*model, o, dims);
  }
  std::string save(const std::string& out, int64_t step, int64_t keep_last = 0) {
    vlm::app::TrainerState st;
    st.step = step;
    st.cursor = {1, 7};
    return vlm::app::save_checkpoint(out, st, *sm, dims.comm(), {"# recipe\n", "abc", "{}", "/tok"}, keep_last);
  }
};

std::string ckpt_step(int64_t s) {
  char b[32];
  std::snprintf(b, sizeof(b), "step-%08lld", static_cast<long long>(s));
  return b;
}

TEST(Checkpoint, RoundTripOfARealModelsState) {
  World1 w;
  TempDir dir("ckpt");
  const std::string ck = w.save(dir.path(), 3);
  EXPECT_EQ(ck, dir / ckpt_step(3));
  for (const char* f : {"COMPLETE", "trainer.json", "recipe.toml", "config.json", "state-rank00000-of-00001.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(ck) / f)) << f;
  CheckpointReader r(ck);
  EXPECT_EQ(r.state().step, 3);
  EXPECT_EQ(r.state().cursor, (vlm::data::SamplerCursor{1, 7}));
  EXPECT_EQ(r.recipe_hash(), "abc");
  // Every parameter of the model, frozen or trained, comes back under its HF name.
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : w.model->named_parameters()) params[p.key()] = p.value();
  auto tensors = r.consolidated();
  EXPECT_EQ(tensors.size(), params.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(params.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, params[name])) << name;
  }
  // Moments are zero before any step.
  EXPECT_EQ(r.read("model.layers.0/exp_avg", 0, 10).abs().sum().item<double>(), 0.0);
}

// Slices written by 3 ranks of a 10-element vector, read back over any range.
TEST(Checkpoint, ReaderResplitsSlicesOfAnyWorldSize) {
  TempDir dir("slices");
  const std::string ck = dir / ckpt_step(1);
  fs::create_directories(ck);
  torch::Tensor full = torch::arange(10, torch::kFloat32) * 1.5;
  nlohmann::json files = nlohmann::json::array();
  for (int64_t r = 0; r < 3; ++r) {
    auto [lo, hi] = owned_range(10, 3, r);  // [0,4) [4,8) [8,10)
    vlm::SafetensorsWriteOptions o;
    o.metadata = {{"slices", nlohmann::json{{"u/master", {lo, hi, 10}}}.dump()}};
    const std::string name = "state-rank" + std::to_string(r) + ".safetensors";
    vlm::save_safetensors(ck + "/" + name, {{"u/master", full.narrow(0, lo, hi - lo).clone()}}, o);
    files.push_back(name);
  }
  nlohmann::json tj = {{"format_version", 1}, {"world_size", 3}, {"files", files}, {"units", nlohmann::json::array()},
                       {"state", vlm::app::TrainerState{}.to_json()}};
  vlm::test::write_file(ck + "/trainer.json", tj.dump());
  vlm::test::write_file(ck + "/COMPLETE", "");
  CheckpointReader r(ck);
  for (int64_t lo = 0; lo <= 10; ++lo)
    for (int64_t hi = lo; hi <= 10; ++hi)
      EXPECT_TRUE(torch::equal(r.read("u/master", lo, hi), full.narrow(0, lo, hi - lo))) << lo << ".." << hi;
  EXPECT_THROW(r.read("u/master", 5, 11), vlm::Error);
  EXPECT_THROW(r.read("u/exp_avg", 0, 1), vlm::Error);
}

TEST(Checkpoint, IncompleteCheckpointsAreIgnoredAndPruningKeepsTheNewest) {
  World1 w;
  TempDir dir("prune");
  for (int64_t s : {1, 2, 3}) w.save(dir.path(), s, 2);
  EXPECT_FALSE(fs::exists(dir / ckpt_step(1)));
  EXPECT_EQ(vlm::app::complete_checkpoints(dir.path()),
            (std::vector<std::string>{dir / ckpt_step(2), dir / ckpt_step(3)}));
  fs::remove(dir / (ckpt_step(3) + "/COMPLETE"));
  EXPECT_EQ(*vlm::app::resolve_resume("auto", dir.path()), dir / ckpt_step(2));
  try {
    vlm::app::resolve_resume(dir / ckpt_step(3), dir.path());
    FAIL() << "an incomplete checkpoint was accepted";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no COMPLETE marker"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(vlm::app::resolve_resume("none", dir.path()).has_value());
  EXPECT_FALSE(vlm::app::resolve_resume("auto", dir / "nothing-here").has_value());
}

TEST(Checkpoint, DamagedFilesAreNamedInTheError) {
  World1 w;
  TempDir dir("damaged");
  const std::string ck = w.save(dir.path(), 4);
  const std::string rank_file = ck + "/state-rank00000-of-00001.safetensors";
  fs::resize_file(rank_file, fs::file_size(rank_file) / 2);  // truncated
  try {
    CheckpointReader r(ck);
    FAIL() << "a truncated rank file was accepted";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find(rank_file), std::string::npos) << e.what();
  }
  vlm::test::write_file(ck + "/trainer.json", "{ not json");
  try {
    CheckpointReader r(ck);
    FAIL() << "a corrupt trainer.json was accepted";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.json"), std::string::npos) << e.what();
  }
}

}  // namespace

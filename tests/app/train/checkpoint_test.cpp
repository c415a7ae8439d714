// Checkpoint files in one process: the round trip of a real sharded model's state, the
// reader's re-splitting of slices written by several ranks, pruning, clear errors for
// incomplete or damaged checkpoints, the RNG states (rng/cpu as before; rng/cuda reported
// absent on CPU), the snapshot taken when a save begins, and the asynchronous checkpointer
// at world 1 (the same files as a synchronous save, one save in flight, an interrupted or
// failed background write never completes a checkpoint).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "app/train/checkpoint.h"
#include "app/train/checkpointer.h"
#include "app/train/rng_state.h"
#include "tests/app/train/train_testing.h"
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
  static vlm::app::TrainerState state(int64_t step) {
    vlm::app::TrainerState st;
    st.step = step;
    st.cursor = {1, 7};
    return st;
  }
  static vlm::app::CheckpointFiles files() { return {"# recipe\n", "abc", "{}", "/tok"}; }
  std::string save(const std::string& out, int64_t step, int64_t keep_last = 0) {
    return vlm::app::save_checkpoint(out, state(step), *sm, dims.comm(), files(), keep_last);
  }
  // One training step on a fixed image + text batch: forward, backward, AdamW update (it
  // changes masters, moments and parameters in place).
  void train_step(uint64_t seed) {
    sm->set_sync(true);
    vlm::ForwardOutput out = model->forward(vlm::test::image_text_batch(model->cfg, seed, 8));
    out.loss_sum.backward();
    sm->finish_backward("test step");
    sm->optimizer().clip_grad_norm();
    sm->optimizer().step();
    sm->optimizer().zero_grad();
  }
  vlm::app::Checkpointer checkpointer(const std::string& out, bool async) {
    return vlm::app::Checkpointer({out, files(), 0, async, torch::kCPU, false}, *sm, dims.comm());
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

// Every tensor of every rank file and the trainer state (but its wall time) are equal.
void expect_same_checkpoint(const std::string& got, const std::string& want) {
  CheckpointReader a(got), b(want);
  ASSERT_EQ(a.world_size(), b.world_size());
  for (const char* f : {"state-rank00000-of-00001.safetensors"}) {
    auto fa = vlm::SafetensorsFile::open(got + "/" + f), fb = vlm::SafetensorsFile::open(want + "/" + f);
    ASSERT_EQ(fa.names(), fb.names()) << f;
    for (const auto& name : fb.names()) EXPECT_TRUE(torch::equal(fa.get(name), fb.get(name))) << f << ": " << name;
    EXPECT_EQ(fa.metadata(), fb.metadata()) << f;
  }
  auto sa = a.trainer_json().at("state"), sb = b.trainer_json().at("state");
  sa.erase("train_seconds");
  sb.erase("train_seconds");
  EXPECT_EQ(sa, sb);
}

// Sets an environment variable for the scope of one test.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { ::setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// "rng/cpu" is the CPU generator's state as before (set_state of it replays the same draws);
// a checkpoint written on CPU holds no "rng/cuda", and the reader and the restore say so.
TEST(Checkpoint, CpuRngStateRoundTripsAndTheAbsentCudaStateIsReported) {
  World1 w;
  TempDir dir("rng");
  torch::manual_seed(11);
  const torch::Tensor state_before = at::detail::getDefaultCPUGenerator().get_state();
  const std::string ck = w.save(dir.path(), 1);
  const torch::Tensor want = torch::rand({16});
  CheckpointReader r(ck);
  EXPECT_EQ(r.rng_keys(0), (std::vector<std::string>{"rng/cpu"}));
  EXPECT_TRUE(torch::equal(r.rng_state(0), state_before));  // the key's bytes: the generator's state
  EXPECT_FALSE(r.rng_state(0, vlm::app::kRngCudaKey).defined());
  EXPECT_FALSE(r.rng_state(3).defined());  // no such rank
  EXPECT_TRUE(r.rng_keys(3).empty());
  try {
    r.rng_state(0, "rng/mps");
    FAIL() << "an unknown RNG key was accepted";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected rng/cpu or rng/cuda"), std::string::npos) << e.what();
  }

  torch::manual_seed(99);  // another stream
  auto restored = vlm::app::restore_rng_states(r, 0, 1, torch::kCPU);
  EXPECT_EQ(restored.restored, (std::vector<std::string>{"rng/cpu"}));
  EXPECT_TRUE(restored.differs.empty());
  EXPECT_TRUE(torch::equal(torch::rand({16}), want));

  // Resuming this CPU checkpoint on CUDA: rng/cpu restored, the CUDA stream reported as
  // differing (no CUDA call is made: there is nothing to set).
  torch::manual_seed(99);
  restored = vlm::app::restore_rng_states(r, 0, 1, torch::Device("cuda:0"));
  EXPECT_EQ(restored.restored, (std::vector<std::string>{"rng/cpu"}));
  ASSERT_EQ(restored.differs.size(), 1u);
  EXPECT_NE(restored.differs[0].find("holds no rng/cuda (it was written on CPU)"), std::string::npos)
      << restored.differs[0];
  EXPECT_TRUE(torch::equal(torch::rand({16}), want));

  // Another world size: nothing restored, and the line says why.
  restored = vlm::app::restore_rng_states(r, 0, 2, torch::kCPU);
  EXPECT_TRUE(restored.restored.empty());
  ASSERT_EQ(restored.differs.size(), 1u);
  EXPECT_NE(restored.differs[0].find("written by 1 rank(s), this run has 2"), std::string::npos)
      << restored.differs[0];
}

// A checkpoint written on CUDA (its rank file holds rng/cuda) resumed on CPU: rng/cpu is
// restored, rng/cuda is not used and the restore says so.
TEST(Checkpoint, CudaRngStateOfACheckpointIsUnusedOnCpu) {
  World1 w;
  TempDir dir("rng-cuda");
  const std::string ck = w.save(dir.path(), 1);
  const std::string file = ck + "/state-rank00000-of-00001.safetensors";
  vlm::NamedTensors tensors;
  std::map<std::string, std::string> md;
  {
    auto f = vlm::SafetensorsFile::open(file);
    for (const auto& name : f.names()) tensors.emplace_back(name, f.get(name).clone());
    md = f.metadata();
  }
  tensors.emplace_back("rng/cuda", torch::arange(16, torch::kUInt8));  // Philox seed + offset: 16 bytes
  vlm::SafetensorsWriteOptions o;
  o.metadata = md;
  vlm::save_safetensors(file, tensors, o);
  CheckpointReader r(ck);
  EXPECT_EQ(r.rng_keys(0), (std::vector<std::string>{"rng/cpu", "rng/cuda"}));
  EXPECT_TRUE(torch::equal(r.rng_state(0, "rng/cuda"), torch::arange(16, torch::kUInt8)));
  const auto restored = vlm::app::restore_rng_states(r, 0, 1, torch::kCPU);
  EXPECT_EQ(restored.restored, (std::vector<std::string>{"rng/cpu"}));
  ASSERT_EQ(restored.differs.size(), 1u);
  EXPECT_NE(restored.differs[0].find("written on CUDA) and this run is on CPU"), std::string::npos)
      << restored.differs[0];
}

// The state is copied when the save begins: training steps and random draws between the
// begin and the write do not reach the files (what makes an asynchronous write correct).
TEST(Checkpoint, SnapshotIsTakenWhenTheSaveBegins) {
  World1 w;
  TempDir dir("snapshot");
  w.train_step(1);  // non-zero moments
  torch::manual_seed(5);
  const std::string want = w.save(dir / "sync", 1);
  torch::manual_seed(5);
  vlm::app::CheckpointWrite write(dir / "later", World1::state(1), *w.sm, w.dims.comm());
  w.train_step(2);  // changes masters, moments and parameters in place
  torch::rand({100});  // moves the CPU generator
  write.write();
  const std::string got = write.commit(w.dims.comm(), World1::files(), 0);
  expect_same_checkpoint(got, want);
  // The control: a save now differs (the step did change the state).
  const std::string now = w.save(dir / "now", 1);
  auto a = vlm::SafetensorsFile::open(now + "/state-rank00000-of-00001.safetensors");
  auto b = vlm::SafetensorsFile::open(want + "/state-rank00000-of-00001.safetensors");
  EXPECT_FALSE(torch::equal(a.get("model.layers.0/master"), b.get("model.layers.0/master")));
  EXPECT_FALSE(torch::equal(a.get("rng/cpu"), b.get("rng/cpu")));
}

// checkpoint.async at world 1: the save returns before the checkpoint is complete (its
// write is held back 300 ms), training goes on, and finish() commits files equal to a
// synchronous save of the same step.
TEST(Checkpointer, AsyncSaveWritesTheSameFilesAsASyncSave) {
  World1 w;
  TempDir dir("async");
  w.train_step(1);
  torch::manual_seed(5);
  auto sync = w.checkpointer(dir / "sync", false);
  auto c = sync.save(World1::state(1), "test");
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(fs::exists(c->dir + "/COMPLETE"));
  EXPECT_FALSE(sync.pending());

  torch::manual_seed(5);
  auto async = w.checkpointer(dir / "async", true);
  {
    ScopedEnv slow("VLMTRAIN_FAULT_SLOW_SAVE", "300");
    EXPECT_FALSE(async.save(World1::state(1), "test").has_value());
    EXPECT_TRUE(async.pending());
    EXPECT_FALSE(fs::exists(dir / ("async/" + ckpt_step(1))));  // not complete yet: still .step-N.tmp
    w.train_step(2);  // the step goes on while the file is written
    torch::rand({100});
    const auto done = async.finish("at the end");
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->step, 1);
    EXPECT_EQ(done->dir, dir / ("async/" + ckpt_step(1)));
  }
  EXPECT_FALSE(async.pending());
  EXPECT_FALSE(async.finish("again").has_value());  // nothing pending: no-op
  EXPECT_FALSE(async.poll(3).has_value());
  EXPECT_FALSE(fs::exists(dir / ("async/." + ckpt_step(1) + ".tmp")));
  expect_same_checkpoint(dir / ("async/" + ckpt_step(1)), c->dir);
}

// One save in flight at most: the next save first waits for the pending one and commits it;
// poll() commits a finished write.
TEST(Checkpointer, SecondSaveWaitsForTheFirstAndPollCommits) {
  World1 w;
  TempDir dir("async2");
  auto ck = w.checkpointer(dir.path(), true);
  ScopedEnv slow("VLMTRAIN_FAULT_SLOW_SAVE", "200");
  ck.save(World1::state(1), "test");
  ck.save(World1::state(2), "test");  // waits for step 1's write, commits it, then begins step 2
  EXPECT_EQ(vlm::app::complete_checkpoints(dir.path()), (std::vector<std::string>{dir / ckpt_step(1)}));
  EXPECT_TRUE(ck.pending());
  std::optional<vlm::app::CommittedCheckpoint> c;
  for (int i = 0; i < 1500 && !c; ++i) {  // a step end every 20 ms until the write is done
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c = ck.poll(2);
  }
  ASSERT_TRUE(c.has_value()) << "the write did not finish within 30 s";
  EXPECT_EQ(c->step, 2);
  EXPECT_GE(c->seconds, 0.2);  // it was held back 200 ms
  EXPECT_EQ(vlm::app::complete_checkpoints(dir.path()),
            (std::vector<std::string>{dir / ckpt_step(1), dir / ckpt_step(2)}));
}

// A run that ends (an error, a kill) while a write is in flight: the checkpoint stays
// incomplete (no COMPLETE, never loaded) and the previous complete one is untouched.
TEST(Checkpointer, AnInterruptedWriteNeverCompletes) {
  World1 w;
  TempDir dir("async-kill");
  {
    auto ck = w.checkpointer(dir.path(), true);
    ck.save(World1::state(1), "test");
    ck.finish("test");
    ScopedEnv slow("VLMTRAIN_FAULT_SLOW_SAVE", "200");
    ck.save(World1::state(2), "test");
  }  // destroyed with step 2's write in flight: waits for it, commits nothing
  EXPECT_EQ(vlm::app::complete_checkpoints(dir.path()), (std::vector<std::string>{dir / ckpt_step(1)}));
  EXPECT_FALSE(fs::exists(dir / ckpt_step(2)));
  EXPECT_TRUE(fs::exists(dir / ("." + ckpt_step(2) + ".tmp/state-rank00000-of-00001.safetensors")));
  EXPECT_FALSE(fs::exists(dir / ("." + ckpt_step(2) + ".tmp/COMPLETE")));
  EXPECT_EQ(*vlm::app::resolve_resume("auto", dir.path()), dir / ckpt_step(1));
  CheckpointReader r(dir / ckpt_step(1));
  EXPECT_EQ(r.state().step, 1);
}

// A background write that fails (its directory vanished) fails the commit with the write's
// own error; nothing is renamed and the previous checkpoint stays the newest complete one.
TEST(Checkpointer, AFailedBackgroundWriteFailsTheCommit) {
  World1 w;
  TempDir dir("async-fail");
  auto ck = w.checkpointer(dir.path(), true);
  ck.save(World1::state(1), "test");
  ck.finish("test");
  {
    ScopedEnv slow("VLMTRAIN_FAULT_SLOW_SAVE", "300");
    ck.save(World1::state(2), "test");
    fs::remove_all(dir / ("." + ckpt_step(2) + ".tmp"));  // while the writer sleeps
    try {
      ck.finish("test");
      FAIL() << "a failed write was committed";
    } catch (const vlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(ckpt_step(2) + ".tmp"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(ck.pending());
  EXPECT_EQ(vlm::app::complete_checkpoints(dir.path()), (std::vector<std::string>{dir / ckpt_step(1)}));
}

}  // namespace

// Sharded loading (sharding/parallel/sharded_load.h): the model is built on the meta device and
// every rank materialises only what it keeps, from a ParamSource (the seeded random init,
// or an HF checkpoint read through its mmap), with no broadcast. Checked against:
//   - the single-process reference run (no sharding code; fsdp_testing.h reference_run):
//     2 training steps, losses and every parameter within 1e-5, as the FSDP parity tests;
//   - the parameters materialise() / load_module_weights give a whole model: exactly equal
//     (also fp32 checkpoint -> bf16 parameters);
//   - a formula for what each rank reads: its [lo, hi) (optimizer.h owned_range) of every
//     sharded unit plus every element of the others, x 4 bytes of the fp32 checkpoint;
//     over the ranks, each element of a sharded unit is read exactly once.
#include <gtest/gtest.h>

#include <cstdlib>

#include "sharding/parallel/sharded_load.h"
#include "tests/sharding/parallel/fsdp_testing.h"
#include "vlm/model/lora.h"

using namespace vlm::sharding;
using namespace fsdp_testing;

namespace {

struct ExpectedShare {
  int64_t elements = 0;          // this rank's elements to fill
  int64_t sharded_elements = 0;  // of those, in sharded units
  int64_t sharded_total = 0;     // all elements of the sharded units (every rank's together)
  int64_t sharded_units = 0, whole_units = 0;
};

ExpectedShare expected_share(const Config& c, int64_t rank, int64_t world) {
  auto model = make_meta_model(c.dtype, c.tied);
  ExpectedShare e;
  for (const auto& u : resolve_units(*model, options(c))) {
    if (!shards_params(u.sharding)) {
      e.elements += u.numel;
      ++e.whole_units;
      continue;
    }
    const auto [lo, hi] = owned_range(u.numel, world, rank);
    e.elements += hi - lo;
    e.sharded_elements += hi - lo;
    e.sharded_total += u.numel;
    ++e.sharded_units;
  }
  return e;
}

std::string checkpoint_dir_from_env() {
  const char* dir = std::getenv("VLMTRAIN_TEST_SHARDED_LOAD_DIR");
  VLM_CHECK(dir != nullptr && *dir != 0, "VLMTRAIN_TEST_SHARDED_LOAD_DIR is not set (the parent test sets it)");
  return dir;
}

// The tiny model (make_model's values, tied head) written as an fp32 HF checkpoint.
std::string write_tiny_checkpoint(const std::string& name) {
  const std::string dir = (fs::temp_directory_path() / vlm::str(name, "-", getpid())).string();
  fs::remove_all(dir);
  vlm::SaveHfOptions o;
  o.dtype = torch::kFloat32;
  o.max_shard_bytes = 1'000'000;  // several files, so ranges cross into each
  auto model = make_model(torch::kFloat32, /*tied=*/true);
  vlm::save_hf_checkpoint(dir, vlm::module_state(*model), o);
  return dir;
}

uint64_t checkpoint_bytes(const std::string& dir) {
  const vlm::HfCheckpoint ck = vlm::HfCheckpoint::open(dir);
  uint64_t total = 0;
  for (const auto& n : ck.names()) total += ck.info(n).nbytes();
  return total;
}

// Every parameter of `model` equal to `want`'s (same names, exactly).
void expect_same_params(ShardedModel& sm, vlm::VisionLanguageModelImpl& model, vlm::VisionLanguageModelImpl& want, const std::string& tag) {
  const auto got = snapshot(sm, model);
  std::map<std::string, torch::Tensor> ref;
  for (auto& item : want.named_parameters()) ref[item.key()] = item.value().detach().to(torch::kFloat32);
  ASSERT_EQ(got.size(), ref.size()) << tag;
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(ref.count(name)) << tag << ": " << name;
    EXPECT_TRUE(torch::equal(t, ref[name])) << tag << ": " << name << " differs";
  }
}

}  // namespace

// Training after sharded loading equals the reference, and each rank read its share only.
TEST(ShardedLoadDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  ParallelDims dims = init_fsdp_worker();
  const int64_t rank = dims.rank(), world = dims.world_size();
  const std::string dir = checkpoint_dir_from_env();
  const bool quick = std::getenv("VLMTRAIN_TEST_SHARDED_LOAD_QUICK") != nullptr;  // two configurations
  std::vector<Config> configs(4);
  configs[0].load = "init";                          // frozen vision full_shard, merger ddp, LLM full_shard
  configs[1].load = "init";
  configs[1].frozen_vision = false;                  // all fsdp shard_grad_op, untied head
  configs[1].strategy = "shard_grad_op";
  configs[1].tied = false;
  configs[2].load = dir;                             // from the checkpoint
  configs[3].load = dir;
  configs[3].frozen_vision = false;                  // all fsdp full_shard + checkpointing, 2 micro-batches
  configs[3].ckpt = true;
  configs[3].accum = 2;
  if (quick) configs = {configs[1], configs[3]};
  for (Config& c : configs) {
    c.end = 2;  // the start is what differs; two steps show it trains the same
    const std::string tag = rank_tag(dims, c) + (c.load == "init" ? ", init" : ", checkpoint");
    const RunResult want = reference_run(c);
    const RunResult got = sharded_run(dims, c);
    compare(got, want, tag);
    const ExpectedShare e = expected_share(c, rank, world);
    EXPECT_EQ(got.load.elements_filled, e.elements) << tag;
    EXPECT_EQ(got.load.sharded_units, e.sharded_units) << tag;
    EXPECT_EQ(got.load.whole_units, e.whole_units) << tag;
    EXPECT_EQ(got.load.bytes_read, c.load == "init" ? 0u : 4u * static_cast<uint64_t>(e.elements)) << tag;
    // Over the ranks, every element of a sharded unit was filled exactly once.
    torch::Tensor n = torch::tensor({e.sharded_elements}, torch::kInt64);
    dims.control().all_reduce(n, ReduceOp::kSum, "sharded elements");
    EXPECT_EQ(n.item<int64_t>(), e.sharded_total) << tag;
    if (c.load != "init" && world > 1 && !c.frozen_vision) {
      EXPECT_LT(got.load.bytes_read, checkpoint_bytes(dir)) << tag << ": read more than its share";
    }
    std::printf("%s: read %llu of %llu checkpoint bytes, %lld elements filled (%lld sharded units, %lld whole)\n",
                tag.c_str(), static_cast<unsigned long long>(got.load.bytes_read),
                static_cast<unsigned long long>(checkpoint_bytes(dir)), static_cast<long long>(got.load.elements_filled),
                static_cast<long long>(got.load.sharded_units), static_cast<long long>(got.load.whole_units));
  }
  // bf16 parameters from the fp32 checkpoint: exactly materialize()'s bf16 values.
  Config c;
  c.dtype = torch::kBFloat16;
  auto model = make_meta_model(c.dtype);
  auto source = vlm::checkpoint_param_source(*model, vlm::HfCheckpoint::open(dir));
  auto sm = apply_policies(*model, options(c), dims, source.get());
  auto want = make_model(c.dtype);
  expect_same_params(*sm, *model, *want, rank_tag(dims, c));
}

static void launch_sharded_load(int world, bool quick) {
  const std::string dir = write_tiny_checkpoint("vlmtest-sharded-load");
  launch(world, "ShardedLoadDist.DISABLED_Worker", 300, [dir, quick](int) {
    std::vector<std::string> env{"VLMTRAIN_TEST_SHARDED_LOAD_DIR=" + dir};
    if (quick) env.push_back("VLMTRAIN_TEST_SHARDED_LOAD_QUICK=1");
    return env;
  });
  fs::remove_all(dir);
}

TEST(ShardedLoadDist, World2) { launch_sharded_load(2, false); }
// Shards that do not divide the units (padding in the last shards), all-fsdp configurations.
TEST(ShardedLoadDist, World3UnevenShards) { launch_sharded_load(3, true); }

// LoRA adapters attached to a meta model get add_lora's initial values (world 1), and the
// base weights come from the checkpoint.
TEST(ShardedLoad, LoraAdaptersOnMetaModelEqualEagerOnes) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  const std::string dir = write_tiny_checkpoint("vlmtest-sharded-load-lora");
  ShardingOptions o;
  PolicyRule lora{"model.layers.*.self_attn.*_proj", "lora", "full_shard", {}};
  lora.lora.r = 4;
  o.rules = {lora, {"visual.merger", "ddp", "", {}}};
  o.default_policy = "freeze";
  o.default_strategy = "full_shard";
  auto eager = make_model();
  auto sm_eager = apply_policies(*eager, o, dims);
  auto meta = make_meta_model();
  auto source = vlm::checkpoint_param_source(*meta, vlm::HfCheckpoint::open(dir));
  auto sm_meta = apply_policies(*meta, o, dims, source.get());
  int64_t adapters = 0;
  for (auto& item : meta->named_parameters()) adapters += vlm::is_lora_param(item.key());
  EXPECT_GT(adapters, 0);
  const auto want = snapshot(*sm_eager, *eager);
  const auto got = snapshot(*sm_meta, *meta);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << got[i].first;
  }
  fs::remove_all(dir);
}

// Bad checkpoints fail when the source is made, before any parameter gets memory, naming
// the directory and the tensor; a model that is not on meta is refused.
TEST(ShardedLoad, BadCheckpointFailsBeforeAnythingIsMaterialised) {
  auto full = make_model();
  vlm::NamedTensors state = vlm::module_state(*full);
  const std::string dir = (fs::temp_directory_path() / vlm::str("vlmtest-sharded-load-bad-", getpid())).string();
  fs::remove_all(dir);
  vlm::NamedTensors missing(state.begin() + 1, state.end());
  vlm::save_hf_checkpoint(dir, missing, {});
  auto meta = make_meta_model();
  try {
    vlm::checkpoint_param_source(*meta, vlm::HfCheckpoint::open(dir));
    ADD_FAILURE() << "a checkpoint without " << state.front().first << " was accepted";
  } catch (const vlm::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir), std::string::npos) << what;
    EXPECT_NE(what.find(state.front().first), std::string::npos) << what;
    EXPECT_NE(what.find("missing"), std::string::npos) << what;
  }
  EXPECT_TRUE(vlm::has_meta_parameters(*meta));
  fs::remove_all(dir);

  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  auto source = vlm::init_param_source(*full, {torch::kCPU, torch::kFloat32, 7});
  try {
    apply_policies(*full, options(Config{}), dims, source.get());
    ADD_FAILURE() << "sharded loading into a materialised model was accepted";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta device"), std::string::npos) << e.what();
  }
}

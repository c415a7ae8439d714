// Shared by the FSDP engine tests (fsdp_dist_test.cpp, fsdp_plan_dist_test.cpp): the tiny
// model, deterministic samples, the run configurations, the single-process reference run,
// the sharded run, state slices on disk, and the multi-process launch.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include "sharding/parallel/activation_checkpoint.h"
#include "sharding/dist/comm.h"
#include "sharding/parallel/ddp.h"
#include "sharding/parallel/fsdp.h"
#include "app/plan/memory_plan.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/runtime/check.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/meta_init.h"
#include "vlm/io/param_source.h"
#include "vlm/model/vision_language_model.h"
#include "tests/dist_testing.h"

namespace fsdp_testing {

using namespace vlm::sharding;
using namespace vlm::app;  // the cost models (app/plan/)
namespace fs = std::filesystem;


constexpr int kSamples = 6;
constexpr int kSteps = 5;
constexpr double kLr = 1e-4, kMergerLr = 2e-4, kWd = 0.1, kClip = 1.0;

// The tiny model on the meta device in `dtype` (sharded loading materialises it).
inline vlm::VisionLanguageModel make_meta_model(torch::Dtype dtype = torch::kFloat32, bool tied = true) {
  auto cfg = vlm::preset("tiny");
  cfg.tie_word_embeddings = tied;
  return vlm::VisionLanguageModel(cfg, torch::TensorOptions().device(torch::kMeta).dtype(dtype));
}
inline vlm::VisionLanguageModel make_model(torch::Dtype dtype = torch::kFloat32, bool tied = true) {
  vlm::VisionLanguageModel m = make_meta_model(dtype, tied);
  vlm::materialize(*m, {torch::kCPU, dtype, 7});
  return m;
}

struct Sample {
  std::vector<int64_t> ids, labels;
  torch::Tensor pixels;  // [16, 1176]; undefined for text-only
  std::vector<int64_t> grid;
};

// Deterministic sample `i` of step `step` (same on every rank); text_only: no image.
inline Sample make_sample(const vlm::VlmConfig& c, int step, int i, bool text_only = false) {
  torch::manual_seed(1000 * step + i);
  Sample s;
  auto text = torch::randint(10, 1000, {11}, torch::kInt64);
  for (int k = 0; k < 5; ++k) s.ids.push_back(text[k].item<int64_t>());
  if (!text_only) {
    s.ids.push_back(c.vision_start_token_id);
    for (int k = 0; k < 4; ++k) s.ids.push_back(c.image_token_id);
    s.ids.push_back(c.vision_end_token_id);
  }
  s.labels.assign(s.ids.size(), -100);
  for (int k = 5; k < 11; ++k) {
    s.ids.push_back(text[k].item<int64_t>());
    s.labels.push_back(text[k].item<int64_t>());
  }
  auto pixels = torch::randn({16, c.vision.patch_dim()});
  if (!text_only) {
    s.pixels = pixels;
    s.grid = (i % 2 == 0) ? std::vector<int64_t>{1, 4, 4} : std::vector<int64_t>{1, 2, 8};
  }
  return s;
}

// Equal-length samples -> one Batch without padding.
inline vlm::Batch pack(const std::vector<Sample>& samples, torch::Dtype pixel_dtype = torch::kFloat32) {
  const int64_t b = static_cast<int64_t>(samples.size()), l = static_cast<int64_t>(samples[0].ids.size());
  vlm::Batch batch;
  std::vector<int64_t> ids, labels, grid;
  std::vector<torch::Tensor> pix;
  for (const auto& s : samples) {
    ids.insert(ids.end(), s.ids.begin(), s.ids.end());
    labels.insert(labels.end(), s.labels.begin(), s.labels.end());
    grid.insert(grid.end(), s.grid.begin(), s.grid.end());
    if (s.pixels.defined()) pix.push_back(s.pixels);
  }
  batch.input_ids = torch::tensor(ids, torch::kInt64).view({b, l});
  batch.labels = torch::tensor(labels, torch::kInt64).view({b, l});
  if (!pix.empty()) {
    batch.pixel_values = torch::cat(pix).to(pixel_dtype);
    batch.image_grid_thw = torch::tensor(grid, torch::kInt64).view({-1, 3});
  }
  return batch;
}

inline bool no_decay(const std::string& n) {
  auto ends = [&](const std::string& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  return ends(".bias") || (n.find("norm") != std::string::npos && ends(".weight")) || ends("ln_q.weight");
}

inline bool is_vision_tower(const std::string& name) {
  return name.rfind("visual.patch_embed.", 0) == 0 || name.rfind("visual.blocks.", 0) == 0;
}

struct Config {
  std::string strategy = "full_shard";
  bool frozen_vision = true;
  bool ckpt = false;
  int accum = 1;
  torch::Dtype dtype = torch::kFloat32;
  torch::Dtype reduce = torch::kFloat32;
  bool tied = true;
  double lr = kLr;
  bool fixed_data = false;  // every step uses step 0's samples (for "loss falls")
  int begin = 0, end = kSteps;  // steps [begin, end)
  std::string save_dir, load_dir;  // checkpoint state after the run / before it
  bool text_only_rank1 = false;    // rank 1's samples have no image
  // Rank 0 launches its DDP buckets from finish_backward only, the other ranks during
  // backward: the ranks interleave DDP and FSDP ops in different orders.
  bool ddp_late_rank0 = false;
  bool merger_ddp = false;  // with frozen_vision false: visual.merger on DDP, the rest FSDP
  bool unsharded_accum = false;  // ShardingOptions::fsdp_accumulate_unsharded
  std::string frozen_strategy = "full_shard";  // with frozen_vision: the frozen tower's strategy
  // How the weights arrive: "" materialised on every rank (rank 1 perturbed) and broadcast
  // by apply_policies; "init" sharded loading of make_model's random init; a path: sharded
  // loading from that HF checkpoint (sharded_load.h).
  std::string load;
  std::string tag() const {
    return vlm::str(frozen_vision ? "frozen-vision" : (merger_ddp ? "fsdp + ddp merger" : "all-fsdp"), " ", strategy, ckpt ? " +ckpt" : "",
                    " accum ", accum, dtype == torch::kBFloat16 ? " bf16" : "",
                    reduce == torch::kBFloat16 ? " bf16-reduce" : "", unsharded_accum ? " unsharded-accum" : "");
  }
};

inline int sample_step(const Config& c, int step) { return c.fixed_data ? 0 : step; }

struct RunResult {
  std::vector<double> losses;  // global loss per step
  std::vector<std::pair<std::string, torch::Tensor>> params;  // after the last step
  CommStats step1;              // traffic of step 1 (from the token count to zero_grad)
  std::vector<std::pair<std::string, CommStats>> step1_comms;  // the same per data-plane comm (plane name)
  std::vector<double> norms;    // gradient norm before clipping, per step
  MemoryReport memory;          // after the last step
  ShardedLoadStats load;        // what sharded loading did on this rank
  double seconds = 0;
};

// Single process, no sharding code. With c.text_only_rank1, the samples rank 1 of a world
// of `world` would get (i % world == 1) have no image, as in sharded_run; they run as a
// second forward (pack() needs equal lengths) whose loss sum joins the first's.
inline RunResult reference_run(const Config& c, int world = 2) {
  auto model = make_model(torch::kFloat32, c.tied);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<torch::Tensor> trainable;
  for (auto& item : model->named_parameters()) {
    torch::Tensor p = item.value();
    if (c.frozen_vision && is_vision_tower(item.key())) {
      p.set_requires_grad(false);
      continue;
    }
    auto o = std::make_unique<torch::optim::AdamWOptions>(item.key().rfind("visual.merger.", 0) == 0 ? 2 * c.lr : c.lr);
    o->weight_decay(no_decay(item.key()) ? 0.0 : kWd);
    groups.emplace_back(std::vector<torch::Tensor>{p}, std::move(o));
    trainable.push_back(p);
  }
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(c.lr));
  RunResult r;
  for (int step = 0; step < c.end; ++step) {
    std::vector<Sample> image, text;
    for (int i = 0; i < kSamples; ++i) {
      const bool text_only = c.text_only_rank1 && i % world == 1;
      (text_only ? text : image).push_back(make_sample(model->cfg, sample_step(c, step), i, text_only));
    }
    torch::Tensor loss_sum = torch::zeros({}, torch::kFloat32);
    int64_t tokens = 0;
    for (const auto* group : {&image, &text}) {
      if (group->empty()) continue;
      auto out = model->forward(pack(*group));
      loss_sum = loss_sum + out.loss_sum;
      tokens += out.n_tokens;
    }
    (loss_sum / static_cast<double>(tokens)).backward();
    r.losses.push_back(loss_sum.item<double>() / static_cast<double>(tokens));
    // The norm in fp64 (clip_grad_norm_'s own, fp32 per parameter, was 2.7e-5 relative off
    // the fp64 value on this model); the clip itself as torch does it.
    double sumsq = 0;
    for (const auto& p : trainable)
      if (p.grad().defined()) sumsq += p.grad().to(torch::kFloat64).square().sum().item<double>();
    r.norms.push_back(std::sqrt(sumsq));
    torch::nn::utils::clip_grad_norm_(trainable, kClip);
    opt.step();
    opt.zero_grad();
  }
  for (auto& item : model->named_parameters()) r.params.emplace_back(item.key(), item.value().detach().clone());
  return r;
}

inline ShardingOptions options(const Config& c) {
  ShardingOptions o;
  if (c.frozen_vision) {
    o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", c.frozen_strategy},
               {"visual.merger", "ddp", ""},
               {"model.*|lm_head", "fsdp", c.strategy}};
    if (c.ckpt) o.checkpoint_match = "model.layers.*|model.embed_tokens|visual.merger";
  } else {
    o.default_policy = "fsdp";
    o.default_strategy = c.strategy;
    if (c.merger_ddp) o.rules = {{"visual.merger", "ddp", ""}};
    if (c.ckpt) o.checkpoint_match = "model.layers.*|model.embed_tokens|visual.merger|visual.blocks.*";
  }
  o.param_dtype = c.dtype;
  o.reduce_dtype = c.reduce;
  o.ddp_bucket_mb = 0.05;
  o.fsdp_accumulate_unsharded = c.unsharded_accum;
  o.optim.lr = c.lr;
  o.optim.weight_decay = kWd;
  o.optim.grad_clip = kClip;
  o.optim.groups = {{"visual.merger", 2 * c.lr, std::nullopt}};
  return o;
}

// Every parameter as an unsharded tensor (collective when there are FSDP units).
inline std::vector<std::pair<std::string, torch::Tensor>> snapshot(ShardedModel& sm, vlm::VisionLanguageModelImpl& model) {
  if (sm.fsdp()) sm.fsdp()->gather_all("test snapshot");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& item : model.named_parameters())
    out.emplace_back(item.key(), item.value().detach().to(torch::kFloat32).clone());
  if (sm.fsdp()) sm.fsdp()->release_all();
  return out;
}

// Checkpoint slices as raw files: <dir>/<key, '/' -> '#'>.<lo>.<hi> (fp32 or param dtype bytes).
inline void save_slices(const std::vector<StateSlice>& slices, const std::string& dir) {
  fs::create_directories(dir);
  for (const auto& s : slices) {
    std::string key = s.key;
    std::replace(key.begin(), key.end(), '/', '#');
    const torch::Tensor t = s.data.to(torch::kFloat32).contiguous();
    std::ofstream f(vlm::str(dir, "/", key, ".", s.lo, ".", s.hi), std::ios::binary);
    f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 4));
  }
}

inline StateReader slice_reader(const std::string& dir) {
  return [dir](const std::string& want, int64_t lo, int64_t hi) {
    std::string key = want;
    std::replace(key.begin(), key.end(), '/', '#');
    torch::Tensor out = torch::empty({hi - lo}, torch::kFloat32);
    int64_t covered = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(key + ".", 0) != 0) continue;
      const std::string rest = name.substr(key.size() + 1);
      const size_t dot = rest.find('.');
      const int64_t a = std::stoll(rest.substr(0, dot)), b = std::stoll(rest.substr(dot + 1));
      const int64_t x = std::max(a, lo), y = std::min(b, hi);
      if (x >= y) continue;
      torch::Tensor t = torch::empty({b - a}, torch::kFloat32);
      std::ifstream f(e.path(), std::ios::binary);
      f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>((b - a) * 4));
      out.narrow(0, x - lo, y - x).copy_(t.narrow(0, x - a, y - x));
      covered += y - x;
    }
    VLM_CHECK(covered == hi - lo, "test reader: ", want, " [", lo, ", ", hi, ") covered ", covered);
    return out;
  };
}

inline RunResult sharded_run(ParallelDims& dims, const Config& c) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = dims.world_size(), rank = dims.rank();
  vlm::VisionLanguageModel model{nullptr};
  std::unique_ptr<vlm::ParamSource> source;
  if (c.load.empty()) {
    model = make_model(c.dtype, c.tied);
    if (rank != 0) {  // start the ranks apart: apply_policies' broadcast must make them equal
      torch::NoGradGuard g;
      for (auto& p : model->parameters()) p.add_(0.5);
    }
  } else {
    model = make_meta_model(c.dtype, c.tied);
    source = c.load == "init" ? vlm::init_param_source(*model, {torch::kCPU, c.dtype, 7})
                              : vlm::checkpoint_param_source(*model, vlm::HfCheckpoint::open(c.load));
  }
  auto sm = apply_policies(*model, options(c), dims, source.get());
  source.reset();
  EXPECT_TRUE(sm->notes().empty()) << sm->notes().front();
  const auto initial = snapshot(*sm, *model);
  if (!c.load_dir.empty()) sm->load_state(slice_reader(c.load_dir), c.begin);
  sm->reset_gather_peak();  // the snapshot gathered everything
  if (c.ddp_late_rank0 && rank == 0) {
    EXPECT_TRUE(sm->reducer() != nullptr) << "ddp_late_rank0 needs a DDP unit";
    if (sm->reducer()) sm->reducer()->set_overlap(false);
  }
  Comm& comm = dims.comm();
  RunResult r;
  r.load = sm->load_stats();
  for (int step = c.begin; step < c.end; ++step) {
    std::vector<std::vector<Sample>> micro(c.accum);
    int64_t local_tokens = 0;
    for (int i = rank, j = 0; i < kSamples; i += n, ++j) {
      micro[j % c.accum].push_back(make_sample(model->cfg, sample_step(c, step), i, c.text_only_rank1 && rank == 1));
      for (auto l : micro[j % c.accum].back().labels) local_tokens += l != -100;
    }
    if (step == c.begin + 1) dims.reset_data_stats();
    const int64_t tokens = global_token_count(comm, local_tokens);
    double loss_sum = 0;
    for (int k = 0; k < c.accum; ++k) {
      if (micro[k].empty()) {  // filler: runs every unit, contributes nothing
        Sample f = make_sample(model->cfg, step, 0, c.text_only_rank1 && rank == 1);
        std::fill(f.labels.begin(), f.labels.end(), -100);
        micro[k].push_back(f);
      }
      sm->set_sync(k == c.accum - 1);
      auto out = model->forward(pack(micro[k], c.dtype));
      (out.loss_sum / static_cast<double>(tokens)).backward();
      sm->finish_backward("step " + std::to_string(step));
      loss_sum += out.loss_sum.item<double>();
    }
    torch::Tensor l = torch::tensor({loss_sum}, torch::kDouble);
    comm.all_reduce(l, ReduceOp::kSum, "loss");
    r.losses.push_back(l.item<double>() / static_cast<double>(tokens));
    const double norm = sm->optimizer().clip_grad_norm();
    EXPECT_TRUE(std::isfinite(norm));
    r.norms.push_back(norm);
    sm->optimizer().step();
    sm->optimizer().zero_grad();
    if (step == c.begin + 1) {
      r.step1 = dims.data_stats();
      for (Comm* dc : dims.data_comms()) r.step1_comms.emplace_back(dc->plane(), dc->stats());
    }
  }
  r.memory = sm->memory();
  if (!c.save_dir.empty()) save_slices(sm->state_slices(), c.save_dir);
  r.params = snapshot(*sm, *model);
  // Frozen: bit-identical, no grad, no optimizer state.
  if (c.frozen_vision) {
    for (size_t i = 0; i < r.params.size(); ++i) {
      if (!is_vision_tower(r.params[i].first)) continue;
      EXPECT_TRUE(torch::equal(r.params[i].second, initial[i].second)) << r.params[i].first << " changed while frozen";
    }
    EXPECT_GT(sm->runner()->no_grad_calls(), 0) << "frozen vision ran with autograd";
  }
  if (c.ckpt) {
    EXPECT_GT(sm->runner()->checkpointed_calls(), 0);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Losses (relative) and parameters (absolute) against `want`, over the steps `got` ran.
inline void compare(const RunResult& got, const RunResult& want, const std::string& tag, double loss_tol = 1e-5,
             double param_tol = 1e-5, int begin = 0) {
  ASSERT_LE(begin + got.losses.size(), want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[begin + s], loss_tol * std::abs(want.losses[begin + s]))
        << tag << " step " << begin + s;
  ASSERT_EQ(got.params.size(), want.params.size());
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < got.params.size(); ++i) {
    ASSERT_EQ(got.params[i].first, want.params[i].first);
    const double d = (got.params[i].second - want.params[i].second).abs().max().item<double>();
    if (d > worst) {
      worst = d;
      worst_name = got.params[i].first;
    }
  }
  if (param_tol > 0) {
    EXPECT_LE(worst, param_tol) << tag << ": worst parameter " << worst_name;
  }
  std::printf("%s: loss %.6f -> %.6f (ref %.6f), max |param diff| %.3g (%s), %.2f s\n", tag.c_str(),
              got.losses.front(), got.losses.back(), want.losses[begin + got.losses.size() - 1], worst,
              worst_name.c_str(), got.seconds);
}

// VLMTRAIN_TEST_ONE_GROUP=1: every data-plane lane on one group (ParallelOptions::lanes = false),
// the negative control of lanes_dist_test.cpp; VLMTRAIN_TEST_TIMEOUT_S: the collective timeout;
// VLMTRAIN_TEST_DP_SHARD=D: the hybrid_shard mesh with shard groups of D ranks (hybrid_dist_test.cpp).
inline ParallelDims init_fsdp_worker() {
  ParallelOptions o;
  const char* t = std::getenv("VLMTRAIN_TEST_TIMEOUT_S");
  o.timeout = std::chrono::seconds(t != nullptr ? std::atoi(t) : 60);
  o.device = "cpu";
  const char* one = std::getenv("VLMTRAIN_TEST_ONE_GROUP");
  o.lanes = one == nullptr || std::string(one) != "1";
  if (const char* d = std::getenv("VLMTRAIN_TEST_DP_SHARD")) {
    o.mesh = true;
    o.dp_shard = std::atoi(d);
  }
  return ParallelDims::init(detect_dist_env(process_env()), o);
}

inline std::string rank_tag(ParallelDims& dims, const Config& c) {
  return vlm::str(c.tag(), ", world ", dims.world_size(), ", rank ", dims.rank());
}

inline std::vector<vlm::test::WorkerResult> launch(int world, const std::string& worker, int timeout_s,
                                          std::function<std::vector<std::string>(int)> env = nullptr) {
  vlm::test::DistRun run;
  run.world_size = world;
  run.timeout = std::chrono::seconds(timeout_s);
  run.worker_test = worker;
  run.extra_env = std::move(env);
  auto results = vlm::test::run_workers(run);
  EXPECT_TRUE(vlm::test::all_ok(results));
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
  return results;
}

}  // namespace fsdp_testing

// FSDP runtime (full_shard / shard_grad_op / no_shard, frozen sharded units), activation
// checkpointing, mixed precision, memory and traffic accounting, and world-size-independent
// checkpoint state, with real worker processes on Gloo over loopback, against a
// single-process reference that uses no sharding code (plain autograd on the whole global
// batch, torch::nn::utils::clip_grad_norm_, torch::optim::AdamW).
//
// Data and optimizer as in ddp_dist_test.cpp: tiny preset (tied embeddings), fp32, seed 7;
// 6 equal-length samples per step (5 text ids, <vs>, 4 image tokens, <ve>, 6 supervised
// ids; a 16-patch image each); rank r takes samples r, r+N, ...; micro-batch k of G takes
// a rank's j-th sample when j % G == k (an empty micro-batch is a filler with every label
// -100). Each micro-batch loss / global supervised tokens; lr 1e-4 (merger 2e-4), weight
// decay 0.1 except biases and norms, clip 1.0.
// Configurations:
//   frozen-vision: visual.patch_embed|visual.blocks.* freeze + full_shard (frozen sharded:
//                  gather only), visual.merger ddp, model.*|lm_head fsdp <strategy>;
//   all-fsdp:      every unit fsdp <strategy> (vision tower trainable and sharded).
// Activation checkpointing (when on): model.layers.*, model.embed_tokens (with its tied
// lm_head call), visual.merger (a ddp unit); all-fsdp adds visual.blocks.*.
// Tolerances: losses 1e-5 relative, parameters 1e-5 absolute after the run (fp32 summation
// order only; see ddp_dist_test.cpp for why 1e-5 with lr 1e-4).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "sharding/activation_checkpoint.h"
#include "sharding/comm.h"
#include "sharding/ddp.h"
#include "sharding/fsdp.h"
#include "sharding/memory_plan.h"
#include "sharding/parallel_dims.h"
#include "sharding/sharded_model.h"
#include "tests/dist_testing.h"
#include "vlm/check.h"
#include "vlm/meta_init.h"
#include "vlm/qwen2_vl.h"

using namespace vlm::sharding;
namespace fs = std::filesystem;

namespace {

constexpr int kSamples = 6;
constexpr int kSteps = 5;
constexpr double kLr = 1e-4, kMergerLr = 2e-4, kWd = 0.1, kClip = 1.0;

vlm::Qwen2VL make_model(torch::Dtype dtype = torch::kFloat32, bool tied = true) {
  auto cfg = vlm::preset("tiny");
  cfg.tie_word_embeddings = tied;
  vlm::Qwen2VL m(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, dtype, 7});
  return m;
}

struct Sample {
  std::vector<int64_t> ids, labels;
  torch::Tensor pixels;  // [16, 1176]; undefined for text-only
  std::vector<int64_t> grid;
};

// Deterministic sample `i` of step `step` (same on every rank); text_only: no image.
Sample make_sample(const vlm::VlmConfig& c, int step, int i, bool text_only = false) {
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
vlm::Batch pack(const std::vector<Sample>& samples, torch::Dtype pixel_dtype = torch::kFloat32) {
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

bool no_decay(const std::string& n) {
  auto ends = [&](const std::string& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  return ends(".bias") || (n.find("norm") != std::string::npos && ends(".weight")) || ends("ln_q.weight");
}

bool is_vision_tower(const std::string& name) {
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
  std::string tag() const {
    return vlm::str(frozen_vision ? "frozen-vision" : "all-fsdp", " ", strategy, ckpt ? " +ckpt" : "",
                    " accum ", accum, dtype == torch::kBFloat16 ? " bf16" : "",
                    reduce == torch::kBFloat16 ? " bf16-reduce" : "");
  }
};

int sample_step(const Config& c, int step) { return c.fixed_data ? 0 : step; }

struct RunResult {
  std::vector<double> losses;  // global loss per step
  std::vector<std::pair<std::string, torch::Tensor>> params;  // after the last step
  CommStats step1;              // traffic of step 1 (from the token count to zero_grad)
  MemoryReport memory;          // after the last step
  double seconds = 0;
};

// Single process, no sharding code.
RunResult reference_run(const Config& c) {
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
    std::vector<Sample> all;
    for (int i = 0; i < kSamples; ++i) all.push_back(make_sample(model->cfg, sample_step(c, step), i));
    auto out = model->forward(pack(all));
    (out.loss_sum / static_cast<double>(out.n_tokens)).backward();
    r.losses.push_back(out.loss_sum.item<double>() / static_cast<double>(out.n_tokens));
    torch::nn::utils::clip_grad_norm_(trainable, kClip);
    opt.step();
    opt.zero_grad();
  }
  for (auto& item : model->named_parameters()) r.params.emplace_back(item.key(), item.value().detach().clone());
  return r;
}

ShardingOptions options(const Config& c) {
  ShardingOptions o;
  if (c.frozen_vision) {
    o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", "full_shard"},
               {"visual.merger", "ddp", ""},
               {"model.*|lm_head", "fsdp", c.strategy}};
    if (c.ckpt) o.checkpoint_match = "model.layers.*|model.embed_tokens|visual.merger";
  } else {
    o.default_policy = "fsdp";
    o.default_strategy = c.strategy;
    if (c.ckpt) o.checkpoint_match = "model.layers.*|model.embed_tokens|visual.merger|visual.blocks.*";
  }
  o.param_dtype = c.dtype;
  o.reduce_dtype = c.reduce;
  o.ddp_bucket_mb = 0.05;
  o.optim.lr = c.lr;
  o.optim.weight_decay = kWd;
  o.optim.grad_clip = kClip;
  o.optim.groups = {{"visual.merger", 2 * c.lr, std::nullopt}};
  return o;
}

// Every parameter as an unsharded tensor (collective when there are FSDP units).
std::vector<std::pair<std::string, torch::Tensor>> snapshot(ShardedModel& sm, vlm::Qwen2VLImpl& model) {
  if (sm.fsdp()) sm.fsdp()->gather_all("test snapshot");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& item : model.named_parameters())
    out.emplace_back(item.key(), item.value().detach().to(torch::kFloat32).clone());
  if (sm.fsdp()) sm.fsdp()->release_all();
  return out;
}

// Checkpoint slices as raw files: <dir>/<key, '/' -> '#'>.<lo>.<hi> (fp32 or param dtype bytes).
void save_slices(const std::vector<StateSlice>& slices, const std::string& dir) {
  fs::create_directories(dir);
  for (const auto& s : slices) {
    std::string key = s.key;
    std::replace(key.begin(), key.end(), '/', '#');
    const torch::Tensor t = s.data.to(torch::kFloat32).contiguous();
    std::ofstream f(vlm::str(dir, "/", key, ".", s.lo, ".", s.hi), std::ios::binary);
    f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 4));
  }
}

StateReader slice_reader(const std::string& dir) {
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

RunResult sharded_run(ParallelDims& dims, const Config& c) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = dims.world_size(), rank = dims.rank();
  auto model = make_model(c.dtype, c.tied);
  if (rank != 0) {  // start the ranks apart: apply_policies' broadcast must make them equal
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(0.5);
  }
  auto sm = apply_policies(*model, options(c), dims);
  EXPECT_TRUE(sm->notes().empty()) << sm->notes().front();
  const auto initial = snapshot(*sm, *model);
  if (!c.load_dir.empty()) sm->load_state(slice_reader(c.load_dir), c.begin);
  sm->reset_gather_peak();  // the snapshot gathered everything
  Comm& comm = dims.comm();
  RunResult r;
  for (int step = c.begin; step < c.end; ++step) {
    std::vector<std::vector<Sample>> micro(c.accum);
    int64_t local_tokens = 0;
    for (int i = rank, j = 0; i < kSamples; i += n, ++j) {
      micro[j % c.accum].push_back(make_sample(model->cfg, sample_step(c, step), i, c.text_only_rank1 && rank == 1));
      for (auto l : micro[j % c.accum].back().labels) local_tokens += l != -100;
    }
    if (step == c.begin + 1) comm.reset_stats();
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
    sm->optimizer().step();
    sm->optimizer().zero_grad();
    if (step == c.begin + 1) r.step1 = comm.stats();
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
void compare(const RunResult& got, const RunResult& want, const std::string& tag, double loss_tol = 1e-5,
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

ParallelDims init_fsdp_worker() {
  ParallelOptions o;
  o.timeout = std::chrono::seconds(60);
  o.device = "cpu";
  return ParallelDims::init(detect_dist_env(process_env()), o);
}

std::string rank_tag(ParallelDims& dims, const Config& c) {
  return vlm::str(c.tag(), ", world ", dims.world_size(), ", rank ", dims.rank());
}

std::vector<vlmtest::WorkerResult> launch(int world, const std::string& worker, int timeout_s,
                                          std::function<std::vector<std::string>(int)> env = nullptr) {
  vlmtest::DistRun run;
  run.world_size = world;
  run.timeout = std::chrono::seconds(timeout_s);
  run.worker_test = worker;
  run.extra_env = std::move(env);
  auto results = vlmtest::run_workers(run);
  EXPECT_TRUE(vlmtest::all_ok(results));
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
  return results;
}

}  // namespace

// ---------------------------------------------------------------- parity

// World 2: full_shard with and without checkpointing, accumulation 1 and 3; shard_grad_op
// and no_shard without checkpointing at accumulation 1 and with it at 3. Other worlds: a
// subset (full_shard +ckpt accum 3, shard_grad_op accum 1).
TEST(FsdpDist, DISABLED_ParityWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  const RunResult ref = reference_run(Config{});
  std::vector<Config> cases;
  for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"})
    for (bool ckpt : {false, true})
      for (int accum : {1, 3}) {
        Config c;
        c.strategy = strategy;
        c.ckpt = ckpt;
        c.accum = accum;
        const bool subset = (c.strategy == "full_shard" && ckpt && accum == 3) ||
                            (c.strategy == "shard_grad_op" && !ckpt && accum == 1);
        const bool world2 = c.strategy == "full_shard" || ckpt == (accum == 3);
        if (dims.world_size() == 2 ? world2 : subset) cases.push_back(c);
      }
  for (const auto& c : cases) compare(sharded_run(dims, c), ref, rank_tag(dims, c));
  dims.comm().barrier("end");
}

TEST(FsdpDist, ParityWorld2) { launch(2, "FsdpDist.DISABLED_ParityWorker", 300); }
TEST(FsdpDist, ParityWorld3) { launch(3, "FsdpDist.DISABLED_ParityWorker", 300); }

// World size 1 (no processes): FSDP units still run (one shard = the whole unit) and give
// the plain result. Also: a non-finite gradient gives a non-finite norm, and zero_grad
// clears the FSDP shard grads (the trainer's non-finite guard).
TEST(FsdpDist, SingleProcess) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  const RunResult ref = reference_run(Config{});
  Config a;
  a.ckpt = true;
  a.accum = 3;
  compare(sharded_run(dims, a), ref, a.tag() + ", world 1");
  Config b;
  b.strategy = "shard_grad_op";
  compare(sharded_run(dims, b), ref, b.tag() + ", world 1");

  auto model = make_model();
  auto sm = apply_policies(*model, options(Config{}), dims);
  auto out = model->forward(pack({make_sample(model->cfg, 0, 0)}));
  (out.loss_sum * std::nan("")).backward();
  sm->finish_backward("nan test");
  EXPECT_TRUE(std::isnan(sm->optimizer().clip_grad_norm()));
  sm->optimizer().zero_grad();
  for (const auto& u : sm->fsdp()->units())
    if (u->trainable()) {
      EXPECT_EQ(u->shard_grad().abs().sum().item<double>(), 0.0) << u->path();
    }
  EXPECT_EQ(sm->optimizer().clip_grad_norm(), 0.0);
}

// ---------------------------------------------------------------- activation checkpointing

// One process, ddp everywhere, every unit checkpointed: the gradients of one backward equal
// a plain model's (1e-6 of the largest gradient), and every unit was recomputed.
TEST(FsdpDist, CheckpointGradientsMatchPlain) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  auto plain = make_model();
  auto model = make_model();
  ShardingOptions o;
  o.checkpoint_match = "visual.*|model.*|lm_head";
  auto sm = apply_policies(*model, o, dims);
  const vlm::Batch batch = pack({make_sample(model->cfg, 0, 0), make_sample(model->cfg, 0, 1)});
  const int64_t before = checkpoint_recomputes();
  auto out = model->forward(batch);
  (out.loss_sum / static_cast<double>(out.n_tokens)).backward();
  sm->finish_backward("ckpt test");
  const int64_t recomputed = checkpoint_recomputes() - before;
  auto ref = plain->forward(batch);
  (ref.loss_sum / static_cast<double>(ref.n_tokens)).backward();
  EXPECT_EQ(out.loss_sum.item<double>(), ref.loss_sum.item<double>());
  auto got = model->named_parameters();
  double worst = 0, gmax = 0;
  std::string worst_name;
  for (const auto& item : plain->named_parameters()) {
    const torch::Tensor& g = got[item.key()].grad();
    ASSERT_TRUE(g.defined()) << item.key();
    const double d = (g - item.value().grad()).abs().max().item<double>();
    if (d > worst) {
      worst = d;
      worst_name = item.key();
    }
    gmax = std::max(gmax, item.value().grad().abs().max().item<double>());
  }
  EXPECT_LE(worst, 1e-6 * gmax) << worst_name;
  const int64_t units = static_cast<int64_t>(model->units().size());
  EXPECT_EQ(sm->runner()->checkpointed_calls(), units);
  EXPECT_EQ(recomputed, units);
  std::printf("checkpointing: %lld units recomputed, max |grad diff| %.3g (%s) of max |grad| %.3g\n",
              static_cast<long long>(recomputed), worst, worst_name.c_str(), gmax);
}

// ---------------------------------------------------------------- traffic and memory

// World 4, all-fsdp. Traffic of one step (step 1), Comm's logical bytes of the all-gathers
// and reduce-scatters (M = sum over units of N*S x 4 bytes, fp32): full_shard
// 3(N-1)/N M - (N-1)/N M_L, where L is the unit of the last call (lm_head), which stays
// gathered from its forward into its backward; shard_grad_op 2(N-1)/N M. With the tied
// embedding the embedding unit E is called twice (model.embed_tokens, lm_head) and
// gathered twice more, once of which is the kept last call (L = E): 3(N-1)/N M +
// (N-1)/N M_E under full_shard. Memory (full_shard): persistent params + optimizer state
// per rank within 5% of the total / N (+ padding); three units gathered at once at the peak
// (the running one and two prefetched), within the bytes of the three largest units.
// Losses and parameters also match the single-process run.
TEST(FsdpDist, DISABLED_TrafficMemoryWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  const int n = dims.world_size();
  for (bool tied : {false, true}) {
    Config base;
    base.frozen_vision = false;
    base.tied = tied;
    base.end = 2;
    const RunResult ref = reference_run(base);
    // Unit sizes (unsharded and padded).
    auto m = make_model(torch::kFloat32, tied);
    double flat_bytes = 0, embed_bytes = 0, head_bytes = 0, total_numel = 0, pad_numel = 0;
    std::vector<double> unit_bytes;
    for (const auto& u : m->units()) {
      if (!u.shares_params_with.empty()) continue;
      const int64_t p = vlm::count_parameters(*u.module);
      const int64_t padded = (p + n - 1) / n * n;
      flat_bytes += 4.0 * padded;
      total_numel += p;
      pad_numel += padded - p;
      if (u.path == "model.embed_tokens") embed_bytes = 4.0 * padded;
      if (u.path == "lm_head") head_bytes = 4.0 * padded;
      unit_bytes.push_back(4.0 * padded);
    }
    std::sort(unit_bytes.rbegin(), unit_bytes.rend());
    const double three_largest = unit_bytes.at(0) + unit_bytes.at(1) + unit_bytes.at(2);
    for (const char* strategy : {"full_shard", "shard_grad_op"}) {
      Config c = base;
      c.strategy = strategy;
      const RunResult r = sharded_run(dims, c);
      compare(r, ref, rank_tag(dims, c) + (tied ? " tied" : " untied"));
      const double ring = (n - 1.0) / n;
      const bool full = c.strategy == "full_shard";
      const double last_bytes = tied ? embed_bytes : head_bytes;  // the unit of the lm_head call
      ASSERT_GT(last_bytes, 0.0);
      const double want = full ? 3 * ring * flat_bytes + (tied ? 2 * ring * embed_bytes : 0.0) - ring * last_bytes
                               : 2 * ring * flat_bytes;
      const auto& ag = r.step1[OpKind::kAllGather];
      const auto& rs = r.step1[OpKind::kReduceScatter];
      const double got = ag.logical_bytes + rs.logical_bytes;
      EXPECT_NEAR(got, want, 0.01 * want) << c.tag();
      if (dims.rank() == 0)
        std::printf("traffic %s %s world %d: M = %.0f B; logical all-gather %.0f B + reduce-scatter %.0f B = %.0f B "
                    "= %.4f x (N-1)/N M (expected %.4f); bytes moved by the Gloo fallbacks: all-gather %.0f B, "
                    "reduce-scatter (as all-to-all) %.0f B\n",
                    c.strategy.c_str(), tied ? "tied" : "untied", n, flat_bytes, ag.logical_bytes, rs.logical_bytes,
                    got, got / (ring * flat_bytes), want / (ring * flat_bytes), ag.wire_bytes, rs.wire_bytes);
      if (full) {
        const double total = 12.0 * total_numel;  // fp32 params + m + v
        const double mine = r.memory.param_bytes + r.memory.optim_bytes;
        const double pad = 12.0 * pad_numel;
        EXPECT_LE(mine, 1.05 * total / n + pad) << "rank " << dims.rank();
        EXPECT_GE(mine, 0.95 * total / n - pad) << "rank " << dims.rank();
        EXPECT_EQ(r.memory.gathered_peak_units, 3);  // the second look-ahead happens (e.g. over model.norm)
        EXPECT_LE(r.memory.gathered_peak_bytes, three_largest);
        EXPECT_EQ(r.memory.gathered_bytes, 0.0);
        std::printf("memory rank %d (%s): params %.0f B + grads %.0f B + optimizer %.0f B; params+optimizer %.0f B "
                    "vs total/N %.0f B (%.2f%%); gathered peak %lld units, %.0f B (three largest units %.0f B)\n",
                    dims.rank(), tied ? "tied" : "untied", r.memory.param_bytes, r.memory.grad_bytes,
                    r.memory.optim_bytes, mine, total / n, 100.0 * (mine / (total / n) - 1),
                    static_cast<long long>(r.memory.gathered_peak_units), r.memory.gathered_peak_bytes,
                    three_largest);
      }
    }
  }
  dims.comm().barrier("end");
}

TEST(FsdpDist, TrafficMemoryWorld4) {
  auto results = launch(4, "FsdpDist.DISABLED_TrafficMemoryWorker", 240);
  for (size_t i = 1; i < results.size(); ++i) {
    std::istringstream lines(results[i].output);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("memory rank", 0) == 0) std::printf("%s\n", line.c_str());
  }
}

// ---------------------------------------------------------------- memory plan vs engine

// The memory plan (memory_plan.h, what `vlmtrain plan` prints) against the engine's own
// accounting (ShardedModel::memory(): the tensors it holds, the flat buffers it gathered,
// the reduce-scatter buffers it had in flight) after two steps, bf16 params and fp32 reduce
// (gradients fp32, unlike the params), for frozen-vision full_shard (frozen sharded vision,
// ddp merger, full_shard LLM, 2 micro-batches) and all-fsdp shard_grad_op. Params and grads:
// equal. Optimizer state: the plan counts padded shards S, the engine [hi - lo] (equal on
// rank 0; the last rank holds less, by at most 12 B x the padding). Transient: measured <=
// planned, and the reduce-scatter peak is at least the largest unit's buffers.
static void check_plan_vs_engine(ParallelDims& dims) {
  const int n = dims.world_size();
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    Config c;
    c.strategy = strategy;
    c.frozen_vision = c.strategy == "full_shard";
    c.accum = c.frozen_vision ? 2 : 1;
    c.dtype = torch::kBFloat16;
    c.end = 2;
    const RunResult r = sharded_run(dims, c);
    auto model = make_model(c.dtype, c.tied);
    const auto units = resolve_units(*model, options(c));
    const MemoryPlan plan = plan_memory(units, n, c.dtype, c.reduce);
    const std::string tag = rank_tag(dims, c);
    EXPECT_DOUBLE_EQ(r.memory.param_bytes, plan.total.param_bytes) << tag;
    EXPECT_DOUBLE_EQ(r.memory.grad_bytes, plan.total.grad_bytes) << tag;
    double pad = 0, largest_rs = 0;
    for (const auto& u : units) {
      const double shard = static_cast<double>((u.numel + n - 1) / n);
      if (u.sharding != Sharding::kReplicated && u.sharding != Sharding::kFrozen) pad += shard * n - u.numel;
      if (u.trainable() && (u.sharding == Sharding::kFullShard || u.sharding == Sharding::kShardGradOp))
        largest_rs = std::max(largest_rs, 4.0 * (shard * n + shard));
    }
    EXPECT_LE(r.memory.optim_bytes, plan.total.optim_bytes) << tag;
    EXPECT_GE(r.memory.optim_bytes, plan.total.optim_bytes - 12.0 * pad) << tag;
    if (dims.rank() == 0) EXPECT_DOUBLE_EQ(r.memory.optim_bytes, plan.total.optim_bytes) << tag;
    EXPECT_LE(r.memory.gathered_peak_bytes, plan.gathered_peak_bytes) << tag;
    EXPECT_GT(r.memory.gathered_peak_bytes, 0.0) << tag;
    EXPECT_LE(r.memory.reduce_scatter_peak_bytes, plan.reduce_scatter_peak_bytes) << tag;
    EXPECT_GE(r.memory.reduce_scatter_peak_bytes, largest_rs) << tag;
    std::printf("plan vs engine, %s: params %.0f / %.0f B, grads %.0f / %.0f B, optimizer %.0f / %.0f B, "
                "gathered peak %.0f / %.0f B, reduce-scatter peak %.0f / %.0f B (measured / planned)\n",
                tag.c_str(), r.memory.param_bytes, plan.total.param_bytes, r.memory.grad_bytes, plan.total.grad_bytes,
                r.memory.optim_bytes, plan.total.optim_bytes, r.memory.gathered_peak_bytes, plan.gathered_peak_bytes,
                r.memory.reduce_scatter_peak_bytes, plan.reduce_scatter_peak_bytes);
  }
}

TEST(FsdpDist, MemoryPlanMatchesEngineWorld1) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  check_plan_vs_engine(dims);
}

TEST(FsdpDist, DISABLED_MemoryPlanWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  check_plan_vs_engine(dims);
  dims.comm().barrier("end");
}

TEST(FsdpDist, MemoryPlanMatchesEngineWorld2) { launch(2, "FsdpDist.DISABLED_MemoryPlanWorker", 120); }

// ---------------------------------------------------------------- mixed precision

// World 2, frozen-vision full_shard, lr 1e-3 on fixed data: bf16 parameters (fp32 masters,
// fp32 reduction) stay within 2e-2 relative of the fp32 run's losses, and the loss falls;
// the same with bf16 gradient reduction (reduce_dtype bf16).
TEST(FsdpDist, DISABLED_Bf16Worker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  Config c;
  c.lr = 1e-3;
  c.fixed_data = true;
  const RunResult fp32 = sharded_run(dims, c);
  c.dtype = torch::kBFloat16;
  const RunResult bf16 = sharded_run(dims, c);
  compare(bf16, fp32, rank_tag(dims, c) + " vs fp32", 2e-2, /*param_tol=*/0);
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.05) << "bf16 run does not train";
  EXPECT_LT(fp32.losses.back(), fp32.losses.front() - 0.05);
  c.reduce = torch::kBFloat16;
  const RunResult bf16_reduce = sharded_run(dims, c);
  compare(bf16_reduce, fp32, rank_tag(dims, c) + " vs fp32", 2e-2, /*param_tol=*/0);
  EXPECT_LT(bf16_reduce.losses.back(), bf16_reduce.losses.front() - 0.05);
  dims.comm().barrier("end");
}

TEST(FsdpDist, Bf16World2) { launch(2, "FsdpDist.DISABLED_Bf16Worker", 180); }

// ---------------------------------------------------------------- text-only micro-batches

// World 2: rank 1's micro-batches never have an image (the model runs its dummy image), with
// the vision tower FSDP-sharded (trainable all-fsdp full_shard, and frozen sharded).
// Nothing hangs (hard timeout), losses are finite, every rank ends with the same parameters.
TEST(FsdpDist, DISABLED_TextOnlyWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  for (bool frozen : {false, true}) {
    Config c;
    c.frozen_vision = frozen;
    c.text_only_rank1 = true;
    c.accum = 2;
    c.ckpt = !frozen;
    c.end = 2;
    const RunResult r = sharded_run(dims, c);
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
    double sum = 0;
    for (const auto& p : r.params) sum += p.second.sum().item<double>();
    torch::Tensor mx = torch::tensor({sum}, torch::kDouble), mn = mx.clone();
    dims.comm().all_reduce(mx, ReduceOp::kMax, "check");
    dims.comm().all_reduce(mn, ReduceOp::kMin, "check");
    EXPECT_EQ(mx.item<double>(), mn.item<double>()) << "ranks disagree on the parameters";
    std::printf("%s: text-only rank 1, losses %.6f %.6f\n", rank_tag(dims, c).c_str(), r.losses[0], r.losses[1]);
  }
  dims.comm().barrier("end");
}

TEST(FsdpDist, TextOnlyWorld2) { launch(2, "FsdpDist.DISABLED_TextOnlyWorker", 120); }

// ---------------------------------------------------------------- checkpoint state

// Frozen-vision full_shard (ckpt on): 2 steps at world 2, state saved (this rank's slices);
// loaded at world 3 and at world 1, 2 more steps; both equal an uninterrupted single-process
// run of 4 steps (losses 1e-5 relative, parameters 1e-5).
Config resume_config(int begin, int end) {
  Config c;
  c.ckpt = true;
  c.begin = begin;
  c.end = end;
  return c;
}

TEST(FsdpDist, DISABLED_SaveWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  Config c = resume_config(0, 2);
  c.save_dir = std::getenv("VLMTEST_STATE_DIR");
  const RunResult ref = reference_run(resume_config(0, 4));
  RunResult r = sharded_run(dims, c);
  for (size_t s = 0; s < r.losses.size(); ++s) EXPECT_NEAR(r.losses[s], ref.losses[s], 1e-5 * ref.losses[s]);
  dims.comm().barrier("end");
}

TEST(FsdpDist, DISABLED_LoadWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  Config c = resume_config(2, 4);
  c.load_dir = std::getenv("VLMTEST_STATE_DIR");
  const RunResult ref = reference_run(resume_config(0, 4));
  compare(sharded_run(dims, c), ref, rank_tag(dims, c) + " resumed at step 2", 1e-5, 1e-5, 2);
  dims.comm().barrier("end");
}

TEST(FsdpDist, ResumeWorld2To3And1) {
  const std::string dir = (fs::temp_directory_path() / vlm::str("vlm_fsdp_state_", ::getpid())).string();
  fs::remove_all(dir);
  auto env = [dir](int) { return std::vector<std::string>{"VLMTEST_STATE_DIR=" + dir}; };
  launch(2, "FsdpDist.DISABLED_SaveWorker", 120, env);
  launch(3, "FsdpDist.DISABLED_LoadWorker", 120, env);
  // World 1 in this process.
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  Config c = resume_config(2, 4);
  c.load_dir = dir;
  compare(sharded_run(dims, c), reference_run(resume_config(0, 4)), c.tag() + ", world 1 resumed at step 2", 1e-5,
          1e-5, 2);
  fs::remove_all(dir);
}

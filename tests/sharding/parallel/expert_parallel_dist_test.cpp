// Expert parallelism (sharding/parallel/expert_parallel.h, the `ep` policy of policy.h),
// in real processes on Gloo over loopback.
//
// Equality with one process: tiny-qwen3-moe (layer 0 dense, 8 experts top-2) and
// tiny-qwen3.5-moe (every layer sparse, shared expert), fp32, the same global batch per step
// (4 image samples in one micro-batch, 4 text-only samples in a second), split over the
// ranks; 10 AdamW steps with clipping active. Per configuration:
//   - the loss of every step (1e-5 relative);
//   - every gradient of step 0 before clipping (the experts' gathered over the EP group into
//     the full [E, ...] tensors), against the reference's, max |diff| <= 1e-5 x max |grad|
//     of that tensor (DDP rest; with FSDP the rest's gradients live in shards: checked
//     through the norm);
//   - the gradient norm of every step (1e-5 relative);
//   - every parameter after the 10 steps (the experts gathered), 1e-5 absolute.
// Configurations: ep = world at world 2 and 4 with DDP for the rest; ep 2 with FSDP
// full_shard for the rest at world 2 (also with activation checkpointing of the decoder
// layers: the recompute dispatches again inside backward), and at world 4 (2 EP groups: the experts' gradients
// all-reduced over the expert-replicate groups {0,2}, {1,3}); at world 2 with the vision
// tower frozen (patch_embed and blocks: no gradient, no state), the rest DDP; and at world 2
// with LoRA (r 4) on the attention projections, their layers' other weights and the tower
// frozen, the merger DDP: a sparse layer's unit is then three rows (its frozen base,
// +experts, +lora) and only adapters, merger and experts train (clipping at 0.05 so that it
// is active). There tiny-qwen3.5-moe's layer 0 (linear attention, no adapters) gets input
// that needs no gradient in the text-only micro-batch: its dispatch must still run both
// reverse all-to-alls in backward (the op count below), else a rank without an image would
// skip one that a rank with an image waits in.
// No hang: the router zeroed (every token ties and goes to the same two experts, which top-k
// picks among the ties; at ep 4 the two ranks holding neither compute no row) and rank 1's
// text micro-batch a filler (nothing supervised): still equal to one process.
// (Its statistics are step 0's, before the router has learnt anything.)
// Bytes: step 1's all-to-all bytes on the EP comm equal the formula of expert_parallel.h
// from the dispatch statistics, and the routed rows add up to tokens x k x sparse layers;
// on the expert-replicate comm (world 4, ep 2), the experts' gradient all-reduce and the
// all-gather of their ZeRO-1 update (each replica keeps and updates half the AdamW state)
// equal the traffic plan's formula.
// Checkpoint: written at ep 2, resumed at ep 4 (the experts' state keyed over all E).
// Sharded loading from an HF checkpoint at ep 2: each rank reads only its experts' bytes.
// Comm::all_to_all alone (and 8 experts refusing ep = 3): tests/sharding/dist/comm_all_to_all_dist_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "sharding/parallel/expert_parallel.h"
#include "sharding/parallel/lora.h"
#include "tests/sharding/dist/ep_worker.h"
#include "tests/sharding/parallel/fsdp_testing.h"
#include "vlm/model/moe.h"

namespace {

using namespace vlm::sharding;
using fsdp_testing::make_sample;
using fsdp_testing::pack;
using fsdp_testing::Sample;

constexpr int kEpSteps = 10;
constexpr int kPerKind = 4;  // image samples and text-only samples per step (global)
constexpr double kEpLr = 1e-4, kEpWd = 0.1, kEpClip = 1.0;

struct EpConfig {
  std::string preset = "tiny-qwen3-moe";
  std::string rest = "ddp";  // the policy of everything but the experts: ddp | fsdp
  bool zero_router = false;  // every sparse layer's mlp.gate.weight = 0 (all rows to experts 0, 1)
  bool ckpt = false;         // activation checkpointing of the decoder layers (dispatch again in backward)
  bool frozen_tower = false;  // visual.patch_embed and visual.blocks.* frozen
  bool lora = false;          // LoRA on attention, every other non-expert weight frozen but the merger
  double clip = kEpClip;
  int filler_rank = -1;      // this rank's text micro-batch is a filler
  int begin = 0, end = kEpSteps;   // steps [begin, end)
  std::string save_dir, load_dir;  // checkpoint state after the run / before it (fsdp_testing.h files)
  std::string hf_dir;              // sharded loading from this HF checkpoint, or "init" (meta model)
  std::string tag(int world, int ep) const {
    return vlm::str(preset, " ep ", ep, " x ", lora ? "lora" : rest, frozen_tower ? " + frozen tower" : "", " world ",
                    world, ckpt ? " +ckpt" : "",
                    zero_router ? " zero-router" : "", filler_rank >= 0 ? " filler" : "");
  }
};

vlm::VisionLanguageModel make_moe(const EpConfig& c, bool meta = false) {
  auto cfg = vlm::preset(c.preset);
  vlm::VisionLanguageModel m(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat32));
  if (meta) return m;
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 7});
  if (c.zero_router) {
    torch::NoGradGuard g;
    for (auto& item : m->named_parameters())
      if (item.key().find("mlp.gate.weight") != std::string::npos) item.value().zero_();
  }
  return m;
}

// Step `step`'s samples: kind 0 image, kind 1 text-only; global sample i of a kind goes to
// rank i % world; rank -1: every sample but those of `skip_rank`'s share.
std::vector<Sample> samples(const vlm::VlmConfig& cfg, int step, int kind, int world, int rank, int skip_rank = -1) {
  std::vector<Sample> out;
  for (int i = 0; i < kPerKind; ++i)
    if (rank < 0 ? i % world != skip_rank : i % world == rank)
      out.push_back(make_sample(cfg, step, kind * kPerKind + i, kind == 1));
  return out;
}

bool decays(const std::string& name) { return !fsdp_testing::no_decay(name); }

struct EpResult {
  std::vector<double> losses, norms;
  std::map<std::string, torch::Tensor> grads0;  // step 0, before clipping (full experts)
  std::map<std::string, torch::Tensor> params;  // after the last step (full experts)
  // Step 1 (zero router: step 0): the EP comm's traffic, the dispatch statistics, this
  // rank's tokens (both micro-batches).
  CommStats ep_step1, replicate_step1;  // the EP comm's and the expert-replicate comm's
  double replicate_formula = 0;         // what app/plan/traffic_plan.h counts on the latter
  ExpertDispatchStats dispatch_step1;
  int64_t tokens_step1 = 0;
  uint64_t bytes_read = 0;  // sharded loading: checkpoint bytes this rank read
};

ShardingOptions ep_options(const EpConfig& c) {
  ShardingOptions o;
  o.rules = {{"*.mlp.experts", "ep", ""}};
  o.default_policy = c.rest;
  if (c.frozen_tower) o.rules.push_back({"visual.patch_embed|visual.blocks.*", "freeze", ""});
  if (c.lora) {
    PolicyRule adapters{"model.layers.*.self_attn.*_proj", "lora", "", {}};
    adapters.lora.r = 4;
    adapters.lora.alpha = 8.0;
    o.rules.push_back(adapters);
    o.rules.push_back({"visual.merger", "ddp", ""});
    o.default_policy = "freeze";
  }
  o.ddp_bucket_mb = 0.05;
  if (c.ckpt) o.checkpoint_match = "model.layers.*";
  o.optim.lr = kEpLr;
  o.optim.weight_decay = kEpWd;
  o.optim.grad_clip = c.clip;
  return o;
}

bool in_tower(const std::string& name) {
  return name.rfind("visual.patch_embed.", 0) == 0 || name.rfind("visual.blocks.", 0) == 0;
}
// What trains in the lora configuration: the adapters, the merger, the experts.
bool lora_trains(const std::string& name) {
  return name.find(".lora_") != std::string::npos || name.rfind("visual.merger.", 0) == 0 ||
         name.find(".mlp.experts.") != std::string::npos;
}

// One process, no sharding code (a frozen tower: no gradient, no AdamW state; LoRA: the same
// adapters, attach_lora's, and the same parameters frozen); without the text samples of c.filler_rank's share (that
// rank runs a filler instead) at `world`.
EpResult reference(const EpConfig& c, int world) {
  auto model = make_moe(c);
  if (c.frozen_tower)
    for (auto& item : model->named_parameters())
      if (in_tower(item.key())) item.value().set_requires_grad(false);
  if (c.lora) {
    attach_lora(*model, ep_options(c));
    for (auto& item : model->named_parameters()) item.value().set_requires_grad(lora_trains(item.key()));
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<torch::Tensor> all;
  for (auto& item : model->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    auto o = std::make_unique<torch::optim::AdamWOptions>(kEpLr);
    o->weight_decay(decays(item.key()) ? kEpWd : 0.0);
    groups.emplace_back(std::vector<torch::Tensor>{item.value()}, std::move(o));
    all.push_back(item.value());
  }
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(kEpLr));
  EpResult r;
  for (int step = 0; step < c.end; ++step) {  // from step 0 whatever c.begin: the trajectory
    torch::Tensor loss_sum = torch::zeros({});
    int64_t tokens = 0;
    for (int kind = 0; kind < 2; ++kind) {
      auto out = model->forward(pack(samples(model->cfg, step, kind, world, -1, kind == 1 ? c.filler_rank : -1)));
      loss_sum = loss_sum + out.loss_sum;
      tokens += out.n_tokens;
    }
    (loss_sum / static_cast<double>(tokens)).backward();
    r.losses.push_back(loss_sum.item<double>() / static_cast<double>(tokens));
    double sumsq = 0;
    for (auto& item : model->named_parameters()) {
      const torch::Tensor g = item.value().grad();
      if (!g.defined()) continue;
      sumsq += g.to(torch::kFloat64).square().sum().item<double>();
      if (step == 0) r.grads0[item.key()] = g.clone();
    }
    r.norms.push_back(std::sqrt(sumsq));
    torch::nn::utils::clip_grad_norm_(all, c.clip);
    opt.step();
    opt.zero_grad();
  }
  for (auto& item : model->named_parameters()) r.params[item.key()] = item.value().detach().clone();
  return r;
}

// The full [E, ...] tensor of an expert parameter from each EP rank's held [H, ...] slice.
torch::Tensor gather_experts(ParallelDims& dims, const torch::Tensor& held) {
  const auto h = held.detach().to(torch::kFloat32).contiguous();
  std::vector<int64_t> full(h.sizes().begin(), h.sizes().end());
  full[0] *= dims.ep();
  torch::Tensor out = torch::empty(full, h.options());
  dims.ep_comm().all_gather(out.view({-1}), h.view({-1}), "test: gather experts");
  return out;
}

bool is_expert(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

// Step 0's gradients before clipping: the DDP reducers' (experts gathered); FSDP units skipped.
void collect_grads(ParallelDims& dims, ShardedModel& sm, EpResult& r) {
  for (const auto& u : sm.unit_table()) {
    const bool expert = u.sharding == Sharding::kExpert;
    DdpReducer* red = expert ? sm.expert_reducer() : sm.reducer();
    if (!expert && u.sharding != Sharding::kReplicated) continue;
    for (const auto& p : u.params) {
      torch::Tensor g = red->grad(red->index_of(p.param));
      if (!g.defined()) g = torch::zeros_like(p.param);
      r.grads0[p.name] = expert ? gather_experts(dims, g) : g.clone();
    }
  }
}

EpResult sharded(ParallelDims& dims, const EpConfig& c) {
  const int n = dims.world_size(), rank = dims.rank();
  auto model = make_moe(c, /*meta=*/!c.hf_dir.empty());
  std::unique_ptr<vlm::ParamSource> source;
  if (c.hf_dir == "init")  // the trainer's random init: each rank draws only what it keeps
    source = vlm::init_param_source(*model, {torch::kCPU, torch::kFloat32, 7});
  else if (!c.hf_dir.empty())
    source = vlm::checkpoint_param_source(*model, vlm::HfCheckpoint::open(c.hf_dir));
  auto sm = apply_policies(*model, ep_options(c), dims, source.get());
  source.reset();
  EXPECT_TRUE(sm->dispatcher() != nullptr);
  if (!c.load_dir.empty()) sm->load_state(fsdp_testing::slice_reader(c.load_dir), c.begin);
  Comm& comm = dims.comm();
  EpResult r;
  r.bytes_read = sm->load_stats().bytes_read;
  for (int step = c.begin; step < c.end; ++step) {
    std::vector<Sample> micro[2] = {samples(model->cfg, step, 0, n, rank), samples(model->cfg, step, 1, n, rank)};
    if (rank == c.filler_rank) {  // the text samples move to no one: the reference drops them too
      Sample f = make_sample(model->cfg, step, 99, true);
      std::fill(f.labels.begin(), f.labels.end(), -100);
      micro[1] = {f};
    }
    int64_t local = 0;
    for (const auto& m : micro)
      for (const auto& s : m)
        for (auto l : s.labels) local += l != -100;
    const int stats_step = c.zero_router ? 0 : 1;  // zero router: step 0, before the router learns
    if (step == stats_step) {
      dims.reset_data_stats();
      sm->dispatcher()->reset_stats();
    }
    const int64_t tokens = global_token_count(comm, local);
    double loss_sum = 0;
    for (int k = 0; k < 2; ++k) {
      sm->set_sync(k == 1);
      sm->dispatcher()->set_context(vlm::str("step ", step, " micro ", k));
      auto out = model->forward(pack(micro[k]));
      (out.loss_sum / static_cast<double>(tokens)).backward();
      sm->finish_backward(vlm::str("step ", step));
      loss_sum += out.loss_sum.item<double>();
      if (step == stats_step) r.tokens_step1 += pack(micro[k]).input_ids.numel();
    }
    torch::Tensor l = torch::tensor({loss_sum}, torch::kDouble);
    comm.all_reduce(l, ReduceOp::kSum, "test: loss");
    r.losses.push_back(l.item<double>() / static_cast<double>(tokens));
    if (step == 0) collect_grads(dims, *sm, r);
    r.norms.push_back(sm->optimizer().clip_grad_norm());
    sm->optimizer().step();
    sm->optimizer().zero_grad();
    if (step == stats_step) {
      r.ep_step1 = dims.ep_comm().stats();
      r.replicate_step1 = dims.expert_replicate_comm().stats();
      r.dispatch_step1 = sm->dispatcher()->stats();
    }
  }
  // The expert rows' traffic on their replicate group (n ranks): the fp32 bucket all-reduce
  // 2(n-1)/n x P x 4 and the ZeRO-1 all-gather (n-1)/n x n*ceil(P/n) x 4 of each row.
  const double reps = dims.expert_replicate_comm().world_size();
  for (const auto& u : sm->unit_table())
    if (u.sharding == Sharding::kExpert && reps > 1) {
      const double numel = static_cast<double>(u.numel);
      r.replicate_formula += 2 * (reps - 1) / reps * numel * 4 + (reps - 1) * std::ceil(numel / reps) * 4;
    }
  if (!c.save_dir.empty()) fsdp_testing::save_slices(sm->state_slices(), c.save_dir);
  for (const auto& [name, t] : fsdp_testing::snapshot(*sm, *model))
    r.params[name] = is_expert(name) ? gather_experts(dims, t) : t;
  return r;
}

// Max |a - b| over a tensor, relative to max |b| (1 when b is all zeros).
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / (b.abs().max().item<double>() > 0 ? scale : 1.0);
}

void check_ep(ParallelDims& dims, const EpConfig& c) {
  const std::string tag = c.tag(dims.world_size(), dims.ep()) + ", rank " + std::to_string(dims.rank());
  const EpResult want = reference(c, dims.world_size());
  const EpResult got = sharded(dims, c);
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kEpSteps));
  for (int s = 0; s < kEpSteps; ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s]) << tag << " loss, step " << s;
    EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s]) << tag << " grad norm, step " << s;
  }
  EXPECT_GT(want.norms.front(), c.clip) << "the test needs clipping to be active";
  // Gradients of step 0 (DDP rest: all of them; FSDP rest: the experts).
  double worst_grad = 0;
  std::string worst_grad_name;
  int64_t expert_grads = 0;
  for (const auto& [name, g] : got.grads0) {
    ASSERT_TRUE(want.grads0.count(name)) << tag << ": " << name << " has no reference gradient";
    const torch::Tensor& w = want.grads0.at(name);
    ASSERT_EQ(g.sizes(), w.sizes()) << tag << ": " << name;
    const double d = rel_diff(g, w);
    if (d > worst_grad) worst_grad = d, worst_grad_name = name;
    expert_grads += is_expert(name);
  }
  EXPECT_LE(worst_grad, 1e-5) << tag << ": worst gradient " << worst_grad_name;
  EXPECT_GT(expert_grads, 0) << tag;
  if (c.rest == "ddp" || c.lora) {
    EXPECT_EQ(got.grads0.size(), want.grads0.size()) << tag << ": every gradient compared";
  }
  // Parameters after the steps.
  double worst = 0;
  std::string worst_name;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, p] : got.params) {
    const double d = (p - want.params.at(name)).abs().max().item<double>();
    if (d > worst) worst = d, worst_name = name;
  }
  EXPECT_LE(worst, 1e-5) << tag << ": worst parameter " << worst_name;
  // Step 1's all-to-all bytes against expert_parallel.h's formula (fp32 rows, int64 counts).
  const auto cfg = vlm::preset(c.preset);
  const int64_t ep = dims.ep(), held = cfg.text.num_experts / ep, d = cfg.text.hidden_size;
  // Checkpointed layers dispatch twice (forward, recompute) but run one backward.
  const ExpertDispatchStats& st = got.dispatch_step1;
  const int64_t forwards = c.ckpt ? 2 : 1, backwards = st.dispatches / forwards;
  const double rows = static_cast<double>(st.rows_sent + st.rows_received);  // over all forwards
  const double formula = static_cast<double>(st.dispatches) * (ep - 1) * held * 8 + rows * d * 4 +
                         rows / static_cast<double>(forwards) * d * 4;
  const OpStats& a2a = got.ep_step1[OpKind::kAllToAll];
  EXPECT_DOUBLE_EQ(a2a.logical_bytes, formula) << tag;
  EXPECT_DOUBLE_EQ(a2a.wire_bytes, formula) << tag;
  // The expert-replicate group (world 4, ep 2: two ranks per group): the gradient all-reduce
  // and the ZeRO-1 gather of the experts' update, as the traffic plan counts them.
  EXPECT_DOUBLE_EQ(got.replicate_step1.logical_bytes(), got.replicate_formula) << tag;
  if (dims.world_size() / dims.ep() > 1) {
    EXPECT_GT(got.replicate_formula, 0) << tag;
    EXPECT_EQ(got.replicate_step1[OpKind::kAllGather].calls, cfg.text.count_sparse_layers()) << tag << ": one per row";
  }
  EXPECT_EQ(a2a.calls, 3 * st.dispatches + 2 * backwards) << tag << ": counts, rows, results forward; two reverse in backward";
  EXPECT_EQ(st.dispatches, forwards * 2 * cfg.text.count_sparse_layers()) << tag << ": per sparse layer and micro-batch";
  // Rows: what the ranks sent, they received; what the experts ran is every (token, top-k) pair.
  torch::Tensor sums = torch::tensor({static_cast<double>(st.rows_sent), static_cast<double>(st.rows_received),
                                      static_cast<double>(st.rows_computed), static_cast<double>(got.tokens_step1)},
                                     torch::kFloat64);
  dims.control().all_reduce(sums, ReduceOp::kSum, "test: rows");
  EXPECT_EQ(sums[0].item<double>(), sums[1].item<double>()) << tag;
  if (c.zero_router) {  // every row to the same two tied experts: at most 2 ranks of an EP group compute
    torch::Tensor per_rank = torch::zeros({dims.world_size()}, torch::kFloat64);
    per_rank[dims.rank()] = static_cast<double>(st.rows_computed);
    dims.control().all_reduce(per_rank, ReduceOp::kSum, "test: rows per rank");
    std::string list;
    for (int k = 0; k < dims.world_size(); ++k) list += vlm::str(k ? ", " : "", per_rank[k].item<int64_t>());
    const int64_t busy = (per_rank > 0).sum().item<int64_t>();
    EXPECT_GE(busy, 1) << tag << ": rows computed per rank " << list;
    EXPECT_LE(busy, 2 * dims.world_size() / dims.ep()) << tag << ": rows computed per rank " << list;
    EXPECT_LT(busy, dims.world_size()) << tag << ": some rank must compute no row; per rank " << list;
    std::printf("%s: rows computed per rank (step 0) %s\n", tag.c_str(), list.c_str());
  }
  EXPECT_EQ(sums[2].item<double>(),
            sums[3].item<double>() * cfg.text.num_experts_per_tok * cfg.text.count_sparse_layers() * forwards)
      << tag << ": every routed row computed once";
  std::printf("%s: loss %.6f -> %.6f (ref %.6f), norm0 %.5f, max rel grad diff %.3g (%s), max |param diff| %.3g "
              "(%s); step %d all-to-all %.0f B in %lld ops, rows sent %lld received %lld computed %lld\n",
              tag.c_str(), got.losses.front(), got.losses.back(), want.losses.back(), got.norms.front(), worst_grad,
              worst_grad_name.c_str(), worst, worst_name.c_str(), c.zero_router ? 0 : 1, a2a.logical_bytes,
              static_cast<long long>(a2a.calls), static_cast<long long>(st.rows_sent),
              static_cast<long long>(st.rows_received), static_cast<long long>(st.rows_computed));
}

using vlm::test::ep_worker_env;

TEST(ExpertParallelDist, DISABLED_EqualsOneProcessWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = vlm::test::ep_worker_dims();
  const bool ep_is_world = dims.ep() == dims.world_size();
  for (const char* preset : {"tiny-qwen3-moe", "tiny-qwen3.5-moe"}) {
    EpConfig c;
    c.preset = preset;
    c.rest = ep_is_world ? "ddp" : "fsdp";
    check_ep(dims, c);
    if (ep_is_world && dims.world_size() == 2) {  // EP 2 x FSDP within the same two ranks
      c.rest = "fsdp";
      check_ep(dims, c);
      c.ckpt = true;  // and with the layers recomputed in backward (the dispatch runs again there)
      check_ep(dims, c);
      c.ckpt = false;  // a frozen vision tower beside the split experts, DDP for the rest
      c.rest = "ddp";
      c.frozen_tower = true;
      check_ep(dims, c);
      c.frozen_tower = false;  // LoRA on attention beside the split experts, the rest frozen
      c.lora = true;
      c.clip = 0.05;
      check_ep(dims, c);
    }
  }
  dims.comm().barrier("end");
}

TEST(ExpertParallelDist, EqualsOneProcessEp2World2) {
  fsdp_testing::launch(2, "ExpertParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return ep_worker_env(2); });
}

TEST(ExpertParallelDist, EqualsOneProcessEp4World4) {
  fsdp_testing::launch(4, "ExpertParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return ep_worker_env(4); });
}

TEST(ExpertParallelDist, Ep2TimesFsdpEqualsOneProcessWorld4) {
  fsdp_testing::launch(4, "ExpertParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return ep_worker_env(2); });
}

TEST(ExpertParallelDist, DISABLED_NoHangWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = vlm::test::ep_worker_dims();
  EpConfig c;
  c.zero_router = true;
  c.filler_rank = 1;
  check_ep(dims, c);
  dims.comm().barrier("end");
}

TEST(ExpertParallelDist, OneExpertRankAndFillerDoNotHangWorld4) {
  fsdp_testing::launch(4, "ExpertParallelDist.DISABLED_NoHangWorker", 300, [](int) { return ep_worker_env(4); });
}

// Sharded loading at ep 2 (world 2, DDP rest) from an fp32 HF checkpoint of the same
// weights: each rank reads every non-expert tensor and only its half of the experts, so it
// reads the checkpoint's bytes minus half the experts' exactly; the run then equals one
// process as above. The same from the random-init source (what the trainer uses without a
// checkpoint), which must draw each expert tensor in its full [E, ...] shape.
std::string ep_hf_dir() { return (fsdp_testing::fs::temp_directory_path() / "vlmtest_ep_hf").string(); }

TEST(ExpertParallelDist, DISABLED_LoadWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = vlm::test::ep_worker_dims();
  EpConfig c;
  c.hf_dir = ep_hf_dir();
  check_ep(dims, c);
  const EpResult got = sharded(dims, c);
  const vlm::HfCheckpoint ck = vlm::HfCheckpoint::open(c.hf_dir);
  uint64_t total = 0, experts = 0;
  for (const auto& name : ck.names()) {
    total += ck.info(name).nbytes();
    if (is_expert(name)) experts += ck.info(name).nbytes();
  }
  EXPECT_GT(experts, 0u);
  EXPECT_EQ(got.bytes_read, total - experts / 2) << "every non-expert byte and half of the experts'";
  c.hf_dir = "init";  // the random-init source: the experts drawn in their full shape, then split
  check_ep(dims, c);
  std::printf("rank %d read %llu of %llu checkpoint bytes (experts: %llu of %llu)\n", dims.rank(),
              static_cast<unsigned long long>(got.bytes_read), static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(experts / 2), static_cast<unsigned long long>(experts));
  dims.comm().barrier("end");
}

TEST(ExpertParallelDist, ShardedLoadReadsOnlyHeldExpertsEp2) {
  fsdp_testing::fs::remove_all(ep_hf_dir());
  vlm::SaveHfOptions o;
  o.dtype = torch::kFloat32;
  auto model = make_moe(EpConfig{});
  vlm::save_hf_checkpoint(ep_hf_dir(), vlm::module_state(*model), o);
  fsdp_testing::launch(2, "ExpertParallelDist.DISABLED_LoadWorker", 300, [](int) { return ep_worker_env(2); });
  fsdp_testing::fs::remove_all(ep_hf_dir());
}

// Checkpoint state written at ep 2 (world 2) after steps [0, 2), resumed at ep 4 (world 4)
// for step 2: the experts' state is keyed over all E experts (optimizer.h), so the slices
// cover every vector once and the resumed run continues the reference's trajectory.
std::string ep_ckpt_dir() { return (fsdp_testing::fs::temp_directory_path() / "vlmtest_ep_ckpt").string(); }

TEST(ExpertParallelDist, DISABLED_SaveWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = vlm::test::ep_worker_dims();
  EpConfig c;
  c.end = 2;
  c.save_dir = ep_ckpt_dir();
  sharded(dims, c);
  dims.comm().barrier("end");
}

TEST(ExpertParallelDist, DISABLED_ResumeWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = vlm::test::ep_worker_dims();
  EpConfig c;
  c.begin = 2;
  c.end = 3;
  c.load_dir = ep_ckpt_dir();
  const EpResult want = reference(c, dims.world_size());
  const EpResult got = sharded(dims, c);
  ASSERT_EQ(got.losses.size(), 1u);
  EXPECT_NEAR(got.losses[0], want.losses[2], 1e-5 * want.losses[2]) << "resumed step 2";
  EXPECT_NEAR(got.norms[0], want.norms[2], 1e-5 * want.norms[2]) << "resumed step 2";
  double worst = 0;
  for (const auto& [name, p] : got.params) worst = std::max(worst, (p - want.params.at(name)).abs().max().item<double>());
  EXPECT_LE(worst, 1e-5);
  std::printf("resumed at ep 4 from ep 2: step 2 loss %.6f (ref %.6f), max |param diff| %.3g\n", got.losses[0],
              want.losses[2], worst);
  dims.comm().barrier("end");
}

TEST(ExpertParallelDist, CheckpointAtEp2ResumesAtEp4) {
  fsdp_testing::fs::remove_all(ep_ckpt_dir());
  fsdp_testing::launch(2, "ExpertParallelDist.DISABLED_SaveWorker", 240, [](int) { return ep_worker_env(2); });
  // Every vector once: per key, the slices' lengths sum to its numel (all E experts).
  std::map<std::string, int64_t> covered;
  for (const auto& e : fsdp_testing::fs::directory_iterator(ep_ckpt_dir())) {
    const std::string name = e.path().filename().string();
    const size_t dot2 = name.rfind('.'), dot1 = name.rfind('.', dot2 - 1);
    covered[name.substr(0, dot1)] += std::stoll(name.substr(dot2 + 1)) - std::stoll(name.substr(dot1 + 1, dot2 - dot1 - 1));
  }
  auto model = make_moe(EpConfig{});
  int64_t expert_keys = 0;
  for (auto& item : model->named_parameters()) {
    if (!is_expert(item.key())) continue;
    ++expert_keys;
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"})
      EXPECT_EQ(covered[item.key() + "#" + kind], item.value().numel()) << item.key() << " " << kind;
  }
  EXPECT_EQ(expert_keys, 2 * model->cfg.text.count_sparse_layers());
  fsdp_testing::launch(4, "ExpertParallelDist.DISABLED_ResumeWorker", 240, [](int) { return ep_worker_env(4); });
  fsdp_testing::fs::remove_all(ep_ckpt_dir());
}

// Without processes: the checks with clear errors.
TEST(ExpertParallel, ExpertsMustSplitEvenly) {
  auto model = make_moe(EpConfig{});
  try {
    ExpertParallelDispatcher d(*std::make_shared<Comm>(c10::intrusive_ptr<c10d::Backend>(), 0, 1, Backend::kNone,
                                                       std::chrono::seconds(1)), 0);
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not split evenly"), std::string::npos) << e.what();
  }
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  EXPECT_EQ(apply_expert_parallel(*model, dims), nullptr) << "ep 1: nothing to do";
  try {
    apply_policies(*model, ep_options(EpConfig{}), dims);
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("policy = \"ep\" but dist.ep is 1"), std::string::npos) << e.what();
  }
  DistEnv env;
  env.world_size = 3;
  env.local_world_size = 3;
  env.master_addr = "127.0.0.1";
  env.master_port = 1;
  ParallelOptions o;
  o.device = "cpu";
  o.ep = 2;
  try {
    ParallelDims::init(env, o);
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dist.ep = 2 does not divide the world size 3"), std::string::npos) << e.what();
  }
}

TEST(ExpertParallel, PolicySplitsTheExpertsIntoTheirOwnRow) {
  auto model = make_moe(EpConfig{});
  ShardingOptions o = ep_options(EpConfig{});
  o.default_policy = "fsdp";
  const auto units = resolve_units(*model, o);
  const std::string table = unit_table_text(units);
  int expert_rows = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].sharding != Sharding::kExpert) continue;
    ++expert_rows;
    ASSERT_GT(i, 0u);
    EXPECT_EQ(units[i].path, units[i - 1].path + "+experts");
    EXPECT_EQ(units[i].experts_of, units[i - 1].path);
    EXPECT_TRUE(units[i - 1].has_experts);
    EXPECT_EQ(units[i - 1].sharding, Sharding::kFullShard) << "the rest keeps its own policy";
    ASSERT_EQ(units[i].params.size(), 2u);
    for (const auto& p : units[i].params) EXPECT_TRUE(is_expert(p.name)) << p.name;
    for (const auto& p : units[i - 1].params) EXPECT_FALSE(is_expert(p.name)) << p.name;
  }
  EXPECT_EQ(expert_rows, model->cfg.text.count_sparse_layers());
  EXPECT_NE(table.find("+experts ep - experts (ep)"), std::string::npos) << table;
  // An ep rule on something that is not an expert is refused.
  o.rules = {{"*.mlp.gate.weight", "ep", ""}};
  try {
    resolve_units(*model, o);
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("which is not an MoE expert parameter"), std::string::npos) << e.what();
  }
}

}  // namespace

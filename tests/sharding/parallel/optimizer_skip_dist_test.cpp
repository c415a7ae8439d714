// Parameters without a gradient (issue #22): ShardedAdamW skips a parameter that had no
// gradient on ANY rank this step (no decay, no moment update, its step count t stays), as
// torch.optim.AdamW skips a parameter whose .grad is None; a parameter with a gradient on
// some ranks only is updated on every rank. Also: released FSDP units throw an error naming
// the unit when touched outside a gather, and per-parameter step counts survive a
// checkpoint round trip (and old checkpoints without them still load).
//
// Toy model, two units, fp32, run through the real engines (DdpReducer or FsdpEngine
// full_shard + ShardedAdamW), world 1 in process and world 2 in worker processes:
//   unit "a": wa [6, 5], ba [6]      h = tanh(x wa^T + ba)         x [4, 5] per rank and step
//   unit "b": w1 [3, 6], w2 [3, 6]   z = h w1^T (+ h w2^T when w2 is used), loss = 0.1 sum z^2
// w2 is used at step 0 and 4 by every rank, at step 2 by rank 0 only, at steps 1 and 3 by
// none. Reference: one process, plain autograd on the sum of every rank's loss,
// torch::nn::utils::clip_grad_norm_ and torch::optim::AdamW (w2's .grad is undefined at
// steps 1 and 3, so torch skips it). Tolerance: parameters 1e-5 absolute after 5 steps at
// lr 1e-2 (fp32 summation order across ranks only); step counts exact.
#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "sharding/parallel/ddp.h"
#include "sharding/parallel/fsdp.h"
#include "sharding/parallel/optimizer.h"
#include "sharding/dist/parallel_dims.h"
#include "tests/dist_testing.h"
#include "vlm/runtime/check.h"

using namespace vlm::sharding;

namespace optskip {

constexpr int kSteps = 5;
constexpr double kLr = 1e-2, kClip = 0.5;

bool uses_w2(int step, int rank) { return step == 0 || step == 4 || (step == 2 && rank == 0); }

std::vector<UnitPlan> toy_units(Sharding sharding) {
  torch::manual_seed(11);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"a.wa", {6, 5}}, {"a.ba", {6}}, {"b.w1", {3, 6}}, {"b.w2", {3, 6}}};
  std::vector<UnitPlan> units(2);
  for (size_t k = 0; k < shapes.size(); ++k) {
    UnitPlan& u = units[k / 2];
    u.path = k < 2 ? "a" : "b";
    u.policy = sharding == Sharding::kFullShard ? Policy::kFsdp : Policy::kDdp;
    u.sharding = sharding;
    UnitParam p;
    p.name = shapes[k].first;
    p.param = torch::randn(shapes[k].second).set_requires_grad(true);
    p.lr = k == 3 ? 2 * kLr : kLr;
    p.weight_decay = k == 1 ? 0.0 : 0.1;
    u.numel += p.param.numel();
    u.params.push_back(p);
  }
  return units;
}

torch::Tensor toy_input(int step, int rank) {
  torch::manual_seed(500 + 10 * step + rank);
  return torch::randn({4, 5});
}

// Loss of one rank; `around(path, fn)` runs a unit's computation (FSDP gather / free).
torch::Tensor toy_loss(const std::vector<UnitPlan>& u, int step, int rank,
                       const std::function<torch::Tensor(const std::string&, const std::function<torch::Tensor()>&)>& around) {
  const torch::Tensor x = toy_input(step, rank);
  torch::Tensor h = around("a", [&] { return torch::tanh(torch::nn::functional::linear(x, u[0].params[0].param, u[0].params[1].param)); });
  torch::Tensor z = around("b", [&] {
    torch::Tensor out = torch::nn::functional::linear(h, u[1].params[0].param);
    if (uses_w2(step, rank)) out = out + torch::nn::functional::linear(h, u[1].params[1].param);
    return out;
  });
  return 0.1 * z.square().sum();
}

AdamWOptions toy_options() {
  AdamWOptions o;
  o.lr = kLr;
  o.grad_clip = kClip;
  return o;
}

// Single process reference: the parameters after `steps` steps of torch::optim::AdamW.
std::vector<torch::Tensor> toy_reference(int world, int steps) {
  auto units = toy_units(Sharding::kReplicated);
  std::vector<torch::Tensor> params;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& u : units)
    for (auto& p : u.params) {
      params.push_back(p.param);
      auto o = std::make_unique<torch::optim::AdamWOptions>(p.lr);
      o->weight_decay(p.weight_decay);
      groups.emplace_back(std::vector<torch::Tensor>{p.param}, std::move(o));
    }
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(kLr));
  auto plain = [](const std::string&, const std::function<torch::Tensor()>& fn) { return fn(); };
  for (int step = 0; step < steps; ++step) {
    torch::Tensor loss = torch::zeros({});
    for (int r = 0; r < world; ++r) loss = loss + toy_loss(units, step, r, plain);
    loss.backward();
    EXPECT_EQ(params[3].grad().defined(), step % 2 == 0) << "reference w2 grad at step " << step;
    torch::nn::utils::clip_grad_norm_(params, kClip);
    opt.step();
    opt.zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : params) out.push_back(p.detach().clone());
  return out;
}

// The toy model on the real engines. Owns what the optimizer points into.
struct ToyRun {
  std::vector<UnitPlan> units;
  std::unique_ptr<FsdpEngine> fsdp;
  std::unique_ptr<DdpReducer> ddp;
  std::unique_ptr<ShardedAdamW> opt;

  ToyRun(Comm& comm, Sharding sharding) : units(toy_units(sharding)) {
    if (sharding == Sharding::kFullShard) {
      fsdp = std::make_unique<FsdpEngine>(comm, comm, units, std::vector<std::pair<std::string, std::string>>{{"a", "a"}, {"b", "b"}},
                                          torch::kFloat32);
    } else {
      std::vector<torch::Tensor> ps;
      std::vector<std::string> names;
      for (auto& u : units)
        for (auto& p : u.params) {
          ps.push_back(p.param);
          names.push_back(p.name);
        }
      ddp = std::make_unique<DdpReducer>(comm, ps, names, /*bucket_bytes=*/200.0, torch::kFloat32);
    }
    opt = std::make_unique<ShardedAdamW>(comm, units, toy_options(), fsdp.get());
    opt->attach_ddp(ddp.get());
  }
  void step(Comm& comm, int step) {
    auto around = [this](const std::string& path, const std::function<torch::Tensor()>& fn) {
      if (!fsdp) return fn();
      fsdp->pre_forward(path);
      return fsdp->post_forward(path, fn());
    };
    toy_loss(units, step, comm.rank(), around).backward();
    if (fsdp) fsdp->finish_backward(vlm::str("toy step ", step));
    if (ddp) ddp->finish_backward(vlm::str("toy step ", step));
    opt->clip_grad_norm();
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> params() {
    if (fsdp) fsdp->gather_all("toy snapshot");
    std::vector<torch::Tensor> out;
    for (auto& u : units)
      for (auto& p : u.params) out.push_back(p.param.detach().clone());
    if (fsdp) fsdp->release_all();
    return out;
  }
};

void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want, const std::string& tag) {
  ASSERT_EQ(got.size(), want.size());
  const char* names[] = {"wa", "ba", "w1", "w2"};
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), 1e-5) << tag << ": parameter " << names[i];
}

void check_skip(Comm& comm, Sharding sharding) {
  const std::string tag = vlm::str(sharding_name(sharding), ", world ", comm.world_size(), ", rank ", comm.rank());
  ToyRun run(comm, sharding);
  for (int step = 0; step < kSteps; ++step) run.step(comm, step);
  expect_close(run.params(), toy_reference(comm.world_size(), kSteps), tag);
  // w2: steps 0 and 4 everywhere, step 2 on rank 0 only: 3 on every rank (at world 2, rank 1
  // had no gradient for it at step 2 but takes the step with the reduced one).
  EXPECT_EQ(run.opt->param_steps("b"), (std::vector<int64_t>{kSteps, 3})) << tag;
  EXPECT_EQ(run.opt->param_steps("a"), (std::vector<int64_t>{kSteps, kSteps})) << tag;
  EXPECT_EQ(run.opt->steps(), kSteps) << tag;
}

// In-memory checkpoint: every rank's slices of one world (here: world 1).
StateReader memory_reader(const std::vector<StateSlice>& slices, bool with_steps) {
  std::map<std::string, torch::Tensor> full;
  for (const auto& s : slices) {
    if (!full.count(s.key)) full[s.key] = torch::zeros({s.numel}, s.data.scalar_type());
    full[s.key].narrow(0, s.lo, s.hi - s.lo).copy_(s.data);
  }
  return [full, with_steps](const std::string& key, int64_t lo, int64_t hi) {
    const bool step_key = key.size() > 5 && key.compare(key.size() - 5, 5, "/step") == 0;
    VLM_CHECK(full.count(key) && (with_steps || !step_key), "checkpoint test: no state named ", key);
    return full.at(key).narrow(0, lo, hi - lo).clone();
  };
}

}  // namespace optskip

TEST(OptimizerSkip, World1DdpAndFsdp) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  optskip::check_skip(dims.comm(), Sharding::kReplicated);
  optskip::check_skip(dims.comm(), Sharding::kFullShard);
}

TEST(OptimizerSkip, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  ParallelOptions po;
  po.timeout = std::chrono::seconds(30);
  po.device = "cpu";
  auto dims = ParallelDims::init(detect_dist_env(process_env()), po);
  optskip::check_skip(dims.comm(), Sharding::kReplicated);
  optskip::check_skip(dims.comm(), Sharding::kFullShard);
  dims.comm().barrier("end");
}

TEST(OptimizerSkip, World2DdpAndFsdp) {
  vlm::test::DistRun run;
  run.world_size = 2;
  run.timeout = std::chrono::seconds(60);
  run.worker_test = "OptimizerSkip.DISABLED_Worker";
  EXPECT_TRUE(vlm::test::all_ok(vlm::test::run_workers(run)));
}

// Step counts survive state_slices -> load_state: 3 steps, save, a fresh run loads and does
// steps 3 and 4, bitwise equal to 5 uninterrupted steps. A checkpoint without "<unit>/step"
// loads with every count = the global step count.
TEST(OptimizerSkip, StepCountsRoundTripThroughCheckpointState) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  Comm& comm = dims.comm();
  for (Sharding sharding : {Sharding::kReplicated, Sharding::kFullShard}) {
    optskip::ToyRun whole(comm, sharding);
    for (int step = 0; step < optskip::kSteps; ++step) whole.step(comm, step);
    optskip::ToyRun first(comm, sharding);
    for (int step = 0; step < 3; ++step) first.step(comm, step);
    const std::vector<StateSlice> slices = first.opt->state_slices();
    optskip::ToyRun second(comm, sharding);
    second.opt->load_state(optskip::memory_reader(slices, true), 3);
    EXPECT_EQ(second.opt->param_steps("b"), (std::vector<int64_t>{3, 2}));
    for (int step = 3; step < optskip::kSteps; ++step) second.step(comm, step);
    const auto a = whole.params(), b = second.params();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << sharding_name(sharding) << " " << i;
    EXPECT_EQ(second.opt->param_steps("b"), whole.opt->param_steps("b"));

    optskip::ToyRun legacy(comm, sharding);
    legacy.opt->load_state(optskip::memory_reader(slices, false), 3);
    EXPECT_EQ(legacy.opt->param_steps("b"), (std::vector<int64_t>{3, 3}));
  }
}

// A released FSDP unit's parameters throw an error naming the unit when read (they used to
// be null storages: reading them crashed); gather_all makes them readable, release_all
// makes them throw again, and training still runs after that (the re-gather lifts it).
TEST(OptimizerSkip, ReleasedFsdpUnitThrowsNamingTheUnit) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  Comm& comm = dims.comm();
  optskip::ToyRun run(comm, Sharding::kFullShard);
  const torch::Tensor w1 = run.units[1].params[0].param;
  auto expect_released = [&](const std::string& what, const std::function<void()>& touch) {
    try {
      touch();
      ADD_FAILURE() << what << ": no error reading a released unit";
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("unit b is released"), std::string::npos) << what << ": " << msg;
      EXPECT_NE(msg.find("gather_all"), std::string::npos) << what << ": " << msg;
    }
  };
  torch::NoGradGuard no_grad;
  expect_released("sum", [&] { (void)w1.sum().item<double>(); });
  expect_released("clone", [&] { (void)w1.clone(); });
  expect_released("copy out", [&] { torch::empty({3, 6}).copy_(w1); });
  expect_released("to bf16", [&] { (void)w1.to(torch::kBFloat16); });
  expect_released("matmul", [&] { (void)torch::mm(torch::ones({2, 3}), w1); });
  expect_released("write", [&] { w1.detach().fill_(1.0); });
  EXPECT_THROW(run.fsdp->check_readable(w1, "export"), vlm::Error);
  run.fsdp->gather_all("read test");
  EXPECT_NO_THROW(run.fsdp->check_readable(w1, "export"));
  EXPECT_TRUE(std::isfinite(w1.sum().item<double>()));
  run.fsdp->release_all();
  expect_released("sum after release_all", [&] { (void)w1.sum().item<double>(); });
  {
    torch::GradMode::set_enabled(true);
    run.step(comm, 0);  // gathers, frees, trains
    torch::GradMode::set_enabled(false);
  }
  expect_released("sum after a step", [&] { (void)w1.sum().item<double>(); });
}

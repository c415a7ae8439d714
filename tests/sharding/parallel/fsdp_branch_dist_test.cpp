// FSDP on a branched module: units freed by their own post-backward signal (fsdp.h), not by
// the call order.
//
// Toy model of four Linear(8, 8) units through the real runner (PolicyRunner) and engine
// (FsdpEngine, full_shard), fp32:
//   h = tanh(a(x))            x [4, 8] needs a gradient, so a gets a signal too
//   z = tanh(c(h))            c and b both read h (a's output has two consumers); c is
//   y = tanh(b(h))            frozen (kFrozenSharded): no reduce-scatter frees it, only its
//   w = d(y + z)              signal
//   loss = sum(w^2) + 0.5 sum(z^2)   (z also feeds the loss directly)
// b and c run under activation checkpointing in the second variant. World 1 in process,
// world 2 in worker processes (each rank its own x); reference: plain autograd on the sum
// of every rank's loss. Checked: every trainable gradient (the reduced shard grads) within
// 1e-6 absolute; when h's gradient is complete (a hook on h, before a's backward), b, c and
// d are free: c's backward ran after b's (autograd runs the later-created branch first), and
// a free-on-the-next-unit's-pre-backward rule (the chain assumption this replaced) would
// still hold c until a's pre-backward; after backward, before finish_backward, no unit is
// still gathered; the gathered peak stays at most 3 units.
#include <gtest/gtest.h>

#include "sharding/parallel/fsdp.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "tests/dist_testing.h"
#include "vlm/runtime/check.h"

namespace {

using namespace vlm::sharding;

const std::vector<std::string> kUnits = {"a", "c", "b", "d"};  // call order

struct Toy {
  std::vector<torch::nn::Linear> layers;
  std::vector<UnitPlan> units;
  Toy() {
    torch::manual_seed(3);
    for (const auto& name : kUnits) {
      torch::nn::Linear l(8, 8);
      layers.push_back(l);
      UnitPlan u;
      u.path = name;
      u.policy = Policy::kFsdp;
      u.sharding = name == "c" ? Sharding::kFrozenSharded : Sharding::kFullShard;
      for (auto& item : l->named_parameters()) {
        UnitParam p;
        p.name = name + "." + item.key();
        p.param = item.value();
        if (name == "c") p.param.set_requires_grad(false);
        u.numel += p.param.numel();
        u.params.push_back(p);
      }
      units.push_back(u);
    }
  }
};

torch::Tensor toy_input(int rank) {
  torch::manual_seed(100 + rank);
  return torch::randn({4, 8}).set_requires_grad(true);
}

// One rank's loss; `run` runs a unit (the runner, or plain); `on_h` sees h.
torch::Tensor toy_loss(const torch::Tensor& x, const std::function<torch::Tensor(int, const torch::Tensor&)>& run,
                       const std::function<void(torch::Tensor&)>& on_h = nullptr) {
  torch::Tensor h = run(0, x);
  if (on_h) on_h(h);
  const torch::Tensor z = run(1, h);
  const torch::Tensor y = run(2, h);
  const torch::Tensor w = run(3, y + z);
  return w.square().sum() + 0.5 * z.square().sum();
}

void check_branched(Comm& comm, bool ckpt) {
  const int n = comm.world_size(), rank = comm.rank();
  const std::string tag = vlm::str("world ", n, ", rank ", rank, ckpt ? ", checkpointed b and c" : "");
  // Reference: one process, plain autograd, every rank's input.
  Toy ref;
  auto plain = [&](int k, const torch::Tensor& in) {
    return k == 3 ? ref.layers[k]->forward(in) : torch::tanh(ref.layers[k]->forward(in));
  };
  torch::Tensor total = torch::zeros({});
  for (int r = 0; r < n; ++r) total = total + toy_loss(toy_input(r), plain);
  total.backward();

  Toy toy;
  if (ckpt)
    for (auto& u : toy.units) u.checkpointed = u.path == "b" || u.path == "c";
  std::vector<std::pair<std::string, std::string>> order;
  for (const auto& name : kUnits) order.emplace_back(name, name);
  FsdpEngine engine(comm, comm, toy.units, order, torch::kFloat32);
  PolicyRunner runner(toy.units, &engine);
  auto sharded = [&](int k, const torch::Tensor& in) {
    const auto fn = [&toy, k](const torch::Tensor& v) {
      return k == 3 ? toy.layers[k]->forward(v) : torch::tanh(toy.layers[k]->forward(v));
    };
    return runner.run(kUnits[k], *toy.layers[k], in, fn);
  };
  engine.reset_peak();
  std::vector<std::string> gathered_at_h;  // units still gathered when h's gradient is complete
  bool h_hook_ran = false;
  auto on_h = [&](torch::Tensor& h) {
    h.register_hook([&](const torch::Tensor& g) {
      h_hook_ran = true;
      for (const char* name : {"b", "c", "d"})
        if (engine.find_unit(name)->gathered()) gathered_at_h.push_back(name);
      return g;
    });
  };
  toy_loss(toy_input(rank), sharded, on_h).backward();
  EXPECT_TRUE(h_hook_ran) << tag;
  EXPECT_TRUE(gathered_at_h.empty()) << tag << ": still gathered when h's gradient was complete: "
                                     << gathered_at_h.front();
  EXPECT_EQ(engine.gather_stats().units, 0) << tag << ": a unit is still gathered after backward";
  EXPECT_LE(engine.gather_stats().peak_units, 3) << tag;
  engine.finish_backward("branched");
  if (ckpt) EXPECT_EQ(runner.checkpointed_calls(), 2) << tag;

  for (size_t k = 0; k < kUnits.size(); ++k) {
    if (kUnits[k] == "c") continue;  // frozen
    FsdpUnit* u = engine.find_unit(kUnits[k]);
    ASSERT_NE(u, nullptr);
    std::vector<torch::Tensor> flat;
    for (auto& item : ref.layers[k]->named_parameters()) flat.push_back(item.value().grad().reshape({-1}));
    const torch::Tensor want = torch::cat(flat).narrow(0, u->lo(), u->hi() - u->lo());
    const double diff = (u->shard_grad() - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << tag << ": unit " << kUnits[k];
    std::printf("%s: unit %s gradient shard max |diff| %.3g\n", tag.c_str(), kUnits[k].c_str(), diff);
  }
}

TEST(FsdpBranchDist, BranchedModuleEqualsAutogradWorld1) {
  ParallelOptions o;
  o.device = "cpu";
  auto dims = ParallelDims::init(DistEnv{}, o);
  for (bool ckpt : {false, true}) check_branched(dims.comm(), ckpt);
}

TEST(FsdpBranchDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  ParallelOptions o;
  o.device = "cpu";
  o.timeout = std::chrono::seconds(60);
  auto dims = ParallelDims::init(detect_dist_env(process_env()), o);
  for (bool ckpt : {false, true}) check_branched(dims.comm(Lane::kGather), ckpt);
  dims.comm().barrier("end");
}

TEST(FsdpBranchDist, BranchedModuleEqualsAutogradWorld2) {
  vlm::test::DistRun run;
  run.world_size = 2;
  run.timeout = std::chrono::seconds(120);
  run.worker_test = "FsdpBranchDist.DISABLED_Worker";
  const auto results = vlm::test::run_workers(run);
  EXPECT_TRUE(vlm::test::all_ok(results));
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
}

}  // namespace

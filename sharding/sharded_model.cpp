// apply_policies and the pieces it composes (see sharded_model.h for the order).
#include "sharding/sharded_model.h"

#include <algorithm>

#include "vlm/check.h"

namespace vlm::sharding {

void apply_freeze(const std::vector<UnitPlan>& units) {
  for (const auto& u : units)
    if (!u.trainable())
      for (const auto& p : u.params) {
        auto t = p.param;
        t.set_requires_grad(false);
        t.mutable_grad() = torch::Tensor();
      }
}

PolicyRunner::PolicyRunner(const std::vector<UnitPlan>& units) {
  for (const auto& u : units)
    if (!u.trainable()) {
      frozen_.push_back(u.path);
      if (!u.aliases.empty()) frozen_.push_back(u.aliases);
    }
}

torch::Tensor PolicyRunner::run(const std::string& path, torch::nn::Module& /*unit*/, const torch::Tensor& x,
                                const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  const bool frozen = std::find(frozen_.begin(), frozen_.end(), path) != frozen_.end();
  if (frozen && !(x.defined() && x.requires_grad())) {
    // Nothing below this unit needs a gradient and its own parameters take none.
    torch::NoGradGuard no_grad;
    ++no_grad_calls_;
    return fn(x);
  }
  return fn(x);
}

void ShardedModel::set_sync(bool sync) {
  if (reducer_) reducer_->set_sync(sync);
}

void ShardedModel::finish_backward(const std::string& ctx) {
  if (reducer_) reducer_->finish_backward(ctx);
}

std::vector<StateSlice> ShardedModel::state_slices() const {
  torch::NoGradGuard no_grad;
  std::vector<StateSlice> out = optimizer_->state_slices();
  for (const auto& u : units_) {
    if (u.trainable()) continue;
    const auto [lo, hi] = owned_range(u.numel, world_, rank_);
    StateSlice s{u.path + "/param", u.numel, lo, hi, torch::empty({hi - lo}, u.params.front().param.options().device(torch::kCPU))};
    int64_t off = 0;
    for (const auto& p : u.params) {
      const int64_t a = std::max(lo, off), b = std::min(hi, off + p.param.numel());
      if (a < b) s.data.narrow(0, a - lo, b - a).copy_(p.param.detach().reshape({-1}).narrow(0, a - off, b - a));
      off += p.param.numel();
    }
    out.push_back(std::move(s));
  }
  return out;
}

void ShardedModel::load_state(const StateReader& read, int64_t optimizer_steps) {
  torch::NoGradGuard no_grad;
  optimizer_->load_state(read, optimizer_steps);
  for (const auto& u : units_) {
    if (u.trainable()) continue;
    torch::Tensor all = read(u.path + "/param", 0, u.numel);
    int64_t off = 0;
    for (const auto& p : u.params) {
      torch::Tensor t = p.param.detach();
      t.view({-1}).copy_(all.narrow(0, off, t.numel()));
      off += t.numel();
    }
  }
}

std::unique_ptr<ShardedModel> apply_policies(vlm::Qwen2VLImpl& model, const ShardingOptions& opts,
                                             ParallelDims& dims) {
  std::unique_ptr<ShardedModel> sm(new ShardedModel());
  Comm& comm = dims.comm();
  sm->rank_ = comm.rank();
  sm->world_ = comm.world_size();
  // 1. Policy table.
  sm->units_ = resolve_units(model, opts);
  for (const auto& u : sm->units_)
    for (const auto& p : u.params) {
      VLM_CHECK(p.param.scalar_type() == opts.param_dtype, "apply_policies: parameter ", p.name, " is ",
                p.param.scalar_type(), " but precision.param_dtype is ", c10::toString(opts.param_dtype),
                " (hint: build or materialise the model in the recipe's param_dtype before sharding)");
      VLM_CHECK(p.param.device() == dims.device(), "apply_policies: parameter ", p.name, " is on ",
                p.param.device(), " but this rank computes on ", dims.device(),
                " (hint: materialise the model on ParallelDims::device())");
    }
  for (auto& u : sm->units_) {
    if (u.policy == Policy::kFsdp) {
      sm->notes_.push_back(str("unit ", u.path, ": fsdp ", strategy_name(u.strategy),
                               " has no runtime yet (issue #8); it runs as ddp no_shard (replicated)"));
      u.sharding = u.sharding == Sharding::kShardOptimizer ? Sharding::kShardOptimizer : Sharding::kReplicated;
    }
    if (u.sharding == Sharding::kFrozenSharded) u.sharding = Sharding::kFrozen;
    if (u.checkpointed)
      sm->notes_.push_back(str("unit ", u.path, ": activation checkpointing is planned but not applied yet"));
  }
  // 2. Freeze.
  apply_freeze(sm->units_);
  // 3. Same starting point on every rank.
  std::vector<torch::Tensor> all;
  for (const auto& u : sm->units_)
    for (const auto& p : u.params) all.push_back(p.param.detach());
  broadcast_from_rank0(comm, all, "broadcast parameters from rank 0");
  // 4. DDP buckets over the trainable units (forward registration order).
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& u : sm->units_)
    if (u.trainable())
      for (const auto& p : u.params) {
        params.push_back(p.param);
        names.push_back(p.name);
      }
  if (!params.empty()) {
    const double bucket_bytes = opts.ddp_bucket_mb * 1024.0 * 1024.0;
    sm->reducer_ = std::make_unique<DdpReducer>(comm, params, names, bucket_bytes, opts.reduce_dtype);
  }
  // 5. Runner.
  sm->runner_ = std::make_shared<PolicyRunner>(sm->units_);
  model.set_runner(sm->runner_);
  // 6. Optimizer.
  sm->optimizer_ = std::make_unique<ShardedAdamW>(comm, sm->units_, opts.optim);
  return sm;
}

}  // namespace vlm::sharding

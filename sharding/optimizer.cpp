// Sharded AdamW (see optimizer.h).
#include "sharding/optimizer.h"

#include <algorithm>
#include <cmath>

#include "sharding/fsdp.h"
#include "vlm/check.h"

namespace vlm::sharding {

std::pair<int64_t, int64_t> owned_range(int64_t numel, int64_t world, int64_t rank) {
  const int64_t shard = (numel + world - 1) / world;
  return {std::min(rank * shard, numel), std::min((rank + 1) * shard, numel)};
}

ShardedAdamW::ShardedAdamW(Comm& comm, const std::vector<UnitPlan>& units, const AdamWOptions& opts,
                           FsdpEngine* fsdp)
    : comm_(comm), opts_(opts), fsdp_(fsdp) {
  torch::NoGradGuard no_grad;
  const int64_t n = comm.world_size(), r = comm.rank();
  for (const auto& u : units) {
    if (!u.trainable()) continue;
    Group g;
    g.path = u.path;
    g.zero1 = u.sharding == Sharding::kShardOptimizer;
    if (u.sharding == Sharding::kFullShard || u.sharding == Sharding::kShardGradOp) {
      g.fsdp = fsdp != nullptr ? fsdp->find_unit(u.path) : nullptr;
      VLM_CHECK(g.fsdp != nullptr, "optimizer: unit ", u.path, " has sharding ", sharding_name(u.sharding),
                " but no FSDP unit (hint: build it through apply_policies, which creates the FsdpEngine)");
    }
    VLM_CHECK(g.zero1 || g.fsdp != nullptr || u.sharding == Sharding::kReplicated,
              "optimizer: unit ", u.path, " has sharding ", sharding_name(u.sharding),
              "; expected replicated, ZeRO-1 or an FSDP unit");
    g.params = u.params;
    for (const auto& p : g.params) {
      g.offsets.push_back(g.numel);
      g.numel += p.param.numel();
    }
    g.shard = (g.numel + n - 1) / n;
    g.lo = std::min(r * g.shard, g.numel);
    g.hi = std::min((r + 1) * g.shard, g.numel);
    const bool sharded = g.zero1 || g.fsdp != nullptr;
    const int64_t state_lo = sharded ? g.lo : 0, state_hi = sharded ? g.hi : g.numel;
    for (size_t k = 0; k < g.params.size(); ++k) {
      const torch::Tensor& p = g.params[k].param;
      const int64_t a = std::max(state_lo, g.offsets[k]), b = std::min(state_hi, g.offsets[k] + p.numel());
      if (a >= b) continue;
      Segment s;
      s.param = static_cast<int64_t>(k);
      s.param_offset = a - g.offsets[k];
      s.len = b - a;
      s.flat_offset = a;
      torch::Tensor view = g.fsdp != nullptr ? g.fsdp->shard_param().narrow(0, a - g.lo, s.len)
                                             : p.detach().view({-1}).narrow(0, s.param_offset, s.len);
      s.target = view;
      s.master = p.scalar_type() == torch::kFloat32 ? view : view.to(torch::kFloat32).clone();
      s.m = torch::zeros({s.len}, view.options().dtype(torch::kFloat32));
      s.v = torch::zeros({s.len}, view.options().dtype(torch::kFloat32));
      g.segments.push_back(std::move(s));
    }
    groups_.push_back(std::move(g));
  }
}

double ShardedAdamW::clip_grad_norm(const std::string& ctx) {
  torch::NoGradGuard no_grad;
  double sumsq = 0;
  for (const auto& g : groups_) {
    if (g.fsdp != nullptr) {  // the reduced shard grad covers exactly R_r
      torch::Tensor part = g.fsdp->shard_grad().to(torch::kDouble);
      sumsq += part.dot(part).item<double>();
      continue;
    }
    for (size_t k = 0; k < g.params.size(); ++k) {
      const torch::Tensor& grad = g.params[k].param.grad();
      if (!grad.defined()) continue;
      const int64_t a = std::max(g.lo, g.offsets[k]), b = std::min(g.hi, g.offsets[k] + grad.numel());
      if (a >= b) continue;
      torch::Tensor part = grad.reshape({-1}).narrow(0, a - g.offsets[k], b - a).to(torch::kDouble);
      sumsq += part.dot(part).item<double>();
    }
  }
  if (comm_.world_size() > 1) {
    torch::Tensor t = torch::tensor({sumsq}, torch::kDouble);
    comm_.all_reduce(t, ReduceOp::kSum, ctx);
    sumsq = t.item<double>();
  }
  const double norm = std::sqrt(sumsq);
  if (opts_.grad_clip > 0) {
    const double coef = opts_.grad_clip / (norm + 1e-6);
    if (coef < 1)
      for (auto& g : groups_) {
        if (g.fsdp != nullptr) g.fsdp->shard_grad().mul_(coef);
        for (auto& p : g.params)
          if (p.param.grad().defined()) p.param.mutable_grad().mul_(coef);
      }
  }
  return norm;
}

void ShardedAdamW::step(double lr_scale, const std::string& ctx) {
  torch::NoGradGuard no_grad;
  ++step_;
  const double b1 = opts_.beta1, b2 = opts_.beta2;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(step_));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(step_));
  for (auto& g : groups_) {
    for (auto& s : g.segments) {
      const UnitParam& up = g.params[s.param];
      const double lr = up.lr * lr_scale;
      torch::Tensor grad;  // [len] fp32
      if (g.fsdp != nullptr)
        grad = g.fsdp->shard_grad().narrow(0, s.flat_offset - g.lo, s.len);
      else if (up.param.grad().defined())
        grad = up.param.grad().reshape({-1}).narrow(0, s.param_offset, s.len).to(torch::kFloat32);
      else
        grad = torch::zeros_like(s.m);
      if (up.weight_decay != 0) s.master.mul_(1 - lr * up.weight_decay);
      s.m.mul_(b1).add_(grad, 1 - b1);
      s.v.mul_(b2).addcmul_(grad, grad, 1 - b2);
      torch::Tensor denom = (s.v.sqrt() / std::sqrt(bc2)).add_(opts_.eps);
      s.master.addcdiv_(s.m, denom, -lr / bc1);
      if (up.param.scalar_type() != torch::kFloat32)  // write back into the low-precision param
        s.target.copy_(s.master);
    }
    if (!g.zero1 || comm_.world_size() == 1) continue;
    // ZeRO-1: every rank's updated slice -> every rank's parameters.
    const torch::Tensor& p0 = g.params.front().param;
    torch::Tensor flat = torch::zeros({g.shard * comm_.world_size()}, p0.options().requires_grad(false));
    for (auto& s : g.segments)
      flat.narrow(0, s.flat_offset, s.len).copy_(g.params[s.param].param.detach().view({-1}).narrow(0, s.param_offset, s.len));
    comm_.all_gather(flat, flat.narrow(0, comm_.rank() * g.shard, g.shard), str(ctx, ", ZeRO-1 unit ", g.path));
    for (size_t k = 0; k < g.params.size(); ++k) {
      torch::Tensor p = g.params[k].param.detach();
      p.view({-1}).copy_(flat.narrow(0, g.offsets[k], p.numel()));
    }
  }
}

void ShardedAdamW::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) {
    for (auto& p : g.params) p.param.mutable_grad() = torch::Tensor();
    if (g.fsdp != nullptr) g.fsdp->shard_grad().zero_();
  }
}

std::vector<StateSlice> ShardedAdamW::state_slices() const {
  torch::NoGradGuard no_grad;
  std::vector<StateSlice> out;
  for (const auto& g : groups_) {
    // Every rank holds state for at least [lo, hi) (replicated: all of [0, P)).
    StateSlice master{g.path + "/master", g.numel, g.lo, g.hi, torch::empty({g.hi - g.lo}, torch::kFloat32)};
    StateSlice m{g.path + "/exp_avg", g.numel, g.lo, g.hi, torch::empty({g.hi - g.lo}, torch::kFloat32)};
    StateSlice v{g.path + "/exp_avg_sq", g.numel, g.lo, g.hi, torch::empty({g.hi - g.lo}, torch::kFloat32)};
    int64_t covered = 0;
    for (const auto& s : g.segments) {
      const int64_t a = std::max(g.lo, s.flat_offset), b = std::min(g.hi, s.flat_offset + s.len);
      if (a >= b) continue;
      master.data.narrow(0, a - g.lo, b - a).copy_(s.master.narrow(0, a - s.flat_offset, b - a));
      m.data.narrow(0, a - g.lo, b - a).copy_(s.m.narrow(0, a - s.flat_offset, b - a));
      v.data.narrow(0, a - g.lo, b - a).copy_(s.v.narrow(0, a - s.flat_offset, b - a));
      covered += b - a;
    }
    VLM_CHECK(covered == g.hi - g.lo, "optimizer state of unit ", g.path, ": segments cover ", covered,
              " of the owned range's ", g.hi - g.lo, " elements (internal error)");
    out.push_back(std::move(master));
    out.push_back(std::move(m));
    out.push_back(std::move(v));
  }
  return out;
}

void ShardedAdamW::load_state(const StateReader& read, int64_t steps) {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) {
    // Parameters: every element, from the fp32 masters.
    torch::Tensor all = read(g.path + "/master", 0, g.numel).to(torch::kFloat32);
    VLM_CHECK(all.numel() == g.numel, "checkpoint: ", g.path, "/master has ", all.numel(), " elements, expected ",
              g.numel);
    if (g.fsdp != nullptr) {
      fsdp_->load_params(*g.fsdp, all);  // local shard only; the parameters are gathered on use
    } else {
      for (size_t k = 0; k < g.params.size(); ++k) {
        torch::Tensor p = g.params[k].param.detach();
        p.view({-1}).copy_(all.narrow(0, g.offsets[k], p.numel()));
      }
    }
    for (auto& s : g.segments) {
      s.master.copy_(all.narrow(0, s.flat_offset, s.len));  // a no-op copy onto itself for fp32 views
      s.m.copy_(read(g.path + "/exp_avg", s.flat_offset, s.flat_offset + s.len));
      s.v.copy_(read(g.path + "/exp_avg_sq", s.flat_offset, s.flat_offset + s.len));
    }
  }
  step_ = steps;
}

int64_t ShardedAdamW::state_numel() const {
  int64_t n = 0;
  for (const auto& g : groups_)
    for (const auto& s : g.segments) {
      n += 2 * s.len;
      if (g.params[s.param].param.scalar_type() != torch::kFloat32) n += s.len;
    }
  return n;
}

bool ShardedAdamW::has_state(const torch::Tensor& param) const {
  for (const auto& g : groups_)
    for (const auto& s : g.segments)
      if (g.params[s.param].param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return true;
  return false;
}

}  // namespace vlm::sharding

// Sharded AdamW (see optimizer.h).
#include "sharding/parallel/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>

#include "sharding/parallel/cpu_pieces.h"
#include "sharding/parallel/ddp.h"
#include "sharding/parallel/fsdp.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

std::pair<int64_t, int64_t> owned_range(int64_t numel, int64_t world, int64_t rank) {
  const int64_t shard = (numel + world - 1) / world;
  return {std::min(rank * shard, numel), std::min((rank + 1) * shard, numel)};
}

ShardedAdamW::ShardedAdamW(Comm& comm, const std::vector<UnitPlan>& units, const AdamWOptions& opts,
                           FsdpEngine* fsdp, Comm* control, bool offload, Comm* expert_replicate)
    : comm_(comm), control_(control), expert_replicate_(expert_replicate), opts_(opts), fsdp_(fsdp) {
  if (offload) queue_ = std::make_unique<HostUpdateQueue>();
  torch::NoGradGuard no_grad;
  const int64_t n = comm.world_size(), r = comm.rank();
  for (const auto& u : units) {
    if (!u.trainable()) continue;
    Group g;
    g.path = u.path;
    g.zero1 = u.sharding == Sharding::kShardOptimizer;
    if (u.sharding == Sharding::kFullShard || u.sharding == Sharding::kShardGradOp ||
        u.sharding == Sharding::kHybridShard) {
      g.fsdp = fsdp != nullptr ? fsdp->find_unit(u.path) : nullptr;
      VLM_CHECK(g.fsdp != nullptr, "optimizer: unit ", u.path, " has sharding ", sharding_name(u.sharding),
                " but no FSDP unit (hint: build it through apply_policies, which creates the FsdpEngine)");
    }
    g.experts = u.sharding == Sharding::kExpert;
    VLM_CHECK(g.zero1 || g.fsdp != nullptr || u.sharding == Sharding::kReplicated || g.experts,
              "optimizer: unit ", u.path, " has sharding ", sharding_name(u.sharding),
              "; expected replicated, ZeRO-1, experts (ep) or an FSDP unit");
    VLM_CHECK(!g.experts || expert_replicate != nullptr || n == 1, "optimizer: unit ", u.path,
              " holds expert-parallel experts but no expert-replicate comm was given (hint: build it through "
              "apply_policies)");
    g.params = u.params;
    for (const auto& p : g.params) {
      g.offsets.push_back(g.numel);
      g.numel += p.param.numel();
    }
    // R_r over the ranks holding the same values (the expert-replicate group for experts).
    const int64_t gn = g.experts && expert_replicate != nullptr ? expert_replicate->world_size() : n;
    const int64_t gr = g.experts && expert_replicate != nullptr ? expert_replicate->rank() : r;
    g.rep_n = gn;
    g.rep_r = gr;
    g.shard = (g.numel + gn - 1) / gn;
    g.lo = std::min(gr * g.shard, g.numel);
    g.hi = std::min((gr + 1) * g.shard, g.numel);
    g.own_lo = g.lo;
    g.own_hi = g.hi;
    if (g.fsdp != nullptr) {  // the unit's own split (hybrid_shard: over its shard group)
      VLM_CHECK(g.fsdp->numel() == g.numel, "optimizer: unit ", u.path, " has ", g.numel,
                " elements, its FSDP unit ", g.fsdp->numel());
      g.shard = g.fsdp->shard();
      g.lo = g.fsdp->lo();
      g.hi = g.fsdp->hi();
      g.own_lo = g.fsdp->own_lo();
      g.own_hi = g.fsdp->own_hi();
    }
    const bool sharded = g.zero1 || g.fsdp != nullptr || (g.experts && g.rep_n > 1);
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
      if (offload) {  // host memory (pinned on CUDA); the master is a copy even for fp32
        s.master = host_zeros(s.len, view.device());
        s.master.copy_(view);
        s.m = host_zeros(s.len, view.device());
        s.v = host_zeros(s.len, view.device());
        s.host_grad = host_zeros(s.len, view.device());
        g.segments.push_back(std::move(s));
        continue;
      }
      s.master = p.scalar_type() == torch::kFloat32 ? view : view.to(torch::kFloat32).clone();
      s.m = torch::zeros({s.len}, view.options().dtype(torch::kFloat32));
      s.v = torch::zeros({s.len}, view.options().dtype(torch::kFloat32));
      g.segments.push_back(std::move(s));
    }
    g.ddp_index.assign(g.params.size(), -1);
    g.ddp_of.assign(g.params.size(), nullptr);
    g.param_steps.assign(g.params.size(), 0);
    g.active.assign(g.params.size(), 0);
    groups_.push_back(std::move(g));
  }
}

ShardedAdamW::~ShardedAdamW() = default;  // queue_ (declared last, destroyed first) runs what is queued

void ShardedAdamW::wait() const {
  if (queue_) queue_->wait_all();
}

void ShardedAdamW::wait_unit(const FsdpUnit& u) const {
  if (!queue_) return;
  for (const auto& g : groups_)
    if (g.fsdp == &u) return queue_->wait(g.ticket);
}

void ShardedAdamW::wait_unsharded() const {
  if (queue_) queue_->wait(unsharded_ticket_);
}

void ShardedAdamW::attach_ddp(DdpReducer* ddp) {
  if (ddp == nullptr) return;
  ddps_.push_back(ddp);
  for (auto& g : groups_)
    for (size_t k = 0; k < g.params.size(); ++k) {
      const int64_t i = g.fsdp == nullptr ? ddp->index_of(g.params[k].param) : -1;
      if (i < 0) continue;
      g.ddp_index[k] = i;
      g.ddp_of[k] = ddp;
    }
}

bool ShardedAdamW::local_had_grad(const Group& g, size_t k) const {
  if (g.fsdp != nullptr) return g.fsdp->had_grad(k);
  if (g.ddp_of[k] != nullptr) return g.ddp_of[k]->had_grad(g.ddp_index[k]);
  return g.params[k].param.grad().defined();
}

torch::Tensor ShardedAdamW::param_grad(const Group& g, size_t k) const {
  // DDP: the reducer's gradient (its fp32 bucket view when gradients accumulate there).
  if (g.ddp_of[k] != nullptr) return g.ddp_of[k]->grad(g.ddp_index[k]);
  return g.params[k].param.grad();
}

torch::Tensor ShardedAdamW::segment_grad(const Group& g, const Segment& s) const {
  if (g.fsdp != nullptr) return g.fsdp->shard_grad().narrow(0, s.flat_offset - g.lo, s.len);
  const torch::Tensor grad = param_grad(g, static_cast<size_t>(s.param));
  if (!grad.defined()) return torch::zeros_like(s.m);  // no gradient here, but on another rank
  return grad.reshape({-1}).narrow(0, s.param_offset, s.len).to(torch::kFloat32);
}

void ShardedAdamW::add_shared_gradients(Comm* comm, const std::function<int64_t(const std::string&)>& sharing,
                                        const std::string& what) {
  if (comm == nullptr || comm->world_size() == 1) return;
  shared_.push_back({comm, what});
  for (auto& g : groups_) {
    g.shared.emplace_back(g.params.size(), 0);
    for (size_t k = 0; k < g.params.size(); ++k) g.shared.back()[k] = sharing(g.params[k].name);
  }
}

void ShardedAdamW::set_pipeline(int64_t stage, int64_t stages) {
  pp_stage_ = stage;
  pp_stages_ = stages;
  int64_t flags = 0;
  for (const auto& g : groups_) flags += static_cast<int64_t>(g.params.size());
  torch::Tensor t = torch::tensor({static_cast<double>(flags)}, torch::kFloat64);
  if (control().world_size() > 1) control().all_reduce(t, ReduceOp::kMax, "pipeline: the stages' parameter counts");
  flags_max_ = static_cast<int64_t>(t.item<double>());
}

void ShardedAdamW::reduce_shared_gradients(const std::string& ctx) {
  if (shared_.empty() || shared_reduced_) return;
  torch::NoGradGuard no_grad;
  if (fsdp_ != nullptr) fsdp_->check_reduced(ctx);
  wait();
  for (size_t i = 0; i < shared_.size(); ++i) reduce_shared(i, ctx + ", " + shared_[i].what);
  shared_reduced_ = true;
}

void ShardedAdamW::reduce_shared(size_t i, const std::string& ctx) {
  Comm& comm = *shared_[i].comm;
  // Every rank of the group holds the same shared parameters in the same layout (its slices
  // have the same shapes), so the views line up element for element.
  std::vector<torch::Tensor> views;
  std::vector<int64_t> pieces;  // per view: its sharing (1: every rank, k: one of k pieces)
  for (auto& g : groups_) {
    const std::vector<int64_t>& sh = g.shared[i];
    if (g.fsdp != nullptr) {
      for (const auto& s : g.segments)
        if (sh[s.param]) {
          views.push_back(g.fsdp->shard_grad().narrow(0, s.flat_offset - g.lo, s.len));
          pieces.push_back(sh[s.param]);
        }
      continue;
    }
    for (size_t k = 0; k < g.params.size(); ++k) {
      if (!sh[k]) continue;
      torch::Tensor grad = g.ddp_of[k] != nullptr ? g.ddp_of[k]->grad_or_zeros(g.ddp_index[k]) : param_grad(g, k);
      if (!grad.defined()) {
        g.params[k].param.mutable_grad() = torch::zeros_like(g.params[k].param);
        grad = g.params[k].param.grad();
      }
      views.push_back(grad.view({-1}));
      pieces.push_back(sh[k]);
    }
  }
  if (views.empty()) return;
  // A k-piece view goes to its piece of k zeroed pieces: the sum over the group leaves in
  // each piece the sum over the ranks holding it.
  const int64_t n = comm.world_size(), r = comm.rank();
  std::vector<torch::Tensor> flat;
  for (size_t v = 0; v < views.size(); ++v) {
    const int64_t k = pieces[v], len = views[v].numel();
    if (k == 1) {
      flat.push_back(views[v].to(torch::kFloat32));
      continue;
    }
    torch::Tensor z = torch::zeros({k * len}, views[v].options().dtype(torch::kFloat32));
    z.narrow(0, r * k / n * len, len).copy_(views[v]);
    flat.push_back(z);
  }
  torch::Tensor sum = torch::cat(flat);
  comm.all_reduce(sum, ReduceOp::kSum, ctx);
  int64_t off = 0;
  for (size_t v = 0; v < views.size(); ++v) {
    const int64_t k = pieces[v], len = views[v].numel();
    views[v].copy_(sum.narrow(0, off + (k == 1 ? 0 : r * k / n * len), len));
    off += k * len;
  }
}

bool ShardedAdamW::counted_in_norm(const Group& g, size_t k) const {
  for (size_t i = 0; i < shared_.size(); ++i) {
    const int64_t pieces = g.shared[i][k];
    const Comm& c = *shared_[i].comm;
    if (pieces > 0 && c.rank() % (c.world_size() / pieces) != 0) return false;
  }
  return true;
}

std::vector<torch::Tensor> ShardedAdamW::norm_parts() const {
  std::vector<torch::Tensor> parts;
  // A shared parameter counts on the first rank sharing it (counted_in_norm).
  const bool any_shared = !shared_.empty();
  for (const auto& g : groups_) {
    if (g.fsdp != nullptr && any_shared) {
      for (const auto& s : g.segments) {
        const int64_t a = std::max(s.flat_offset, g.own_lo), b = std::min(s.flat_offset + s.len, g.own_hi);
        if (counted_in_norm(g, s.param) && a < b) parts.push_back(g.fsdp->shard_grad().narrow(0, a - g.lo, b - a));
      }
      continue;
    }
    if (g.fsdp != nullptr) {  // the reduced shard grad covers R_r; counted once over the replicas
      if (g.own_hi > g.own_lo) parts.push_back(g.fsdp->shard_grad().narrow(0, g.own_lo - g.lo, g.own_hi - g.own_lo));
      continue;
    }
    for (size_t k = 0; k < g.params.size(); ++k) {
      if (any_shared && !counted_in_norm(g, k)) continue;
      const torch::Tensor grad = param_grad(g, k);
      if (!grad.defined()) continue;
      const int64_t a = std::max(g.lo, g.offsets[k]), b = std::min(g.hi, g.offsets[k] + grad.numel());
      if (a < b) parts.push_back(grad.reshape({-1}).narrow(0, a - g.offsets[k], b - a));
    }
  }
  return parts;
}

double ShardedAdamW::agree(double local_sumsq, const std::string& ctx) {
  int64_t flags = 0;
  for (const auto& g : groups_) flags += static_cast<int64_t>(g.params.size());
  // Pipeline stages hold different parameters: each stage's flags in a range of their own.
  const int64_t width = pp_stages_ > 1 ? flags_max_ : flags, base = 1 + pp_stage_ * width;
  VLM_ASSERT(flags <= width, "optimizer: ", flags, " parameters but set_pipeline counted at most ", width);
  torch::Tensor t = torch::zeros({1 + pp_stages_ * width}, torch::kFloat64);  // [sum of squares, had-grad flags...]
  double* d = t.data_ptr<double>();
  d[0] = local_sumsq;
  int64_t i = base;
  for (const auto& g : groups_)
    for (size_t k = 0; k < g.params.size(); ++k) d[i++] = local_had_grad(g, k) ? 1.0 : 0.0;
  if (control().world_size() > 1) {  // the world (tp ranks hold different slices, stages different layers)
    control().all_reduce(t, ReduceOp::kSum, ctx);
    d = t.data_ptr<double>();
  }
  i = base;
  for (auto& g : groups_)
    for (size_t k = 0; k < g.params.size(); ++k) g.active[k] = d[i++] > 0.5;
  agreed_ = true;
  return d[0];
}

double ShardedAdamW::clip_grad_norm(const std::string& ctx) {
  torch::NoGradGuard no_grad;
  if (fsdp_ != nullptr) fsdp_->check_reduced(ctx);
  wait();
  reduce_shared_gradients(ctx + ", shared gradients");
  const double norm = std::sqrt(agree(sum_of_squares(norm_parts()), ctx));
  if (opts_.grad_clip > 0) {
    const double coef = opts_.grad_clip / (norm + 1e-6);
    if (coef < 1) {  // NaN: no clip (the trainer skips the step)
      std::vector<torch::Tensor> grads;
      for (auto& g : groups_) {
        if (g.fsdp != nullptr) {
          grads.push_back(g.fsdp->shard_grad());
          continue;
        }
        for (size_t k = 0; k < g.params.size(); ++k)
          if (torch::Tensor grad = param_grad(g, k); grad.defined()) grads.push_back(grad);
      }
      if (!grads.empty()) at::_foreach_mul_(grads, coef);
    }
  }
  return norm;
}

void ShardedAdamW::add_segment(Batch& b, const Group& g, const Segment& s, torch::Tensor grad,
                               double lr_scale) const {
  const UnitParam& up = g.params[s.param];
  const double t = static_cast<double>(g.param_steps[s.param]);
  b.master.push_back(s.master);
  b.grad.push_back(std::move(grad));
  b.m.push_back(s.m);
  b.v.push_back(s.v);
  b.lr.push_back(up.lr * lr_scale);
  b.wd.push_back(up.weight_decay);
  b.bc1.push_back(1 - std::pow(opts_.beta1, t));
  b.bc2.push_back(1 - std::pow(opts_.beta2, t));
  b.t.push_back(t);
}

void ShardedAdamW::step(double lr_scale, const std::string& ctx) {
  torch::NoGradGuard no_grad;
  if (fsdp_ != nullptr) fsdp_->check_reduced(ctx);
  wait();
  reduce_shared_gradients(ctx + ", shared gradients");
  if (!agreed_) agree(0.0, ctx + ", gradient flags");
  agreed_ = false;
  ++step_;
  if (queue_) return step_offload(lr_scale, ctx);
  Batch fused, blocked, foreach;
  std::vector<torch::Tensor> targets, masters;  // low-precision parameters to write back
  for (auto& g : groups_) {
    for (size_t k = 0; k < g.params.size(); ++k) g.param_steps[k] += g.active[k];
    for (auto& s : g.segments) {
      if (!g.active[s.param]) continue;  // no gradient on any rank: skipped (torch.optim.AdamW)
      const UnitParam& up = g.params[s.param];
      torch::Tensor grad = segment_grad(g, s);
      const bool cpu = s.master.is_cpu() && grad.is_cpu();
      Batch& b = (kernel_ == AdamWKernel::kFused || (kernel_ == AdamWKernel::kAuto && fused_fits(s.master, grad))) ? fused
                 : (kernel_ == AdamWKernel::kBlocked || (kernel_ == AdamWKernel::kAuto && cpu)) ? blocked
                                                                                                 : foreach;
      add_segment(b, g, s, std::move(grad), lr_scale);
      if (up.param.scalar_type() != torch::kFloat32) {
        targets.push_back(s.target);
        masters.push_back(s.master);
      }
    }
  }
  if (!foreach.master.empty()) update_foreach(foreach);
  if (!blocked.master.empty()) update_blocked(blocked);
  if (!fused.master.empty()) update_fused(fused);
  if (!targets.empty()) at::_foreach_copy_(targets, masters);  // write back into the low-precision params
  for (auto& g : groups_)
    if (Comm* c = gather_comm(g)) zero1_gather(g, *c, ctx);
}

Comm* ShardedAdamW::gather_comm(const Group& g) {
  if (g.zero1 && comm_.world_size() > 1) return &comm_;
  if (g.experts && g.rep_n > 1) return expert_replicate_;
  return nullptr;
}

// Offload (offload.h): per unit, the gradients to host staging, then one queued host update
// (blocked kernel + write-back). ZeRO-1 units first (at world > 1 step() waits for them: their
// all-gather sends the update), then the replicated ones (a forward waits for all of these
// before its first unit), then the FSDP units in unit order (each waited by its gather).
void ShardedAdamW::step_offload(double lr_scale, const std::string& ctx) {
  std::vector<Group*> order;
  for (auto& g : groups_)
    if (gather_comm(g) != nullptr) order.push_back(&g);
  for (auto& g : groups_)
    if (g.fsdp == nullptr && gather_comm(g) == nullptr) order.push_back(&g);
  for (auto& g : groups_)
    if (g.fsdp != nullptr) order.push_back(&g);
  for (Group* gp : order) {
    Group& g = *gp;
    for (size_t k = 0; k < g.params.size(); ++k) g.param_steps[k] += g.active[k];
    auto b = std::make_shared<Batch>();
    std::vector<torch::Tensor> targets, masters;  // device parameters <- host masters
    for (auto& s : g.segments) {
      if (!g.active[s.param]) continue;  // no gradient on any rank: skipped (torch.optim.AdamW)
      s.host_grad.copy_(segment_grad(g, s), /*non_blocking=*/true);  // device -> pinned host
      add_segment(*b, g, s, s.host_grad, lr_scale);
      targets.push_back(s.target);
      masters.push_back(s.master);
    }
    if (b->master.empty()) continue;
    const CopyFence fence = CopyFence::record(targets.front().device());
    g.ticket = queue_->submit([this, b, targets = std::move(targets), masters = std::move(masters), fence] {
      fence.wait();  // the gradients have arrived in host memory
      update_host(*b);
      copy_back(targets, masters);
    });
    if (g.fsdp == nullptr) unsharded_ticket_ = g.ticket;
    if (Comm* c = gather_comm(g)) {
      queue_->wait(g.ticket);  // the all-gather sends the updated slice
      zero1_gather(g, *c, ctx);
    }
  }
}

// torch::optim::AdamW's per-parameter ops, as foreach ops over the segments.
void ShardedAdamW::update_foreach(Batch& b) {
  const double b1 = opts_.beta1, b2 = opts_.beta2;
  std::vector<torch::Tensor> decayed;
  std::vector<at::Scalar> decay, bc2_sqrt, step_size;
  for (size_t i = 0; i < b.master.size(); ++i) {
    if (b.wd[i] != 0) {
      decayed.push_back(b.master[i]);
      decay.emplace_back(1 - b.lr[i] * b.wd[i]);
    }
    bc2_sqrt.emplace_back(std::sqrt(b.bc2[i]));
    step_size.emplace_back(-b.lr[i] / b.bc1[i]);
  }
  if (!decayed.empty()) at::_foreach_mul_(decayed, decay);
  at::_foreach_mul_(b.m, b1);
  at::_foreach_add_(b.m, b.grad, 1 - b1);
  at::_foreach_mul_(b.v, b2);
  at::_foreach_addcmul_(b.v, b.grad, b.grad, 1 - b2);
  std::vector<torch::Tensor> denom = at::_foreach_sqrt(b.v);
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, opts_.eps);
  at::_foreach_addcdiv_(b.master, b.m, denom, step_size);
}

// at::_fused_adamw_ takes master, grad, m and v of one dtype and device: fp32 here (m and v
// are fp32 and on the master's device).
bool ShardedAdamW::fused_fits(const torch::Tensor& master, const torch::Tensor& grad) {
  return master.scalar_type() == torch::kFloat32 && grad.scalar_type() == torch::kFloat32 &&
         master.device() == grad.device() && (master.is_cpu() || master.is_cuda());
}

// The offload's host update: the kernel step() would pick for host tensors.
void ShardedAdamW::update_host(Batch& b) {
  bool fused = kernel_ == AdamWKernel::kFused;
  if (kernel_ == AdamWKernel::kAuto) {
    fused = true;
    for (size_t i = 0; i < b.master.size(); ++i) fused = fused && fused_fits(b.master[i], b.grad[i]);
  }
  if (fused) update_fused(b);
  else update_blocked(b);
}

// update_foreach's ops with the same scalars, run piece by piece (for_each_piece): each
// piece's master, grad, m, v and denominator stay in cache from the first op to the last,
// one pass over memory instead of one per op, and the small tensors (biases, norms) run
// beside the large ones. Every element gets the same ATen ops in the same order as in
// update_foreach, so the same bits.
void ShardedAdamW::update_blocked(Batch& b) {
  const double b1 = opts_.beta1, b2 = opts_.beta2, eps = opts_.eps;
  std::vector<int64_t> lens, start;
  for (const auto& t : b.master) lens.push_back(t.numel());
  int64_t total = 0;
  const std::vector<Piece> pieces = cut_pieces(lens, &start, &total);
  std::vector<at::Scalar> decay, bc2_sqrt, step_size;
  for (size_t i = 0; i < b.master.size(); ++i) {
    decay.emplace_back(1 - b.lr[i] * b.wd[i]);
    bc2_sqrt.emplace_back(std::sqrt(b.bc2[i]));
    step_size.emplace_back(-b.lr[i] / b.bc1[i]);
  }
  for_each_piece(start, total, [&](size_t p, torch::Tensor& scratch) {
    const Piece& pc = pieces[p];
    const size_t i = pc.tensor;
    if (!scratch.defined()) scratch = torch::empty({kPiece}, torch::kFloat32);
    auto part = [&](const torch::Tensor& t) { return t.narrow(0, pc.offset, pc.len); };
    torch::Tensor master = part(b.master[i]), grad = part(b.grad[i]), m = part(b.m[i]), v = part(b.v[i]);
    if (b.wd[i] != 0) master.mul_(decay[i]);
    m.mul_(b1);
    m.add_(grad, 1 - b1);
    v.mul_(b2);
    v.addcmul_(grad, grad, 1 - b2);
    torch::Tensor denom = scratch.narrow(0, 0, pc.len);
    at::sqrt_out(denom, v);
    denom.div_(bc2_sqrt[i]);
    denom.add_(eps);
    master.addcdiv_(m, denom, step_size[i]);
  });
}

// at::_fused_adamw_, one call per (device, lr, weight decay); the step counts go in as a
// device tensor (one host-to-device copy per call).
void ShardedAdamW::update_fused(Batch& b) {
  std::vector<size_t> order(b.master.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](size_t i) { return std::make_tuple(b.master[i].device().type(), b.master[i].device().index(), b.lr[i], b.wd[i]); };
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return key(x) < key(y); });
  for (size_t lo = 0; lo < order.size();) {
    size_t hi = lo;
    while (hi < order.size() && key(order[hi]) == key(order[lo])) ++hi;
    std::vector<torch::Tensor> master, grad, m, v, steps;
    std::vector<float> t;
    for (size_t j = lo; j < hi; ++j) {
      const size_t i = order[j];
      master.push_back(b.master[i]);
      grad.push_back(b.grad[i]);
      m.push_back(b.m[i]);
      v.push_back(b.v[i]);
      t.push_back(static_cast<float>(b.t[i]));
    }
    torch::Tensor step_t = torch::tensor(t, torch::kFloat32).to(master.front().device(), /*non_blocking=*/true);
    for (size_t j = 0; j < t.size(); ++j) steps.push_back(step_t[static_cast<int64_t>(j)]);
    at::_fused_adamw_(master, grad, m, v, /*max_exp_avg_sqs=*/{}, steps, b.lr[order[lo]], opts_.beta1, opts_.beta2,
                      b.wd[order[lo]], opts_.eps, /*amsgrad=*/false, /*maximize=*/false);
    lo = hi;
  }
}

void ShardedAdamW::zero1_gather(Group& g, Comm& comm, const std::string& ctx) {
  const torch::Tensor& p0 = g.params.front().param;
  torch::Tensor flat = torch::zeros({g.shard * comm.world_size()}, p0.options().requires_grad(false));
  for (auto& s : g.segments)
    flat.narrow(0, s.flat_offset, s.len).copy_(g.params[s.param].param.detach().view({-1}).narrow(0, s.param_offset, s.len));
  comm.all_gather(flat, flat.narrow(0, comm.rank() * g.shard, g.shard), str(ctx, ", ZeRO-1 unit ", g.path));
  for (size_t k = 0; k < g.params.size(); ++k) {
    torch::Tensor p = g.params[k].param.detach();
    p.view({-1}).copy_(flat.narrow(0, g.offsets[k], p.numel()));
  }
}

std::vector<int64_t> ShardedAdamW::param_steps(const std::string& unit_path) const {
  for (const auto& g : groups_)
    if (g.path == unit_path) return g.param_steps;
  throw Error(str("optimizer: no trainable unit ", unit_path, " (hint: frozen units have no optimizer state)"));
}

void ShardedAdamW::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_)
    for (auto& p : g.params) p.param.mutable_grad() = torch::Tensor();
  for (DdpReducer* d : ddps_) d->zero_grad();  // bucket accumulation and had-gradient flags
  if (fsdp_ != nullptr) fsdp_->zero_grad();  // shard grads and their had-gradient flags
  agreed_ = false;
  shared_reduced_ = false;
}

int64_t ShardedAdamW::state_numel() const {
  int64_t n = 0;
  for (const auto& g : groups_)
    for (const auto& s : g.segments) {
      n += 2 * s.len;
      if (queue_ || g.params[s.param].param.scalar_type() != torch::kFloat32) n += s.len;
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

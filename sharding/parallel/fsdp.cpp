// FSDP runtime (see fsdp.h).
#include "sharding/parallel/fsdp.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "sharding/parallel/flat_buffer.h"
#include "sharding/parallel/ready_hook.h"
#include "sharding/parallel/sharded_load.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

namespace {

// Identity on a unit's output or input whose backward calls the engine:
//   on the output (kPre): its backward runs before any node of the unit's backward (they all
//     need this gradient): the unit's pre-backward hook;
//   on the input (kPost): its backward runs once the input's gradient is complete, i.e. the
//     unit's backward at this call is over: the post-backward signal.
enum BackwardHook : int64_t { kPre = 0, kPost = 1 };
struct UnitBackwardHook : public torch::autograd::Function<UnitBackwardHook> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& t, int64_t engine,
                               int64_t pos, int64_t hook) {
    ctx->saved_data["engine"] = engine;
    ctx->saved_data["pos"] = pos;
    ctx->saved_data["hook"] = hook;
    return t.view_as(t);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* engine = reinterpret_cast<FsdpEngine*>(ctx->saved_data["engine"].toInt());
    const int64_t pos = ctx->saved_data["pos"].toInt();
    if (ctx->saved_data["hook"].toInt() == kPre)
      engine->pre_backward(pos);
    else
      engine->post_backward(pos);
    return {grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Everything but shard_grad_op frees its parameters between forward and backward.
bool frees_after_forward(Sharding s) {
  return s == Sharding::kFullShard || s == Sharding::kHybridShard || s == Sharding::kFrozenSharded ||
         s == Sharding::kFrozenHybrid;
}

std::string released_message(const std::string& unit, const std::vector<UnitParam>& params) {
  return str("fsdp: unit ", unit, " is released: its parameters (", params.front().name,
             params.size() > 1 ? str(" and ", params.size() - 1, " more") : std::string(),
             ") are views of a flat buffer that holds no memory outside a gather, so they cannot be read or "
             "written here (hint: run the model through its runner, which gathers each unit around its call; "
             "to read or export parameters directly, wrap the access in FsdpEngine::gather_all() / "
             "release_all() (collective), or read the rank's local shard)");
}

}  // namespace

double FsdpUnit::gathered_bytes() const { return static_cast<double>(full_nbytes_); }
double FsdpUnit::shard_param_bytes() const { return static_cast<double>(local_.numel() * local_.element_size()); }
double FsdpUnit::shard_grad_bytes() const {
  return grad_.defined() ? static_cast<double>(grad_.numel() * grad_.element_size()) : 0.0;
}

FsdpEngine::FsdpEngine(Comm& comm, Comm& reduce, const std::vector<UnitPlan>& units,
                       const std::vector<std::pair<std::string, std::string>>& call_order, torch::Dtype reduce_dtype,
                       std::map<std::string, torch::Tensor> shards, HybridComms hybrid)
    : reduce_dtype_(reduce_dtype) {
  VLM_CHECK(reduce.world_size() == comm.world_size() && reduce.rank() == comm.rank(),
            "fsdp: the gather and reduce comms span different ranks");
  torch::NoGradGuard no_grad;
  for (const auto& plan : units) {
    if (!shards_params(plan.sharding)) continue;
    VLM_CHECK(!plan.params.empty(), "fsdp: unit ", plan.path, " has no parameters");
    auto u = std::make_unique<FsdpUnit>();
    u->gather_comm_ = &comm;
    u->reduce_comm_ = &reduce;
    const bool in_groups = plan.sharding == Sharding::kHybridShard || plan.sharding == Sharding::kFrozenHybrid;
    if (in_groups) {
      VLM_CHECK(hybrid.gather != nullptr && hybrid.reduce != nullptr && hybrid.replicate != nullptr,
                "fsdp: unit ", plan.path, " is hybrid_shard, but no mesh was set up (hint: ParallelOptions::mesh = "
                "true; the trainer sets it when a rule uses hybrid_shard)");
      u->gather_comm_ = hybrid.gather;
      u->reduce_comm_ = hybrid.reduce;
      // Only a trained unit's gradient crosses the replicas; a frozen one just gathers.
      if (plan.sharding == Sharding::kHybridShard && hybrid.replicate->world_size() > 1)
        u->replicate_comm_ = hybrid.replicate;
    }
    const int64_t n = u->gather_comm_->world_size(), r = u->gather_comm_->rank();
    u->path_ = plan.path;
    u->sharding_ = plan.sharding;
    u->trainable_ = plan.trainable();
    u->params_ = plan.params;
    const torch::Tensor& p0 = plan.params.front().param;
    for (const auto& p : plan.params) {
      VLM_CHECK(p.param.scalar_type() == p0.scalar_type() && p.param.device() == p0.device(),
                "fsdp: unit ", plan.path, " mixes parameter dtypes/devices: ", p.name, " is ", p.param.scalar_type(),
                " on ", p.param.device(), ", ", plan.params.front().name, " is ", p0.scalar_type(), " on ",
                p0.device(), " (hint: one flat buffer per unit needs one dtype and device)");
      u->offsets_.push_back(u->numel_);
      u->numel_ += p.param.numel();
    }
    u->shard_ = (u->numel_ + n - 1) / n;
    u->lo_ = std::min(r * u->shard_, u->numel_);
    u->hi_ = std::min((r + 1) * u->shard_, u->numel_);
    u->own_lo_ = u->lo_;
    u->own_hi_ = u->hi_;
    if (in_groups && hybrid.replicate->world_size() > 1) {  // this replica's share of R_r
      const int64_t reps = hybrid.replicate->world_size(), rep = hybrid.replicate->rank();
      const int64_t len = u->hi_ - u->lo_, part = (len + reps - 1) / reps;
      u->own_lo_ = u->lo_ + std::min(rep * part, len);
      u->own_hi_ = u->lo_ + std::min((rep + 1) * part, len);
    }
    auto loaded = shards.find(plan.path);
    if (loaded != shards.end() && params_are_flat_slices(plan.params, n * u->shard_)) {
      // Sharded loading (sharded_load.h) laid the parameters out as slices of a flat buffer
      // it never wrote, and filled this rank's shard: adopt both.
      const torch::Tensor& s = loaded->second;
      VLM_CHECK(s.dim() == 1 && s.size(0) == u->shard_ && s.scalar_type() == p0.scalar_type() &&
                    s.device() == p0.device(),
                "fsdp: unit ", plan.path, ": the loaded shard is ", s.sizes(), " ", s.scalar_type(), " on ",
                s.device(), ", expected [", u->shard_, "] ", p0.scalar_type(), " on ", p0.device());
      u->full_ = whole_of(p0, n * u->shard_);  // released: it never had memory
      u->local_ = s;
    } else {
      // Flat buffer [N*S]; the parameters become views of it.
      u->full_ = torch::zeros({n * u->shard_}, p0.options().requires_grad(false));
      for (size_t k = 0; k < u->params_.size(); ++k) {
        torch::Tensor p = u->params_[k].param;
        torch::Tensor view = u->full_.narrow(0, u->offsets_[k], p.numel()).view(p.sizes());
        view.copy_(p.detach());
        p.set_data(view);
      }
    }
    if (!u->local_.defined()) u->local_ = u->full_.narrow(0, r * u->shard_, u->shard_).clone();  // [S]
    if (u->trainable_) u->grad_ = torch::zeros({u->shard_}, p0.options().dtype(torch::kFloat32));
    u->full_nbytes_ = static_cast<size_t>(n * u->shard_) * p0.element_size();
    u->released_msg_ = released_message(u->path_, u->params_);
    u->state_ = FsdpUnit::State::kGathered;  // release() below frees the initial buffer
    gstats_.bytes += u->gathered_bytes();
    gstats_.units += 1;
    release(*u);
    by_unit_[u->path_] = u.get();
    units_.push_back(std::move(u));
  }
  gstats_ = GatherStats{};
  for (const auto& [call, owner] : call_order) {
    auto it = by_unit_.find(owner);
    call_pos_.emplace(call, static_cast<int64_t>(call_units_.size()));
    call_units_.push_back(it == by_unit_.end() ? nullptr : it->second);
  }
  pos_needs_bwd_.assign(call_units_.size(), 0);
  pos_reads_bwd_.assign(call_units_.size(), 1);
  pos_input_signal_.assign(call_units_.size(), 0);
  pos_bwd_done_.assign(call_units_.size(), 0);
  for (int64_t p = 0; p < static_cast<int64_t>(call_units_.size()); ++p)
    if (call_units_[p] != nullptr) last_pos_ = p;
  // Reduce-scatter order: trainable units, last unit first.
  for (auto it = units_.rbegin(); it != units_.rend(); ++it)
    if ((*it)->trainable_) rs_order_.push_back(it->get());
  // Gradient-ready hooks.
  for (FsdpUnit* u : rs_order_) {
    u->fired_.assign(u->params_.size(), 0);
    u->had_grad_.assign(u->params_.size(), 0);
    u->pending_ = static_cast<int64_t>(u->params_.size());
    for (size_t k = 0; k < u->params_.size(); ++k) {
      auto acc = torch::autograd::impl::grad_accumulator(u->params_[k].param);
      VLM_ASSERT(acc, "no grad accumulator for ", u->params_[k].name);
      const int64_t idx = static_cast<int64_t>(k);
      acc->add_post_hook(std::make_unique<ReadyHook>(this, [this, u, idx] { on_grad_ready(*u, idx); }));
      accumulators_.push_back(std::move(acc));
    }
  }
}

FsdpEngine::~FsdpEngine() {
  remove_ready_hooks(accumulators_, this);
  for (auto& u : units_) {  // unwaited work must not write into freed buffers
    try {
      u->gather_.wait();
      u->rs_.wait();
      u->ar_.wait();
    } catch (...) {
    }
  }
}

void FsdpEngine::skip_backward_gather(const std::set<std::string>& call_paths) {
  for (const auto& path : call_paths) {
    const int64_t pos = position(path);
    VLM_CHECK(pos >= 0, "fsdp: skip_backward_gather: no call ", path, " in the call order");
    pos_reads_bwd_[pos] = 0;
  }
}

FsdpUnit* FsdpEngine::find(const std::string& call_path) {
  auto it = call_pos_.find(call_path);
  return it == call_pos_.end() ? nullptr : call_units_[it->second];
}

FsdpUnit* FsdpEngine::find_unit(const std::string& unit_path) {
  auto it = by_unit_.find(unit_path);
  return it == by_unit_.end() ? nullptr : it->second;
}

int64_t FsdpEngine::position(const std::string& call_path) const {
  auto it = call_pos_.find(call_path);
  return it == call_pos_.end() ? -1 : it->second;
}

void FsdpEngine::gather_async(FsdpUnit& u, const std::string& why) {
  if (before_gather_) before_gather_(u);
  if (u.state_ != FsdpUnit::State::kFree) return;
  refill_storage(u.full_.storage().unsafeGetStorageImpl(), u.full_nbytes_);
  u.state_ = FsdpUnit::State::kGathering;
  gstats_.bytes += u.gathered_bytes();
  gstats_.units += 1;
  gstats_.peak_bytes = std::max(gstats_.peak_bytes, gstats_.bytes);
  gstats_.peak_units = std::max(gstats_.peak_units, gstats_.units);
  u.gather_ = u.gather_comm_->all_gather_async(u.full_, u.local_, str(ctx_, ", fsdp ", why, " all-gather of unit ", u.path_));
}

void FsdpEngine::wait_gathered(FsdpUnit& u) {
  if (u.state_ != FsdpUnit::State::kGathering) return;
  u.gather_.wait();
  u.state_ = FsdpUnit::State::kGathered;
}

void FsdpEngine::release(FsdpUnit& u) {
  if (u.state_ == FsdpUnit::State::kFree || pinned_) return;
  wait_gathered(u);
  // Keep the tensors (parameters and autograd's saved views), drop the memory.
  release_storage(u.full_.storage().unsafeGetStorageImpl(), u.full_.device(), u.released_msg_);
  u.state_ = FsdpUnit::State::kFree;
  gstats_.bytes -= u.gathered_bytes();
  gstats_.units -= 1;
}

void FsdpEngine::pre_forward(const std::string& call_path) {
  const int64_t pos = position(call_path);
  if (pos < 0 || call_units_[pos] == nullptr) return;
  FsdpUnit& u = *call_units_[pos];
  gather_async(u, "forward");
  wait_gathered(u);
  for (FsdpUnit* v : ahead(pos, +1, &u)) gather_async(*v, "forward prefetch");
}

std::vector<FsdpUnit*> FsdpEngine::ahead(int64_t pos, int step, const FsdpUnit* u) const {
  std::vector<FsdpUnit*> next;
  for (int64_t p = pos + step; p >= 0 && p < static_cast<int64_t>(call_units_.size()) && next.size() < 2; p += step) {
    FsdpUnit* v = call_units_[p];
    if (v == nullptr || v == u || (step < 0 && (!pos_needs_bwd_[p] || !pos_reads_bwd_[p]))) continue;
    if (std::find(next.begin(), next.end(), v) == next.end()) next.push_back(v);
  }
  return next;
}

torch::Tensor FsdpEngine::post_forward(const std::string& call_path, const torch::Tensor& out) {
  const int64_t pos = position(call_path);
  if (pos < 0 || call_units_[pos] == nullptr) return out;
  FsdpUnit& u = *call_units_[pos];
  const bool needs = out.defined() && out.requires_grad() && torch::GradMode::is_enabled();
  if (needs) {
    u.needs_backward_ = true;
    pos_needs_bwd_[pos] = 1;
  }
  // Kept for backward: shard_grad_op units, and the last FSDP call of the forward, whose
  // backward comes first: freeing it would re-gather the same bytes at once, with no
  // compute to hide the wait behind (torchtitan leaves its last block unresharded too).
  const bool keep = needs && (u.sharding_ == Sharding::kShardGradOp || pos == last_pos_);
  if (!keep) release(u);
  if (!needs) return out;
  return UnitBackwardHook::apply(out, reinterpret_cast<int64_t>(this), pos, kPre);
}

void FsdpEngine::pre_backward(int64_t pos) {
  VLM_ASSERT(pos >= 0 && pos < static_cast<int64_t>(call_units_.size()), "fsdp: bad call position ", pos);
  FsdpUnit* u = call_units_[pos];
  if (u == nullptr) return;
  // Backward's next two units: the previous FSDP units in call order whose outputs need a
  // gradient. Units are freed by their own post-backward signal (post_backward), not here.
  const std::vector<FsdpUnit*> next = ahead(pos, -1, u);
  if (pos_reads_bwd_[pos]) {  // an embedding's backward never reads its table: not gathered
    gather_async(*u, "backward");
    wait_gathered(*u);
  }
  for (FsdpUnit* v : next) gather_async(*v, "backward prefetch");
}

torch::Tensor FsdpEngine::mark_input(const std::string& call_path, const torch::Tensor& x) {
  const int64_t pos = position(call_path);
  if (pos < 0 || call_units_[pos] == nullptr || !x.defined() || !x.requires_grad() ||
      !torch::GradMode::is_enabled())
    return x;
  pos_input_signal_[pos] = 1;
  return UnitBackwardHook::apply(x, reinterpret_cast<int64_t>(this), pos, kPost);
}

void FsdpEngine::post_backward(int64_t pos) {
  VLM_ASSERT(pos >= 0 && pos < static_cast<int64_t>(call_units_.size()), "fsdp: bad call position ", pos);
  FsdpUnit* u = call_units_[pos];
  if (u == nullptr) return;
  pos_bwd_done_[pos] = 1;
  // A unit called more than once (tied head) is done when every call with a signal is.
  for (size_t p = 0; p < call_units_.size(); ++p)
    if (call_units_[p] == u && pos_input_signal_[p] && pos_needs_bwd_[p] && !pos_bwd_done_[p]) return;
  // full_shard / frozen units re-gather and are freed now; shard_grad_op units stay gathered
  // until their reduce-scatter.
  if (frees_after_forward(u->sharding_)) release(*u);
}

void FsdpEngine::on_grad_ready(FsdpUnit& u, int64_t param) {
  VLM_CHECK(!u.fired_[param], "fsdp: parameter ", u.params_[param].name,
            " got a second gradient before finish_backward (hint: call finish_backward() after every "
            "micro-batch's backward, including gradient-accumulation micro-batches)");
  u.fired_[param] = 1;
  if (--u.pending_ == 0) launch_ready(/*force=*/false);
}

void FsdpEngine::launch_ready(bool force) {
  while (next_rs_ < rs_order_.size()) {
    FsdpUnit& u = *rs_order_[next_rs_];
    if (!force && u.pending_ > 0) break;
    launch_rs(u);
    ++next_rs_;
  }
}

void FsdpEngine::accumulate(FsdpUnit& u) {
  torch::NoGradGuard no_grad;
  if (!u.acc_.defined()) {
    u.acc_ = torch::zeros({u.full_.numel()}, u.local_.options().dtype(reduce_dtype_));  // [N*S]
    gstats_.acc_bytes += static_cast<double>(u.acc_.numel() * u.acc_.element_size());
    gstats_.acc_peak_bytes = std::max(gstats_.acc_peak_bytes, gstats_.acc_bytes);
  }
  for (size_t k = 0; k < u.params_.size(); ++k) {
    torch::Tensor p = u.params_[k].param;
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    u.acc_.narrow(0, u.offsets_[k], p.numel()).add_(g.reshape({-1}));  // in the reduce dtype
    u.had_grad_[k] = 1;
    p.mutable_grad() = torch::Tensor();
  }
}

void FsdpEngine::launch_rs(FsdpUnit& u) {
  if (accumulate_unsharded_ && !sync_) {  // no collective: keep the sum unsharded
    accumulate(u);
    u.rs_launched_ = true;
    release(u);
    return;
  }
  torch::NoGradGuard no_grad;
  // Bound the reduce-dtype buffers alive at once: finish the oldest reduce-scatter first.
  while (rs_inflight_.size() >= static_cast<size_t>(kMaxReduceScattersInFlight)) {
    complete_rs(*rs_inflight_.front());
    rs_inflight_.erase(rs_inflight_.begin());
  }
  torch::Tensor flat;  // [N*S] reduce dtype
  if (u.acc_.defined()) {  // the earlier micro-batches' unsharded sum
    accumulate(u);
    flat = u.acc_;
    gstats_.acc_bytes -= static_cast<double>(flat.numel() * flat.element_size());  // now counted as rs
    u.acc_ = torch::Tensor();
  } else {
    flat = torch::zeros({u.full_.numel()}, u.local_.options().dtype(reduce_dtype_));  // [N*S]
    for (size_t k = 0; k < u.params_.size(); ++k) {
      torch::Tensor p = u.params_[k].param;
      const torch::Tensor& g = p.grad();
      if (g.defined()) {
        flat.narrow(0, u.offsets_[k], p.numel()).copy_(g.reshape({-1}));
        u.had_grad_[k] = 1;
      }
      p.mutable_grad() = torch::Tensor();  // the unsharded gradient is not kept
    }
  }
  u.rs_out_ = torch::empty({u.shard_}, flat.options());  // [S]
  u.rs_in_ = flat;  // kept until complete_rs: the collective reads it until then
  u.rs_nbytes_ = static_cast<double>((flat.numel() + u.rs_out_.numel()) * flat.element_size());
  gstats_.rs_bytes += u.rs_nbytes_;
  gstats_.rs_peak_bytes = std::max(gstats_.rs_peak_bytes, gstats_.rs_bytes);
  u.rs_ = u.reduce_comm_->reduce_scatter_async(u.rs_out_, flat, ReduceOp::kSum,
                                     str(ctx_, ", fsdp reduce-scatter of unit ", u.path_));
  u.rs_launched_ = true;
  rs_inflight_.push_back(&u);
  release(u);  // its backward is over (every parameter has its gradient)
}

void FsdpEngine::complete_rs(FsdpUnit& u) {
  torch::NoGradGuard no_grad;
  u.rs_.wait();
  const std::string what = str(ctx_, ", fsdp replicate all-reduce of unit ", u.path_);
  // hybrid_shard, a second synced micro-batch in one step: the shard grad already holds
  // sums over the replicas, so this contribution is all-reduced on its own.
  if (u.replicate_comm_ != nullptr && u.replica_synced_) u.replicate_comm_->all_reduce(u.rs_out_, ReduceOp::kSum, what);
  u.grad_.add_(u.rs_out_);  // [S] fp32 += [S] reduce dtype (converted element-wise, no temporary)
  u.rs_out_ = torch::Tensor();
  u.rs_in_ = torch::Tensor();
  gstats_.rs_bytes -= u.rs_nbytes_;
  u.rs_nbytes_ = 0;
  if (u.replicate_comm_ == nullptr || u.replica_synced_) return;
  u.replica_pending_ = true;  // holds this replica's sums only
  if (!sync_) return;         // the step's last micro-batch all-reduces them once
  u.ar_ = u.replicate_comm_->all_reduce_async(u.grad_, ReduceOp::kSum, what);
  u.replica_pending_ = false;
  u.replica_synced_ = true;
  ar_inflight_.push_back(&u);
}

void FsdpEngine::finish_backward(const std::string& ctx) {
  launch_ready(/*force=*/true);
  for (FsdpUnit* u : rs_inflight_) complete_rs(*u);
  rs_inflight_.clear();
  for (FsdpUnit* u : ar_inflight_) u->ar_.wait();  // hybrid_shard: the replicas' sums
  ar_inflight_.clear();
  for (FsdpUnit* u : rs_order_) {
    u->rs_launched_ = false;
    std::fill(u->fired_.begin(), u->fired_.end(), 0);
    u->pending_ = static_cast<int64_t>(u->params_.size());
  }
  next_rs_ = 0;
  for (auto& u : units_) {
    release(*u);
    u->needs_backward_ = false;
  }
  std::fill(pos_needs_bwd_.begin(), pos_needs_bwd_.end(), 0);
  std::fill(pos_input_signal_.begin(), pos_input_signal_.end(), 0);
  std::fill(pos_bwd_done_.begin(), pos_bwd_done_.end(), 0);
  ctx_ = ctx;
}

void FsdpEngine::gather_all(const std::string& ctx) {
  for (auto& u : units_) gather_async(*u, str("gather_all (", ctx, ")"));
  for (auto& u : units_) wait_gathered(*u);
  pinned_ = true;
}

void FsdpEngine::release_all() {
  pinned_ = false;
  for (auto& u : units_) release(*u);
}

void FsdpEngine::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& u : units_) {
    if (u->grad_.defined()) u->grad_.zero_();
    if (u->acc_.defined()) {
      gstats_.acc_bytes -= static_cast<double>(u->acc_.numel() * u->acc_.element_size());
      u->acc_ = torch::Tensor();
    }
    std::fill(u->had_grad_.begin(), u->had_grad_.end(), 0);
    u->replica_pending_ = false;
    u->replica_synced_ = false;
  }
}

void FsdpEngine::check_reduced(const std::string& ctx) const {
  for (const auto& u : units_)
    VLM_CHECK(!u->replica_pending_, ctx, ": the gradient of hybrid_shard unit ", u->path_,
              " is not reduced across the replicas yet: the step's micro-batches all ran with set_sync(false) "
              "(hint: set_sync(true) before the last micro-batch of a step, as the trainer does)");
}

void FsdpEngine::check_readable(const torch::Tensor& t, const std::string& what) const {
  if (!t.defined() || !t.has_storage()) return;
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  for (const auto& u : units_)
    if (u->full_.storage().unsafeGetStorageImpl() == impl && u->state_ == FsdpUnit::State::kFree)
      throw Error(str(what, ": ", u->released_msg_));
}

void FsdpEngine::load_params(FsdpUnit& u, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  VLM_CHECK(!pinned_, "fsdp: load_params during gather_all (hint: release_all() first)");
  VLM_CHECK(flat.numel() == u.numel_, "fsdp: unit ", u.path_, " has ", u.numel_, " elements, got ", flat.numel());
  release(u);
  u.shard_param().copy_(flat.reshape({-1}).narrow(0, u.lo_, u.hi_ - u.lo_));
}

}  // namespace vlm::sharding

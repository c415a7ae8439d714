// DDP gradient reducer (see ddp.h).
#include "sharding/parallel/ddp.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>

#include "sharding/parallel/ready_hook.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

int64_t global_token_count(Comm& comm, int64_t local_tokens) {
  if (comm.world_size() == 1) return local_tokens;
  torch::Tensor t = torch::tensor({local_tokens}, torch::kInt64);
  comm.all_reduce(t, ReduceOp::kSum, "global token count");
  return t.item<int64_t>();
}

void broadcast_from_rank0(Comm& comm, const std::vector<torch::Tensor>& tensors, const std::string& ctx) {
  if (comm.world_size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, list] : by_dtype) {
    std::vector<torch::Tensor> flat_parts;
    for (const auto& t : list) flat_parts.push_back(t.reshape({-1}));
    torch::Tensor flat = torch::cat(flat_parts);  // [sum numel]
    comm.broadcast(flat, 0, ctx);
    int64_t off = 0;
    for (auto& t : list) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}


DdpReducer::DdpReducer(Comm& comm, std::vector<torch::Tensor> params, std::vector<std::string> names,
                       double bucket_bytes, torch::Dtype reduce_dtype)
    : comm_(comm), params_(std::move(params)), names_(std::move(names)), reduce_dtype_(reduce_dtype) {
  VLM_CHECK(bucket_bytes > 0, "ddp: bucket size must be > 0 bytes, got ", bucket_bytes);
  VLM_ASSERT(params_.size() == names_.size());
  const double elem = static_cast<double>(c10::elementSize(reduce_dtype));
  bucket_of_.assign(params_.size(), -1);
  ready_.assign(params_.size(), 0);
  had_grad_.assign(params_.size(), 0);
  in_bucket_.assign(params_.size(), 0);
  accumulated_.assign(params_.size(), 0);
  views_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Dtype pd = params_[i].scalar_type();
    in_bucket_[i] = c10::isFloatingType(pd) && c10::isFloatingType(reduce_dtype) &&
                    c10::elementSize(reduce_dtype) > c10::elementSize(pd);
  }
  // Reverse registration order, cut at bucket_bytes.
  double bytes = 0;
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    VLM_CHECK(params_[i].requires_grad(), "ddp: parameter ", names_[i], " does not require grad");
    if (buckets_.empty() || bytes >= bucket_bytes) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
    b.params.push_back(i);
    bucket_of_[i] = static_cast<int64_t>(buckets_.size()) - 1;
    bytes += elem * static_cast<double>(params_[i].numel());
  }
  for (auto& b : buckets_) {
    const int64_t n = b.offsets.back() + params_[b.params.back()].numel();
    b.flat = torch::zeros({n}, params_[b.params.front()].options().dtype(reduce_dtype));
    b.pending = static_cast<int64_t>(b.params.size());
    for (size_t k = 0; k < b.params.size(); ++k) {
      const torch::Tensor& p = params_[b.params[k]];
      views_[b.params[k]] = b.flat.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
    }
  }
  // One post-hook per AccumulateGrad node (kept alive here so every graph reuses it).
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    VLM_ASSERT(acc, "no grad accumulator for ", names_[i]);
    const int64_t idx = static_cast<int64_t>(i);
    acc->add_post_hook(std::make_unique<ReadyHook>(this, [this, idx] { on_grad_ready(idx); }));
    accumulators_.push_back(std::move(acc));
  }
}

DdpReducer::~DdpReducer() {
  // Remove our hooks so a model that outlives the reducer does not call into freed memory.
  remove_ready_hooks(accumulators_, this);
  // Unwaited work: wait so Gloo does not write into freed buffers (errors ignored here).
  for (auto& b : buckets_) {
    try {
      if (b.launched) b.work.wait();
    } catch (...) {
    }
  }
}

int64_t DdpReducer::index_of(const torch::Tensor& param) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return static_cast<int64_t>(i);
  return -1;
}

double DdpReducer::kept_grad_bytes() const {
  double bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!in_bucket_[i]) bytes += static_cast<double>(params_[i].numel() * params_[i].element_size());
  return bytes;
}

torch::Tensor DdpReducer::grad(int64_t i) const {
  if (!in_bucket_[i]) return params_[i].grad();
  return accumulated_[i] ? views_[i] : torch::Tensor();
}

torch::Tensor DdpReducer::grad_or_zeros(int64_t i) {
  if (!in_bucket_[i]) {
    if (!params_[i].grad().defined()) params_[i].mutable_grad() = torch::zeros_like(params_[i]);
    return params_[i].grad();
  }
  if (!accumulated_[i]) {
    views_[i].zero_();
    accumulated_[i] = 1;
  }
  return views_[i];
}

double DdpReducer::buffer_bytes() const {
  double bytes = 0;
  for (const auto& b : buckets_) bytes += static_cast<double>(b.flat.numel() * b.flat.element_size());
  return bytes;
}

void DdpReducer::fold_grad_locked(int64_t i) {
  torch::Tensor& g = params_[i].mutable_grad();
  if (!g.defined()) return;
  torch::NoGradGuard no_grad;
  if (accumulated_[i])
    views_[i].add_(g);  // in the reduce dtype
  else
    views_[i].copy_(g);
  accumulated_[i] = 1;
  g = torch::Tensor();  // the param-dtype gradient is not kept
}

void DdpReducer::on_grad_ready(int64_t i) {
  if (!sync_ && !in_bucket_[i]) return;
  std::lock_guard<std::mutex> lock(mu_);
  // A second gradient for the same parameter before finish_backward: its bucket may be in
  // flight already, and this contribution would be lost (checked before folding it in).
  VLM_CHECK(!sync_ || !ready_[i], "ddp: parameter ", names_[i], " got a second gradient before finish_backward ",
            "(hint: set_sync(false) on gradient-accumulation micro-batches and call finish_backward() ",
            "after every synced backward)");
  if (in_bucket_[i]) fold_grad_locked(i);  // every micro-batch, synced or not
  if (!sync_) return;
  ready_[i] = 1;
  --buckets_[bucket_of_[i]].pending;
  if (overlap_) launch_ready_locked(/*force=*/false, ctx_);
}

void DdpReducer::launch_ready_locked(bool force, const std::string& ctx) {
  torch::NoGradGuard no_grad;
  // World 1: the all-reduce is the identity, so the .grad-kept parameters skip the copy into
  // the bucket and back (about 40 ms of a 0.46 s CPU step on the small preset).
  const bool local = comm_.world_size() == 1;
  while (next_launch_ < num_buckets()) {
    Bucket& b = buckets_[next_launch_];
    if (!force && b.pending > 0) break;
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int64_t i = b.params[k];
      if (in_bucket_[i]) {
        fold_grad_locked(i);  // a .grad that reached no hook (none in practice)
        had_grad_[i] = accumulated_[i];
        if (!accumulated_[i]) views_[i].zero_();  // no gradient since zero_grad(): reduce zeros
        continue;
      }
      const torch::Tensor& p = params_[i];
      torch::Tensor dst = b.flat.narrow(0, b.offsets[k], p.numel());
      const torch::Tensor& g = p.grad();
      had_grad_[i] = g.defined();
      if (local) continue;  // the .grad is already the sum
      if (g.defined())
        dst.copy_(g.reshape({-1}));
      else
        dst.zero_();  // unused in this micro-batch and before: reduce zeros
    }
    if (!local)
      b.work = comm_.all_reduce_async(b.flat, ReduceOp::kSum,
                                      str(ctx, ", ddp bucket ", next_launch_, " (", names_[b.params.front()],
                                          " .. ", names_[b.params.back()], ")"));
    b.launched = true;
    if (!force) ++launched_in_backward_;
    ++next_launch_;
  }
}

void DdpReducer::finish_backward(const std::string& ctx) {
  if (!sync_) return;
  std::lock_guard<std::mutex> lock(mu_);
  launch_ready_locked(/*force=*/true, ctx);
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.work.wait();
    for (size_t k = 0; k < b.params.size(); ++k) {
      if (in_bucket_[b.params[k]]) continue;  // the sum stays in the bucket view
      torch::Tensor& p = params_[b.params[k]];
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      if (comm_.world_size() == 1) continue;  // the .grad is the sum (launch_ready_locked)
      torch::Tensor src = b.flat.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
      p.mutable_grad().copy_(src);
    }
  }
  // The bucket views now hold the reduced sums (zeros where no rank had a gradient): every
  // view is a gradient, as finish_backward makes every .grad defined in the other mode.
  for (size_t i = 0; i < params_.size(); ++i)
    if (in_bucket_[i]) accumulated_[i] = 1;
  reset_for_next_locked();
  ctx_ = ctx;
}

void DdpReducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  std::fill(accumulated_.begin(), accumulated_.end(), 0);
  std::fill(had_grad_.begin(), had_grad_.end(), 0);
}

void DdpReducer::reset_for_next_locked() {
  for (auto& b : buckets_) {
    b.pending = static_cast<int64_t>(b.params.size());
    b.launched = false;
  }
  last_launched_in_backward_ = launched_in_backward_;
  launched_in_backward_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
}

}  // namespace vlm::sharding

// DDP gradient reducer: the trainable replicated units' gradients, in buckets, all-reduced
// (SUM) while backward continues.
//
// Buckets: parameters in reverse registration order (backward produces gradients roughly
// last unit first), cut when a bucket reaches `bucket_bytes` of reduce dtype; a parameter
// never straddles two buckets. Each bucket owns a flat buffer [bucket numel] (reduce dtype).
//
// During backward a post-hook on each parameter's AccumulateGrad node fires once the
// parameter's .grad holds this micro-batch's contribution (tied weights: once, with the
// sum of both uses). When every parameter of a bucket has fired, the bucket is copied
// into its buffer and all_reduce_async(SUM) is launched; buckets are launched strictly in
// bucket order (a ready bucket waits for its predecessors), so every rank issues the same
// collectives in the same order whatever the autograd scheduling. The comm is a lane of its
// own (ParallelDims::comm(Lane::kDdp)), so the buckets' order against FSDP's ops may differ
// between ranks.
//
// finish_backward(): launches the buckets not launched yet (parameters that got no
// gradient in this micro-batch contribute their accumulated gradient or zeros) and waits
// every bucket.
//
// Where gradients accumulate (per parameter, fixed at construction):
//   reduce dtype wider than the parameter's (bf16 / fp16 params, fp32 reduce): the bucket
//     buffer IS the gradient. The hook adds every micro-batch's .grad (param dtype, this
//     micro-batch only) into the parameter's view of its bucket, in the reduce dtype, and
//     drops the .grad, on every micro-batch (set_sync(false) too); the first contribution
//     since zero_grad() is copied, not added. The synced micro-batch all-reduces the bucket
//     in place and leaves the sum there: grad(i) is that view (reduce dtype), .grad stays
//     undefined. Gradients are thus summed over micro-batches and ranks in fp32 and reach
//     the optimizer unrounded; memory: r bytes per element (no param-dtype .grad kept).
//   otherwise (fp32 params, or a reduce dtype no wider than the params): gradients
//     accumulate in .grad (autograd); a bucket copies its parameters' .grad in at launch and
//     finish_backward copies the sums back into .grad (a missing .grad is created); with
//     set_sync(false) the hooks do nothing. grad(i) is the .grad. Memory: p + r per element.
// zero_grad() (the optimizer's) forgets the accumulated gradients of both kinds.
//
// SUM, not average: the trainer scales each micro-batch's loss by 1 / (supervised tokens
// of the whole step over all ranks), see global_token_count(), so the summed gradient
// equals the single-process gradient of the global batch.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sharding/dist/comm.h"

namespace torch::autograd {
struct Node;
}

namespace vlm::sharding {

// Sum of `local_tokens` over ranks (one int64 all-reduce; the local value at world 1).
int64_t global_token_count(Comm& comm, int64_t local_tokens);

// Broadcasts every tensor from rank 0 (flattened per call into one buffer per dtype).
void broadcast_from_rank0(Comm& comm, const std::vector<torch::Tensor>& tensors, const std::string& ctx);

class DdpReducer {
 public:
  // params: the trainable replicated parameters in registration (forward) order, all of
  // one device. bucket_bytes > 0.
  DdpReducer(Comm& comm, std::vector<torch::Tensor> params, std::vector<std::string> names,
             double bucket_bytes, torch::Dtype reduce_dtype);
  ~DdpReducer();
  DdpReducer(const DdpReducer&) = delete;
  DdpReducer& operator=(const DdpReducer&) = delete;

  // false: no_sync (gradient accumulation micro-batches).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  // false: every bucket is launched from finish_backward, none during backward (no overlap
  // of communication with backward; what a rank whose hooks fire late would do). Used to
  // show that the ranks' order of DDP ops against FSDP ops does not have to agree (lanes,
  // parallel_dims.h).
  void set_overlap(bool overlap) { overlap_ = overlap; }
  // Ends the backward of a synced micro-batch (see the header comment).
  void finish_backward(const std::string& ctx);
  // Drops every accumulated gradient (.grad and the bucket accumulation) and the
  // had-gradient flags; the next micro-batch starts a new sum.
  void zero_grad();

  // Whether parameter i's gradient accumulates in its bucket view (see the header comment).
  bool grad_in_bucket(int64_t i) const { return in_bucket_[i] != 0; }
  // Parameter i's gradient as the optimizer reads it: when grad_in_bucket(i), its bucket
  // view (param-shaped, reduce dtype) if that holds a gradient (a contribution since
  // zero_grad(), or any finish_backward since then), else undefined; otherwise its .grad.
  torch::Tensor grad(int64_t i) const;
  // grad(i), made a zero gradient first when it has none (tensor parallelism writes a summed
  // gradient into every replicated parameter's, tensor_parallel.h).
  torch::Tensor grad_or_zeros(int64_t i);

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // Parameter indices (into the constructor's list) of bucket b, in bucket order.
  const std::vector<int64_t>& bucket_params(int64_t b) const { return buckets_[b].params; }
  // Whether parameter i had a gradient on this rank (some micro-batch since zero_grad()
  // contributed one, as seen when its bucket was launched) in the last synced micro-batch;
  // false after zero_grad(). The optimizer skips parameters that had none on every rank.
  bool had_grad(int64_t i) const { return had_grad_[i] != 0; }
  // Index of `param` in the constructor's list, or -1.
  int64_t index_of(const torch::Tensor& param) const;
  // Bytes of the bucket buffers (persistent: [P] reduce dtype over the reducer's parameters).
  double buffer_bytes() const;
  // Bytes of the .grad tensors the reducer keeps between micro-batches (param dtype, the
  // parameters whose gradients do not accumulate in their bucket).
  double kept_grad_bytes() const;
  // Buckets launched from inside backward (before finish_backward) in the last synced
  // micro-batch: > 0 shows communication overlapped with backward.
  int64_t launched_during_backward() const { return last_launched_in_backward_; }

 private:
  struct Bucket {
    std::vector<int64_t> params;   // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in `flat`
    torch::Tensor flat;            // [numel] reduce dtype
    int64_t pending = 0;           // params not ready yet in this micro-batch
    bool launched = false;
    Work work;
  };
  void on_grad_ready(int64_t param_index);
  void fold_grad_locked(int64_t param_index);  // .grad -> bucket view (grad_in_bucket only)
  void launch_ready_locked(bool force, const std::string& ctx);
  void reset_for_next_locked();

  Comm& comm_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<int64_t> bucket_of_;  // param index -> bucket
  std::vector<char> ready_;         // param index -> fired in this micro-batch
  std::vector<char> had_grad_;      // param index -> had a gradient at its bucket's launch
  std::vector<char> in_bucket_;     // param index -> gradient accumulates in its bucket view
  std::vector<char> accumulated_;   // param index -> its bucket view holds a gradient (a contribution
                                    // or a reduced sum since zero_grad())
  std::vector<torch::Tensor> views_;  // param index -> param-shaped view of its bucket (reduce dtype)
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive for the hooks
  torch::Dtype reduce_dtype_;
  bool sync_ = true;
  bool overlap_ = true;
  int64_t next_launch_ = 0;
  int64_t launched_in_backward_ = 0;
  int64_t last_launched_in_backward_ = 0;
  std::mutex mu_;
  std::string ctx_ = "backward";
};

}  // namespace vlm::sharding

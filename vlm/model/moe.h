// The sparse mixture-of-experts block of Qwen3-VL-MoE and Qwen3.5-MoE decoder layers (`mlp`
// of a sparse layer, TextConfig::sparse_layer), with HF's module and parameter names:
//
//   mlp.gate.weight                 [E, d]       router (HF Qwen3VLMoeTextTopKRouter)
//   mlp.experts.gate_up_proj        [E, 2I, d]   the experts' SwiGLU, fused as HF 5.x stores it:
//   mlp.experts.down_proj           [E, d, I]    expert e: down[e] (silu(g) * u), [g; u] = gate_up[e] x
//   mlp.shared_expert.{gate,up,down}_proj        Qwen3.5-MoE: a dense SwiGLU of width I_s ...
//   mlp.shared_expert_gate.weight   [1, d]       ... scaled by sigmoid(shared_expert_gate x)
//
// Routing as transformers 5.23: logits = x W_g^T (model dtype), p = softmax(logits) in fp32,
// the top-k of p renormalised to sum 1 (both families always renormalise), cast back to the
// model dtype; out = sum_k w_k expert_k(x) (+ the gated shared expert).
//
// Compute without a per-token loop: the N*k (token, expert) pairs are sorted by expert, the
// token rows gathered once ([M, d], M = N*k), each expert's rows go through its SwiGLU (one
// GEMM pair per non-empty expert on CPU; at::_grouped_mm over all experts on CUDA in bf16 when
// the shapes allow, which needs no host sync), the results are weighted and index_add-ed back
// to their tokens. Gradients are autograd's.
//
// Expert parallelism (sharding/, the `ep` policy) splits the experts over ranks: keep_experts()
// narrows the parameters to this rank's [first_expert, first_expert + held) and a dispatcher
// (ExpertDispatcher) moves the sorted rows to the ranks that hold their experts and back. The
// model stays unaware of ranks: without a dispatcher every expert is local.
//
// The load-balancing loss (HF's load_balancing_loss_func, Switch Transformer eq. 4-6) is a
// function of every sparse layer's routing of one forward: with f_e = (top-k assignments to e,
// summed over layers) / R and P_e = (router probability of e, summed over layers) / R, where R
// = real tokens x sparse layers, aux = E sum_e f_e P_e. Its gradient reaches each layer's
// router through P only (f is a count), d aux / d p_le = E f_e / R, which is known once the
// forward has seen every layer. So each layer attaches its probability sum p_l to its output
// with a node whose backward supplies router_aux_weight * E f / R (RouterAuxState::grad), set
// when the forward ends: this survives activation checkpointing (the recomputed layer builds
// the same node) and needs no loss term that spans the layers.
//
// Names: N tokens (B*L), d hidden, E experts (held: this rank's), k top-k, I expert width,
// M = N*k routed rows.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "vlm/model/config.h"
#include "vlm/model/layers.h"
#include "vlm/model/mlp.h"

namespace vlm {

// One forward's load-balancing statistics, shared by its sparse layers (created by
// LanguageModelImpl::forward when aux_weight > 0; the layer closures hold it, so a
// recomputed layer uses its own forward's state).
struct RouterAuxState {
  torch::Tensor token_weight;           // [N] fp32, 1 = real token, 0 = padding; undefined = all real
  double aux_weight = 0;                // d objective / d aux (the caller's loss scale x coef)
  bool recording = true;                // false once the forward has finished (recomputation)
  std::vector<torch::Tensor> counts;    // per sparse layer [E] fp32: masked top-k assignments (no grad)
  std::vector<torch::Tensor> prob_sums; // per sparse layer [E] fp32: masked probability sums (values)
  torch::Tensor rows;                   // fp32 scalar: real tokens (sum of token_weight, >= 1)
  torch::Tensor grad;                   // [E] fp32: the gradient each layer's p_l receives
  // After the last sparse layer: the aux loss value (fp32 scalar, HF's aux_loss) and `grad`.
  torch::Tensor finish(int64_t num_experts);
};

class MoeExpertsImpl;

// Implemented by sharding/ (expert parallelism): runs sorted rows through their experts
// wherever those live.
class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;
  // rows: [M, d] grouped by global expert (expert 0's rows first); counts: [E] int64 on the
  // rows' device, the rows of each global expert. Returns [M, d]: each row through its expert
  // (MoeExpertsImpl::compute on the rank that holds it), in the same order. Every rank of the
  // expert group calls this once per sparse layer per forward (and again when recomputed), in
  // layer order, whatever its token counts: a rank with no rows still takes part.
  virtual torch::Tensor dispatch(MoeExpertsImpl& experts, const torch::Tensor& rows, const torch::Tensor& counts) = 0;
};

// `mlp.experts`: E fused SwiGLU experts (this rank holds [first_expert, first_expert + held())).
class MoeExpertsImpl : public LayerBase {
 public:
  MoeExpertsImpl(int64_t num_experts, int64_t dim, int64_t inter, const torch::TensorOptions& opts);
  // x: [N, d]; experts, weights: [N, k] (int64 global expert ids; routing weights in x's dtype)
  // -> [N, d] = sum_k weights[:, k] * expert_{experts[:, k]}(x)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& experts, const torch::Tensor& weights);
  // rows: [M, d] grouped by held expert; counts: [held] int64 (any device) -> [M, d]
  torch::Tensor compute(const torch::Tensor& rows, const torch::Tensor& counts);
  // Keeps experts [first, first + count) only (parameters narrowed to [count, ...], on any
  // device including meta); used by expert parallelism before materialising or loading.
  void keep_experts(int64_t first, int64_t count);
  int64_t held() const { return gate_up_proj.size(0); }
  ParamInit init_rule(const std::string& name) const override;

  int64_t num_experts;       // E, all experts of the layer
  int64_t first_expert = 0;  // global id of gate_up_proj[0]
  torch::Tensor gate_up_proj, down_proj;  // [held, 2I, d], [held, d, I]
  std::shared_ptr<ExpertDispatcher> dispatcher;  // null: every expert is held here

 protected:
  void rebind() override;
};
TORCH_MODULE(MoeExperts);

// A sparse layer's `mlp`.
class SparseMoeBlockImpl : public torch::nn::Module {
 public:
  SparseMoeBlockImpl(const TextConfig& cfg, const torch::TensorOptions& opts);
  // x: [B, L, d] -> [B, L, d]; aux: this forward's load-balancing state or null (none)
  torch::Tensor forward(const torch::Tensor& x, RouterAuxState* aux);
  int64_t top_k;
  Linear gate{nullptr};                // router, weight [E, d]
  MoeExperts experts{nullptr};
  Mlp shared_expert{nullptr};          // null without a shared expert
  Linear shared_expert_gate{nullptr};  // [1, d]
};
TORCH_MODULE(SparseMoeBlock);

}  // namespace vlm

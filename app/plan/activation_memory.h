// Activation memory: the bytes autograd keeps alive from a training forward until the
// backward reaches them, unit by unit, for one micro-batch of a given shape. Counted from
// what each op of this model's forward saves (LibTorch's autograd formulas), so the figures
// are the storages the forward leaves alive, not an estimate per "layer of a transformer":
//
//   decoder layer, per token (p = activation dtype bytes, f = 4, fp32):
//     input_layernorm   (p < f: f d, the fp32 copy the norm squares) + p d + f
//     q/k/v input       p d                               (kept by the three Linears)
//     qk_norm (Qwen3)   (f + p)(H + Hkv) D + f (H + Hkv)  (fp32 input, normed, rsqrt)
//     attention         p (2 H D + 2 Hkv D) + f H        (rotated q, k; v; out; logsumexp)
//                       + p H D packed, unless flash varlen (the per-sample outputs' cat)
//     residual h        f d                               (post_attention_layernorm's fp32 input)
//     post_attn norm    p d + f, its output p d
//     MLP (gated SiLU)  4 p I                             (gate, silu, up, product)
//     output            p d                               (kept while the next unit keeps it)
//   vision units as the tower reports them (VisionTowerImpl::unit_layouts: patch embedding,
//   learned-table sum, blocks and mergers with their norm and MLP kinds), so no family is
//   named here; a vision block, per patch (E width, Iv MLP width, on the CPU's per-image attention):
//     norm1 (+ its stats), qkv output 3 p E (v is a view of it), rotated q, k, per-image
//     outputs and their concatenation 4 p E, residual, norm2, MLP (quick_gelu 3 p Iv, gated
//     SiLU 4 p Iv, tanh GELU 2 p Iv), output p E. Flash varlen (CUDA, bf16 / fp16) keeps
//     rotated q, k, a contiguous v and its output instead: 4 p E.
//
// Autograd saves a tensor only for an input or weight that needs a gradient, so what is kept
// depends on what trains: a frozen tower whose input needs no gradient keeps nothing; a
// frozen Linear keeps no input, a trained one (or one with a LoRA adapter: the adapter's
// input, its r-wide middle, with dropout its mask and dropped input) does; a norm with a
// frozen weight keeps no normalised copy. The plan reads requires_grad() and the adapters
// from the model it is given (meta or real), so it follows the policies as applied.
//
// Context parallelism (shape.cp > 1, Ulysses or ring): the vision tower's units hold the
// rank's run of the patches (padded to a multiple of cp x merge^2, vlm/model/vision_split.h;
// the whole micro-batch's when its heads do not divide by cp), each block keeping the exchanged
// q / k / v and output; the position ids and the head's rows are the whole micro-batch's on
// every rank; the embeddings, the decoder layers,
// the final norm and the rotary tables are the rank's chunk (decoder_tokens()), with the
// attention's saved q / k / v of the exchanged layout (H / cp heads of every token: per local
// token the same bytes, kv heads repeated up to cp when fewer; ring: the rank's own q / k / v
// and output, vlm/model/ring_attention.h), o_proj's input a tensor of
// its own (the output back from the exchange, not a view of the attention's saved output),
// and, in backward, the whole micro-batch's embedding gradient and the exchange's buffers.
// Per unit and at the forward's end exact against rank 0 of a stand-in group; the peak's
// saving against cp 1 exact (tests/app/plan/activation_memory_test.cpp).
// Checked against the storages the model's forward really leaves alive (vlm/runtime/tensor_memory.h,
// tests/app/plan/activation_memory_test.cpp), per unit and in total, for every family in fp32
// and bf16, trained, with a frozen tower and with LoRA. A unit under activation
// checkpointing keeps only its input (and its output while the next unit keeps it); its
// full set lives again while its backward recomputes it.
// Pipeline parallelism (the model's set_pipeline_stage): the stage's units only, plus the
// residual stream [B, L, d] a later stage received and an earlier stage's output, which the
// schedule keeps until the micro-batch's backward (rows "pipeline.input" / "pipeline.output");
// the vision tower's rotary tables on stage 0, the loss's transients on the last stage. Not yet
// checked against a stage's measured storages.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "vlm/model/vision_language_model.h"

namespace vlm::app {

// One micro-batch as the forward sees it.
struct MicroBatchShape {
  int64_t rows = 1;        // B
  int64_t seq_len = 0;     // L, padded (packed: the row's length)
  int64_t patches = 0;     // pixel_values rows; 0: no image (a 1-token dummy image runs)
  int64_t loss_rows = 0;   // supervised next-token positions (the head's rows)
  bool packed = false;     // one packed row with per-sample attention (text cu_seqlens)
  int64_t samples = 1;     // packed: the samples in the row (Gated DeltaNet pads each to
                           // whole 64-token chunks: half a chunk expected per sample)
  int64_t cp = 1;          // context parallelism: the rank's decoder holds ceil(L / cp)
                           // tokens of each row (vlm/model/sequence_parallel.h)
  bool cp_ring = false;    // cp in ring mode: attention keeps the rank's own k / v (no kv
                           // head repeated) and, packed, the row's segment ids per layer
  int64_t tokens() const { return rows * seq_len; }
  int64_t decoder_tokens() const {  // ring pads to a multiple of 2 cp: two equal runs
    const int64_t n = cp_ring && cp > 1 ? 2 * cp : cp;
    return rows * ((seq_len + n - 1) / n * n / cp);
  }
};

// Whose kernels run: the CPU's, or CUDA's (flash varlen over packed segments for 16-bit
// activations, else SDPA per group of segments as on the CPU; LayerNorm statistics in fp32;
// dropout's bool mask).
enum class AttentionPath { cpu, cuda };

struct UnitActivation {
  std::string path;          // "visual.blocks.3", "model.layers.0", ...
  double kept_bytes = 0;     // alive from the unit's forward to its backward, output included
  double per_call_bytes = 0; // of which kept once per call whatever the rows (a zero-centred
                             // norm's 1 + w)
  double output_bytes = 0;   // the unit's output (part of kept_bytes)
  bool keeps_input = false;  // whether the unit's own forward keeps its input alive
  int input_from = -1;       // the unit whose output is this unit's input (-1: none)
  bool needs_grad = false;   // the output needs a gradient (something before or in it trains)
  double backward_bytes = 0; // its backward's own working set: gradients of its activations
                             // (an MLP's backward holds three of its hidden width at once),
                             // less its parameters' gradients (counted by the step's plan)
};

struct ActivationPlan {
  std::vector<UnitActivation> units;  // in call order (VisionLanguageModelImpl::units(), lm_head last)
  double shared_bytes = 0;       // rotary tables and position ids, kept by every layer
  double head_chunk_bytes = 0;   // the loss's transient chunk of fp32 logits (forward)
  double head_backward_bytes = 0;  // the loss's backward: a recomputed chunk + fp32 weight grad

  // Bytes alive at the end of the forward when the units for which `checkpointed` is true
  // run under activation checkpointing: each unit's kept bytes (a checkpointed one keeps
  // only its output), minus outputs nobody keeps, plus the inputs checkpointing keeps.
  double forward_bytes(const std::function<bool(const std::string&)>& checkpointed) const;
  // One unit's share of forward_bytes (0 for a path not in the plan).
  double unit_forward_bytes(const std::string& path,
                            const std::function<bool(const std::string&)>& checkpointed) const;
  // The most activation bytes alive at once during forward and backward: the forward's end
  // plus the head's transients, or, in u's backward, what the units before u keep, u's own
  // set (recomputed when checkpointed) and u's working set.
  double peak_bytes(const std::function<bool(const std::string&)>& checkpointed) const;
  // The two candidates of peak_bytes: the loss's (forward end + the head's transients), which
  // comes before any unit's backward, and the largest of the units' backwards.
  double head_peak_bytes(const std::function<bool(const std::string&)>& checkpointed) const;
  double units_peak_bytes(const std::function<bool(const std::string&)>& checkpointed) const;
};

// dtype: the activations' dtype (param_dtype). Reads which parameters require grad and
// which Linears carry LoRA adapters from `model` (meta is fine). Unit paths match
// VisionLanguageModelImpl::units(), lm_head last.
ActivationPlan plan_activations(VisionLanguageModelImpl& model, const MicroBatchShape& shape, torch::Dtype dtype,
                                AttentionPath path = AttentionPath::cpu);

}  // namespace vlm::app

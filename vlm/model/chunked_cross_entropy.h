// The training loss without the full logits: summed token cross-entropy of
// logits = hidden @ weight^T, computed over row chunks so that at most one chunk of logits
// ([rows, V] fp32) exists at a time, in forward and in backward.
//
// Forward keeps nothing but its inputs; backward recomputes each chunk's logits with
// autograd (one extra hidden x weight matmul: the head's training FLOPs go from 3 to 4
// matmuls) and accumulates the weight gradient in fp32 across chunks. Each chunk computes
// exactly what HF's causal-LM loss does (the matmul in the parameters' dtype, logits upcast
// to fp32, torch's cross_entropy), so one chunk is bit-identical to the unchunked loss.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace vlm {

// Rows per chunk so that a chunk of fp32 logits stays under `budget_bytes` (at least 1).
int64_t cross_entropy_chunk_rows(int64_t vocab, int64_t budget_bytes = int64_t{256} << 20);

// hidden: [N, d], weight: [V, d] (same dtype), labels: [N] int64 in [0, V) or -100 (ignored).
// Returns the fp32 scalar sum over non-ignored rows of logsumexp(logits_i) - logits_i[label_i],
// differentiable in hidden and weight. chunk_rows <= 0: cross_entropy_chunk_rows(V).
torch::Tensor chunked_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                           const torch::Tensor& labels, int64_t chunk_rows = 0);

}  // namespace vlm

// Sequence parallelism (Ulysses) inside the model: one micro-batch's sequence split over the
// `cp` ranks of a context-parallel group, each rank running the decoder on its contiguous
// chunk of L / cp tokens.
//
// The model stays unaware of processes: sharding/ installs a SequenceExchange (the group's
// differentiable all-to-all) with VisionLanguageModelImpl::set_sequence_exchange, and the
// model does the rest with it:
//   - VisionLanguageModelImpl::forward (training path) computes what spans the sequence on
//     the whole micro-batch first (embeddings with the image features placed, M-RoPE
//     positions, packing boundaries, the attention mask, the next-token labels), pads the
//     sequence to a multiple of cp (padding tokens: masked keys, label -100, after every real
//     token, so causal attention never sees them) and hands the decoder this rank's chunk;
//   - each attention layer turns its sequence-sharded q / k / v into head-sharded full
//     sequences with one all-to-all (seq_to_heads), attends over the whole sequence with the
//     whole mask, and turns the result back with a second one (heads_to_seq);
//   - the loss sums this rank's part: the micro-batch's supervised rows, those outside this
//     rank's chunk ignored. Summed over the cp ranks it is the unsplit loss, and so are the
//     gradients that the data-parallel engines (which count the cp ranks as replicas) sum.
// Everything else in the decoder (norms, MLPs, experts) is per token and runs on the chunk.
//
// Requirements: the attention heads divide by cp; the key/value heads divide by cp or divide
// cp (fewer kv heads than cp: each is repeated cp / Hkv times before the exchange). Gated
// DeltaNet layers (Qwen3.5, gated_delta_net.h) split the same way by value heads (their key
// heads repeated when fewer than cp): the projections run on the chunk, the causal conv and
// the recurrence on every token of the rank's heads, which keeps each head's recurrence
// whole on one rank.
//
// Names: B batch, L the padded sequence (a multiple of cp), Ls = L / cp this rank's chunk,
// H heads, D head_dim.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace vlm {

class SequenceExchange {
 public:
  virtual ~SequenceExchange() = default;
  virtual int64_t size() const = 0;  // cp: ranks in the group
  virtual int64_t rank() const = 0;  // this rank's place in it: its chunk of the sequence
  // x: [cp, ...] (chunk j goes to rank j) -> [cp, ...] (chunk j came from rank j), every rank
  // the same shape. Differentiable: the backward is the same exchange of the gradient. Every
  // rank of the group must call it, in the same order.
  virtual torch::Tensor all_to_all(const torch::Tensor& x, const std::string& what) = 0;
};

// Where this rank's chunk lies: tokens [begin, begin + len) of the padded length `padded`.
struct SequenceChunk {
  int64_t padded = 0, begin = 0, len = 0;
};
// The chunk of rank `rank` of `cp` for a sequence of `length` tokens (padded up to a
// multiple of cp).
SequenceChunk sequence_chunk(int64_t length, int64_t cp, int64_t rank);

// Ulysses around one attention. Before: q [B, H, Ls, D], k / v [B, Hkv, Ls, D] (after the
// rotary; this rank's tokens, every head) -> q [B, H / cp, L, D], k / v [B, max(Hkv, cp) / cp,
// L, D] (every token, this rank's heads [rank * H / cp, (rank + 1) * H / cp) and their kv
// heads), in one all-to-all: q, k and v of a chunk travel together. Checks the head counts.
struct HeadShardedQkv {
  torch::Tensor q, k, v;
};
HeadShardedQkv seq_to_heads(SequenceExchange& ex, const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const std::string& what);
// After: o [B, Hc, L, D] (every token, this rank's Hc heads) -> [B, Ls, cp * Hc, D] (this
// rank's tokens, every head).
torch::Tensor heads_to_seq(SequenceExchange& ex, const torch::Tensor& o, const std::string& what);

// Whether a layer of `heads` query and `kv_heads` key/value heads can be split over cp ranks
// ("" if so, else why not, naming them `heads_name` and `kv_name`).
std::string ulysses_heads_problem(int64_t heads, int64_t kv_heads, int64_t cp,
                                  const std::string& heads_name = "attention heads",
                                  const std::string& kv_name = "key/value heads");

}  // namespace vlm

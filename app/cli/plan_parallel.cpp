// The parallel dimensions' steps of `vlmtrain plan RECIPE` (recipe_plan.h).
#include <algorithm>
#include <string>

#include "app/cli/recipe_plan.h"
#include "sharding/parallel/context_parallel.h"
#include "sharding/parallel/expert_parallel.h"
#include "sharding/parallel/tensor_parallel.h"
#include "vlm/model/sequence_parallel.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

// Expert parallelism (an ep rule and dist.ep > 1): every sparse layer keeps E / ep experts
// on the meta model, so the unit table and the memory plan show what one rank holds.
void split_experts(RecipePlan& p) {
  const bool rule = std::any_of(p.opts.rules.begin(), p.opts.rules.end(), [](const auto& r) { return r.policy == "ep"; });
  if (!rule || p.recipe.dist.ep <= 1) return;
  p.ep = static_cast<int>(p.recipe.dist.ep);
  VLM_CHECK(p.world % p.ep == 0, p.recipe.source, ": dist.ep = ", p.ep, " does not divide the world size ", p.world,
            " (hint: --world-size a multiple of dist.ep)");
  for (const auto& [path, experts] : vlm::sharding::moe_experts(*p.model)) {
    VLM_CHECK(experts->num_experts % p.ep == 0, p.recipe.source, ": ", path, " has ", experts->num_experts,
              " experts, which dist.ep = ", p.ep, " does not divide");
    experts->keep_experts(0, experts->num_experts / p.ep);  // rank 0's share; every rank holds as many
  }
}

// Planned all-to-all bytes per rank and micro-batch of T tokens on the EP group
// (sharding/parallel/expert_parallel.h), with uniform routing: per sparse layer, the counts
// (ep-1) x H x 8, then (ep-1)/ep of the T*k rows leave the rank and as many results come
// back, in forward and again in backward (x4 rows of d x param bytes); a checkpointed layer
// runs the forward ones again.
double plan_all_to_all(const RecipePlan& p) {
  if (p.ep <= 1) return 0;
  const auto& t = p.cfg.text;
  const double n = p.ep, held = static_cast<double>(t.num_experts) / n;
  const double rows = static_cast<double>(p.pb.shape.tokens()) * static_cast<double>(t.num_experts_per_tok);
  const double row_bytes = static_cast<double>(t.hidden_size) * c10::elementSize(p.opts.param_dtype);
  const double fwd = (n - 1) * held * 8 + 2 * rows * (n - 1) / n * row_bytes;
  double total = 0;
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) {
    if (!t.sparse_layer(i)) continue;
    total += fwd + 2 * rows * (n - 1) / n * row_bytes;  // forward, then backward's two reverse
    if (p.checkpointed(vlm::str("model.layers.", i))) total += fwd;
  }
  return total;
}

// Context parallelism (dist.cp > 1): the micro-batch's decoder and vision tower split over cp
// ranks (the activation plan's shape.cp) and the exchanges' bytes per rank and micro-batch
// (sharding/parallel/context_parallel.h: Ulysses' all-to-alls, or ring mode's k/v hops for
// the attention layers, and the tower's; a checkpointed layer exchanges again in its recompute).
void plan_context_parallel(RecipePlan& p) {
  const Recipe& r = p.recipe;
  if (r.dist.cp <= 1) return;
  p.cp = static_cast<int>(r.dist.cp);
  VLM_CHECK(p.world % p.cp == 0, r.source, ": dist.cp = ", p.cp, " does not divide the world size ", p.world,
            " (hint: --world-size a multiple of dist.cp)");
  const auto mode = vlm::parse_sequence_mode(r.dist.cp_mode, r.source + ": dist.cp_mode");
  const std::string problem = vlm::sharding::context_parallel_problem(p.cfg.text, p.cp, mode);
  VLM_CHECK(problem.empty(), r.source, ": dist.cp = ", p.cp, " (cp_mode ", r.dist.cp_mode, "): ", problem,
            mode == vlm::SequenceMode::kUlysses && problem.find("Gated DeltaNet") == std::string::npos
                ? " (hint: dist.cp_mode = \"ring\" has no requirement on the attention heads)"
                : "");
  p.pb.shape.cp = p.cp;
  p.pb.shape.cp_ring = mode == vlm::SequenceMode::kRing;
  const auto& sh = p.pb.shape;
  const int64_t padded = vlm::sequence_layout(sh.seq_len, p.cp, 0, mode).padded;
  const auto b = static_cast<int64_t>(c10::elementSize(p.opts.param_dtype));
  for (int64_t i = 0; i < p.cfg.text.num_hidden_layers; ++i) {
    const auto kind = p.cfg.text.mixer(i);
    const bool ckpt = p.checkpointed(vlm::str("model.layers.", i));
    p.cp_bytes += mode == vlm::SequenceMode::kRing && kind == vlm::MixerKind::full_attention
                      ? vlm::sharding::ring_layer_bytes(p.cfg.text, p.cp, sh.rows, padded, b, ckpt)
                      : vlm::sharding::ulysses_layer_bytes(p.cfg.text, kind, p.cp, sh.rows, padded, b) * (ckpt ? 1.5 : 1.0);
  }
  // The vision tower's split (its exchanges and the mergers' gathers; a text-only micro-batch
  // runs the dummy image).
  p.cp_bytes += vlm::sharding::vision_split_bytes(p.cfg.vision, p.cp, sh.patches > 0 ? sh.patches : p.cfg.vision.merge_unit(),
                                                  b, p.checkpointed("visual.blocks.0"));
}

// Tensor parallelism (dist.tp > 1): checks the split; the meta model is then built with
// cfg.text.tensor_parallel = tp (one rank's slices: the unit table and the memory plan show
// what a rank holds), its data parallelism over world / tp ranks.
void plan_tensor_parallel_shape(RecipePlan& p) {
  const Recipe& r = p.recipe;
  if (r.dist.tp <= 1) return;
  p.tp = static_cast<int>(r.dist.tp);
  VLM_CHECK(p.world % p.tp == 0, r.source, ": dist.tp = ", p.tp, " does not divide the world size ", p.world,
            " (hint: --world-size a multiple of dist.tp)");
  const std::string problem = vlm::sharding::tensor_parallel_problem(p.cfg, p.tp);
  VLM_CHECK(problem.empty(), r.source, ": dist.tp = ", p.tp, ": ", problem);
  p.cfg.text.tensor_parallel = p.tp;
}

// The tp group's bytes per rank and micro-batch (sharding/parallel/tensor_parallel.h): the
// layers' all-gathers and reduce-scatters, the embedding's all-reduce, the final gather and
// the loss's exchanges (one row chunk per 256 MiB of fp32 logits slice).
void plan_tensor_parallel_bytes(RecipePlan& p) {
  if (p.tp <= 1) return;
  const auto& t = p.cfg.text;
  const auto& sh = p.pb.shape;
  const int64_t tokens = sh.tokens() / std::max<int64_t>(1, sh.rows);
  const int64_t padded = (tokens + p.tp - 1) / p.tp * p.tp;
  const auto b = static_cast<int64_t>(c10::elementSize(p.opts.param_dtype));
  for (int64_t i = 0; i < t.num_hidden_layers; ++i)
    p.tp_bytes += vlm::sharding::tensor_parallel_layer_bytes(t, t.sparse_layer(i), p.tp, sh.rows, padded, b,
                                                             p.checkpointed(vlm::str("model.layers.", i)));
  const double tp1 = p.tp - 1, d = static_cast<double>(t.hidden_size);
  p.tp_bytes += 4 * tp1 / p.tp * static_cast<double>(sh.tokens()) * d * static_cast<double>(b);      // embedding
  p.tp_bytes += 2 * tp1 * static_cast<double>(sh.rows * padded / p.tp) * d * static_cast<double>(b);  // final gather
  p.tp_bytes += tp1 * 12.0 * static_cast<double>(sh.loss_rows);                                      // loss
}

}  // namespace vlm::app

// The parallel dimensions' steps of `vlmtrain plan RECIPE` (recipe_plan.h).
#include <algorithm>
#include <cstdio>
#include <string>

#include "app/cli/recipe_plan.h"
#include "sharding/parallel/context_parallel.h"
#include "sharding/parallel/expert_parallel.h"
#include "sharding/parallel/pipeline.h"
#include "sharding/parallel/sharded_load.h"
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
  p.cp_bytes = 0;
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
// Pipeline parallelism: the layers of the model's stage, the embedding's on stage 0, the final
// gather and the loss's on the last.
void plan_tensor_parallel_bytes(RecipePlan& p) {
  p.tp_bytes = 0;
  if (p.tp <= 1) return;
  const auto& t = p.cfg.text;
  const auto& sh = p.pb.shape;
  const vlm::PipelineStage& stage = p.model->pipeline_stage();
  const int64_t tokens = sh.tokens() / std::max<int64_t>(1, sh.rows);
  const int64_t padded = (tokens + p.tp - 1) / p.tp * p.tp;
  const auto b = static_cast<int64_t>(c10::elementSize(p.opts.param_dtype));
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) {
    const std::string layer = vlm::str("model.layers.", i);
    if (stage.runs(layer))
      p.tp_bytes += vlm::sharding::tensor_parallel_layer_bytes(t, t.sparse_layer(i), p.tp, sh.rows, padded, b,
                                                               p.checkpointed(layer));
  }
  const double tp1 = p.tp - 1, d = static_cast<double>(t.hidden_size);
  if (stage.first())
    p.tp_bytes += 4 * tp1 / p.tp * static_cast<double>(sh.tokens()) * d * static_cast<double>(b);  // embedding
  if (stage.last()) {
    p.tp_bytes += 2 * tp1 * static_cast<double>(sh.rows * padded / p.tp) * d * static_cast<double>(b);  // final gather
    p.tp_bytes += tp1 * 12.0 * static_cast<double>(sh.loss_rows);                                      // loss
  }
}

vlm::app::MeshShape data_parallel_mesh(const RecipePlan& p) {
  if (p.tp == 1 && p.pp == 1) return p.mesh;
  const int stage_ranks = p.world / p.pp;
  return vlm::app::MeshShape{p.data_parallel(), 0, std::max(1, std::min(p.local_world, stage_ranks) / p.tp)};
}

// Pipeline parallelism (dist.pp > 1): pp stages of world / pp consecutive ranks, each with its
// tp groups and data-parallel ranks (world = pp x dp x tp).
void plan_pipeline_shape(RecipePlan& p) {
  const Recipe& r = p.recipe;
  if (r.dist.pp <= 1) return;
  p.pp = static_cast<int>(r.dist.pp);
  VLM_CHECK(p.world % p.pp == 0, r.source, ": dist.pp = ", p.pp, " does not divide the world size ", p.world,
            " (hint: --world-size a multiple of dist.pp)");
  VLM_CHECK(p.world / p.pp % p.tp == 0, r.source, ": dist.tp = ", p.tp, " does not divide a stage's ", p.world / p.pp,
            " ranks (world size ", p.world, " / dist.pp = ", p.pp, "; hint: --world-size a multiple of pp x tp)");
}

namespace {

// Whether the link from stage s to s + 1 spans nodes: for some j, rank j of stage s and rank j
// of stage s + 1 (world / pp ranks apart) on different nodes (ranks fill the nodes in order).
bool link_spans_nodes(const RecipePlan& p, int64_t s) {
  const int64_t n = p.world / p.pp;
  for (int64_t j = 0; j < n; ++j)
    if ((s * n + j) / p.local_world != ((s + 1) * n + j) / p.local_world) return true;
  return false;
}

// The summary of the stage the model is set to, from p's plans (after plan_stage).
StagePlan stage_summary(const RecipePlan& p) {
  StagePlan s;
  s.stage = p.model->pipeline_stage();
  s.params = p.rank_params();
  s.persistent_bytes = p.step.persistent;
  s.peak_bytes = p.step.total();
  s.in_flight = p.step.in_flight;
  const int m = static_cast<int>(p.micro_batches);
  s.dp_intra_bytes = p.traffic.intra_node_bytes(m);
  s.dp_inter_bytes = p.traffic.inter_node_bytes(m);
  s.tp_bytes = p.tp_bytes;
  const double stream = p.link_bytes / 2;  // one direction
  s.send_bytes = (s.stage.first() ? 0.0 : stream) + (s.stage.last() ? 0.0 : stream);
  s.next_inter_node = !s.stage.last() && link_spans_nodes(p, s.stage.index);
  // A tied head: one fp32 all-reduce of the embedding's gradient (its shard under FSDP) between
  // stage 0 and the last (ShardedAdamW::add_shared_gradients), 2 ranks: its bytes once.
  if (p.cfg.tie_word_embeddings && (s.stage.first() || s.stage.last()))
    for (const auto& u : p.units)
      if (u.path == "model.embed_tokens" && u.trainable()) {
        const int64_t n = p.data_parallel();
        s.tie_bytes = 4.0 * static_cast<double>(vlm::sharding::shards_params(u.sharding) ? (u.numel + n - 1) / n : u.numel);
      }
  return s;
}

std::string stage_holds(const RecipePlan& p, const vlm::PipelineStage& s) {
  std::string h = vlm::str("layers [", s.first_layer, ", ", s.end_layer, ")");
  if (s.first()) h += " + vision tower, embedding";
  if (s.last()) h += p.cfg.tie_word_embeddings ? " + norm, head (tied: the embedding)" : " + norm, head";
  return h;
}

}  // namespace

void plan_pipeline(RecipePlan& p, const std::function<void(RecipePlan&)>& plan_stage) {
  const std::vector<vlm::PipelineStage> stages = vlm::sharding::pipeline_split(*p.model, p.pp);
  // The residual stream [B, L, d] in the activation dtype, each way; under tp each rank sends
  // its sequence chunk [B, ceil(L / tp), d].
  const auto& sh = p.pb.shape;
  const int64_t len = (sh.seq_len + p.tp - 1) / p.tp;
  p.link_bytes = 2.0 * static_cast<double>(sh.rows * len) * static_cast<double>(p.cfg.text.hidden_size) *
                 static_cast<double>(c10::elementSize(p.opts.param_dtype));
  p.stages.clear();
  for (const auto& s : stages) {
    p.model->set_pipeline_stage(s);
    plan_stage(p);
    p.stages.push_back(stage_summary(p));
  }
  p.reported_stage = 0;
  for (size_t i = 1; i < p.stages.size(); ++i)
    if (p.stages[i].peak_bytes > p.stages[p.reported_stage].peak_bytes) p.reported_stage = i;
  p.model->set_pipeline_stage(stages[p.reported_stage]);
  plan_stage(p);
}

void print_pipeline(const RecipePlan& p) {
  if (p.pp <= 1) return;
  std::printf("pipeline parallelism: dist.pp = %d stages of %d ranks (1F1B), %d data-parallel rank(s) per stage and "
              "tp rank (DDP / FSDP over them); %lld micro-batches a step (--micro-batches): bubble %.2f%% = (pp - 1) / "
              "(m + pp - 1); stage s keeps min(pp - s, m) micro-batches' activations; the rows and the step peak above "
              "are stage %zu's, the largest peak\n",
              p.pp, p.world / p.pp, p.data_parallel(), static_cast<long long>(p.micro_batches),
              100.0 * vlm::pipeline_bubble(p.pp, p.micro_batches), p.reported_stage);
  for (const auto& s : p.stages) {
    std::string tp = p.tp > 1 ? ", tp group " + human_bytes(s.tp_bytes) + " per micro-batch" : "";
    std::string tie = s.tie_bytes > 0 ? ", tied embedding gradient sum " + human_bytes(s.tie_bytes) + " per step" : "";
    std::printf("  stage %lld: %s: %s parameters per rank, persistent %s, step peak %s (%lld micro-batch%s in flight); "
                "DDP / FSDP per step %s within a node + %s across nodes%s%s; pipeline sends %s per micro-batch\n",
                static_cast<long long>(s.stage.index), stage_holds(p, s.stage).c_str(), with_commas(s.params).c_str(),
                human_bytes(s.persistent_bytes).c_str(), human_bytes(s.peak_bytes).c_str(),
                static_cast<long long>(s.in_flight), s.in_flight == 1 ? "" : "es", human_bytes(s.dp_intra_bytes).c_str(),
                human_bytes(s.dp_inter_bytes).c_str(), tp.c_str(), tie.c_str(), human_bytes(s.send_bytes).c_str());
  }
  std::string spans;
  for (const auto& s : p.stages)
    if (s.next_inter_node) spans += (spans.empty() ? "" : ", ") + vlm::str(s.stage.index, " -> ", s.stage.index + 1);
  std::printf("  each link per micro-batch: B x %s x d x %zu B = %s forward and as much backward (%s%s); links across "
              "nodes: %s (not in the totals above)\n",
              p.tp > 1 ? "L/tp" : "L", c10::elementSize(p.opts.param_dtype), human_bytes(p.link_bytes / 2).c_str(),
              human_bytes(p.link_bytes).c_str(), p.tp > 1 ? "; each tp rank sends its sequence chunk" : "",
              spans.empty() ? "none" : spans.c_str());
}

nlohmann::json pipeline_json(const RecipePlan& p) {
  auto stages = nlohmann::json::array();
  for (const auto& s : p.stages)
    stages.push_back({{"stage", s.stage.index}, {"first_layer", s.stage.first_layer}, {"end_layer", s.stage.end_layer},
                      {"params_per_rank", s.params}, {"persistent_bytes", s.persistent_bytes},
                      {"step_peak_bytes", s.peak_bytes}, {"in_flight", s.in_flight},
                      {"dp_intra_node_bytes_per_step", s.dp_intra_bytes}, {"dp_inter_node_bytes_per_step", s.dp_inter_bytes},
                      {"tp_bytes_per_micro_batch", s.tp_bytes}, {"send_bytes_per_micro_batch", s.send_bytes},
                      {"next_link_inter_node", s.next_inter_node}, {"tied_gradient_bytes_per_step", s.tie_bytes}});
  return {{"pp", p.pp}, {"data_parallel", p.data_parallel()}, {"micro_batches", p.micro_batches},
          {"bubble", vlm::pipeline_bubble(p.pp, p.micro_batches)}, {"link_bytes_per_micro_batch", p.link_bytes},
          {"reported_stage", p.reported_stage}, {"stages", stages}};
}

}  // namespace vlm::app

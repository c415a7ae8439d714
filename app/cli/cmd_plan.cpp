// `vlmtrain plan`: build the model on the meta device (no weights, no memory) and print
// every unit. Two modes:
//   plan --preset NAME            units and parameter counts only
//   plan RECIPE [--preset NAME] [--world-size N] [--nproc-per-node L]
//                                 the policy table resolved over the units: policy,
//                                 strategy, parameters, bytes per rank for params / grads /
//                                 optimizer state (app/plan/memory_plan.h formulas) under
//                                 the recipe's precision, activation checkpointing, totals
//                                 per rank, traffic per rank and link class (within a node /
//                                 across nodes, app/plan/traffic_plan.h) and warnings.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/cli/commands.h"
#include "app/cli/recipe_plan.h"
#include "app/config/sharding_options.h"
#include "app/plan/step_memory.h"
#include "sharding/parallel/context_parallel.h"
#include "sharding/parallel/tensor_parallel.h"
#include "sharding/parallel/expert_parallel.h"
#include "sharding/parallel/sharded_model.h"
#include "app/plan/activation_memory.h"
#include "sharding/parallel/lora.h"
#include "app/plan/memory_plan.h"
#include "sharding/parallel/offload.h"
#include "sharding/parallel/pipeline.h"
#include "sharding/parallel/policy.h"
#include "app/plan/traffic_plan.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::app {

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

namespace {

struct PlanArgs {
  RecipeArgs recipe;                   // optional: without it, --preset alone
  std::optional<std::string> preset;   // --preset NAME
  std::optional<long long> world_size; // --world-size N (with a RECIPE)
  std::optional<long long> nproc_per_node;  // --nproc-per-node L (default: the world size, one node)
  bool json = false;
  bool leaves = false;                 // --leaves (with --preset alone)
  std::optional<long long> tokens;     // --tokens T: the micro-batch (default batch.max_tokens)
  std::optional<long long> image_tokens;  // --image-tokens M (default min(batch.max_image_tokens, T))
  std::optional<long long> micro_batches;  // --micro-batches M per step (default 1; with dist.pp, one
                                           // sample each: min(batch.samples_per_rank, max_micro_batches))
  std::optional<std::string> device;   // --device cpu|cuda: whose kernels' activations (default cuda
                                       // unless dist.device = "cpu")
};


PlannedBatch planned_batch(const PlanArgs& a, const Recipe& recipe, const vlm::VlmConfig& cfg) {
  PlannedBatch pb;
  const long long tokens = a.tokens.value_or(recipe.batch.max_tokens);
  VLM_CHECK(tokens >= 1 && tokens <= (1LL << 31), "vlmtrain plan: --tokens: expected a positive count, got ", tokens);
  const long long images = a.image_tokens.value_or(std::min<long long>(recipe.batch.max_image_tokens, tokens));
  VLM_CHECK(images >= 0 && images <= tokens, "vlmtrain plan: --image-tokens: expected 0..", tokens,
            " (at most the micro-batch's tokens), got ", images);
  pb.image_tokens = images;
  pb.shape.rows = 1;
  pb.shape.seq_len = tokens;
  pb.shape.patches = images * cfg.vision.merge_unit();
  pb.shape.loss_rows = tokens - images;  // at most every text token supervised
  pb.shape.packed = recipe.batch.packing;
  pb.device = a.device.value_or(recipe.dist.device == "cpu" ? "cpu" : "cuda");
  VLM_CHECK(pb.device == "cpu" || pb.device == "cuda", "vlmtrain plan: --device: expected cpu or cuda, got '",
            pb.device, "'");
  return pb;
}

// The micro-batches of the planned step: --micro-batches, else 1, or under pipeline
// parallelism the most a step can have (one sample each), which 1F1B needs to fill its stages.
int64_t planned_micro_batches(const PlanArgs& a, const Recipe& recipe) {
  const auto& b = recipe.batch;
  const long long m = a.micro_batches.value_or(recipe.dist.pp > 1 ? std::min(b.samples_per_rank, b.max_micro_batches) : 1);
  VLM_CHECK(m >= 1 && m <= b.max_micro_batches, "vlmtrain plan: --micro-batches: expected 1..", b.max_micro_batches,
            " (batch.max_micro_batches), got ", m);
  return m;
}

int plan_recipe(const PlanArgs& a);

int plan(const PlanArgs& a) {
  if (!a.recipe.path.empty()) return plan_recipe(a);
  const auto& preset_name = a.preset;
  const bool as_json = a.json;
  const bool leaves = a.leaves;
  VLM_CHECK(!a.world_size.has_value(), "vlmtrain plan: --world-size needs a RECIPE (its policy table)");
  VLM_CHECK(a.recipe.sets.empty(), "vlmtrain plan: --set needs a RECIPE (it overrides a recipe key)");
  VLM_CHECK(preset_name.has_value(), "vlmtrain plan: give a RECIPE or --preset NAME (see `vlmtrain plan --help`)");

  const vlm::VlmConfig cfg = vlm::preset(*preset_name);
  vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));

  std::vector<std::pair<std::string, int64_t>> rows;
  if (leaves) {
    rows = vlm::parameter_table(*model);
  } else {
    for (const auto& u : model->units()) {
      rows.emplace_back(u.path, u.shares_params_with.empty() ? vlm::count_parameters(*u.module) : 0);
    }
  }
  const int64_t total = vlm::count_parameters(*model);
  const int64_t vision = vlm::count_parameters(*model->visual);
  const int64_t merger = model->visual->connector_parameters();
  const int64_t llm = total - vision;

  if (as_json) {
    nlohmann::json j;
    j["preset"] = *preset_name;
    j["family"] = vlm::family_name(cfg.family);
    j["total_params"] = total;
    j["vision_params"] = vision;
    j["merger_params"] = merger;
    j["llm_params"] = llm;
    j["tie_word_embeddings"] = cfg.tie_word_embeddings;
    auto& mods = j["modules"] = nlohmann::json::array();
    for (const auto& [path, n] : rows) mods.push_back({{"path", path}, {"params", n}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  size_t width = 10;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  std::printf("model %s (%s), built on the meta device\n\n", preset_name->c_str(),
              vlm::family_name(cfg.family).c_str());
  std::printf("%-*s %16s\n", static_cast<int>(width), leaves ? "layer" : "unit", "params");
  for (const auto& [path, n] : rows) {
    std::string note = (!leaves && path == "lm_head" && cfg.tie_word_embeddings) ? "  (tied to model.embed_tokens)" : "";
    std::printf("%-*s %16s%s\n", static_cast<int>(width), path.c_str(), with_commas(n).c_str(), note.c_str());
  }
  std::printf("\n%-24s %16s\n", "vision (incl. merger)", with_commas(vision).c_str());
  std::printf("%-24s %16s\n", "merger", with_commas(merger).c_str());
  std::printf("%-24s %16s\n", "llm", with_commas(llm).c_str());
  std::printf("%-24s %16s\n", "total", with_commas(total).c_str());
  return 0;
}


// ---------------------------------------------------------------- plan RECIPE (recipe_plan.h)

// --world-size, --nproc-per-node and the recipe's hybrid_shard group -> the mesh.
void plan_mesh(const PlanArgs& a, RecipePlan& p) {
  if (a.world_size) {
    VLM_CHECK(*a.world_size >= 1 && *a.world_size <= (1 << 20), "vlmtrain plan: --world-size: expected a positive ",
              "integer, got '", *a.world_size, "'");
    p.world = static_cast<int>(*a.world_size);
  }
  p.local_world = p.world;
  if (a.nproc_per_node) {
    VLM_CHECK(*a.nproc_per_node >= 1 && *a.nproc_per_node <= p.world && p.world % *a.nproc_per_node == 0,
              "vlmtrain plan: --nproc-per-node: expected a divisor of the world size ", p.world, ", got ",
              *a.nproc_per_node);
    p.local_world = static_cast<int>(*a.nproc_per_node);
  }
  p.mesh = vlm::app::MeshShape{p.world, 0, p.local_world};
  if (uses_hybrid_shard(p.recipe)) {
    const Recipe& r = p.recipe;
    p.mesh.dp_shard = r.dist.dp_shard > 0 ? static_cast<int>(r.dist.dp_shard) : p.local_world;
    VLM_CHECK(p.mesh.dp_shard <= p.world && p.world % p.mesh.dp_shard == 0, r.source, ": dist.dp_shard = ",
              p.mesh.dp_shard, r.dist.dp_shard > 0 ? "" : " (--nproc-per-node)", " does not divide the world size ",
              p.world, " (hint: hybrid_shard needs dp_shard | world size)");
  }
}

// The architecture: --preset, else the recipe's model.preset, else model.path's config.json.
void plan_model_config(const PlanArgs& a, RecipePlan& p) {
  const Recipe& recipe = p.recipe;
  if (a.preset) {
    p.cfg = vlm::preset(*a.preset);
    p.source = "preset " + *a.preset;
  } else if (!recipe.model.preset.empty()) {
    p.cfg = vlm::preset(recipe.model.preset);
    p.source = "preset " + recipe.model.preset;
  } else {
    VLM_CHECK(!recipe.model.path.empty(), recipe.source, ": neither model.preset nor model.path is set ",
              "(hint: give --preset NAME)");
    try {
      p.cfg = vlm::load_hf_config(recipe.model.path);
    } catch (const vlm::Error& e) {
      throw vlm::Error(std::string(e.what()) + "; to plan without the model files, name its architecture with "
                       "--preset (e.g. --preset qwen2.5-vl-3b)");
    }
    p.source = recipe.model.path;
  }
}

// The units of the model's pipeline stage (the whole model without dist.pp) under the recipe's
// policies, and their memory, traffic and activation plans for the planned step
// (app/plan/step_memory.h).
void plan_stage(RecipePlan& p) {
  namespace sh = vlm::sharding;
  const vlm::PipelineStage& stage = p.model->pipeline_stage();
  p.units = sh::keep_stage_units(sh::resolve_units(*p.model, p.opts), stage);
  // Tensor / pipeline parallelism: DDP / FSDP run over the ranks holding the same slices.
  const vlm::app::MeshShape dp_mesh = data_parallel_mesh(p);
  p.mem = plan_memory(p.units, dp_mesh.world, p.opts.param_dtype, p.opts.reduce_dtype, p.opts.fsdp_accumulate_unsharded,
                      p.mesh.dp_shard);
  if (p.opts.optimizer_offload) plan_offload(p.mem, p.units);  // optimizer bytes -> host
  std::vector<std::pair<std::string, std::string>> call_order;
  for (const auto& u : p.model->units())
    if (stage.runs(u.path)) call_order.emplace_back(u.path, u.shares_params_with.empty() ? u.path : u.shares_params_with);
  p.traffic = plan_traffic(p.units, call_order, dp_mesh, p.opts.param_dtype, p.opts.reduce_dtype,
                           p.opts.fsdp_accumulate_unsharded, sh::calls_without_backward_gather(*p.model, p.units));
  plan_context_parallel(p);
  const AttentionPath apath = p.pb.device == "cuda" ? AttentionPath::cuda : AttentionPath::cpu;
  const StepMemoryModel step_model(*p.model, p.mem, p.units, p.opts.param_dtype, apath,
                                   p.recipe.data.prefetch * p.recipe.batch.samples_per_rank);
  p.step = step_model.step(p.pb.shape, p.micro_batches, p.recipe.batch.samples_per_rank);
  p.act = plan_activations(*p.model, p.pb.shape, p.opts.param_dtype, apath);
  p.all_to_all_bytes = plan_all_to_all(p);
  plan_tensor_parallel_bytes(p);
}

// The model on the meta device under the recipe's policies, planned whole or per pipeline stage.
RecipePlan make_recipe_plan(const PlanArgs& a) {
  namespace sh = vlm::sharding;
  VLM_CHECK(!a.leaves, "vlmtrain plan: --leaves applies with --preset NAME alone (without a RECIPE)");
  RecipePlan p;
  p.recipe = load_recipe(a.recipe);
  p.recipe.validate(Purpose::plan);
  plan_mesh(a, p);
  plan_model_config(a, p);
  p.opts = sharding_options(p.recipe);
  p.model = vlm::VisionLanguageModel(p.cfg, torch::TensorOptions().device(torch::kMeta).dtype(p.opts.param_dtype));
  sh::attach_lora(*p.model, p.opts);
  p.total = vlm::count_parameters(*p.model);  // the whole model, before the experts are split
  plan_tensor_parallel_shape(p);
  plan_pipeline_shape(p);
  sh::ParamCounts whole_counts;
  if (p.tp > 1) {  // one rank's slices; the parameter counts stay the whole model's
    whole_counts = sh::count_params(sh::resolve_units(*p.model, p.opts));
    p.model = vlm::VisionLanguageModel(p.cfg, torch::TensorOptions().device(torch::kMeta).dtype(p.opts.param_dtype));
  }
  split_experts(p);
  const std::vector<sh::UnitPlan> all = sh::resolve_units(*p.model, p.opts);
  p.counts = p.tp > 1 ? whole_counts : sh::count_params(all);
  for (const auto& u : all)  // the experts other EP ranks hold count too
    if (u.sharding == sh::Sharding::kExpert) {
      p.counts.total += u.numel * (p.ep - 1);
      p.counts.trainable += u.numel * (p.ep - 1);
    }
  sh::apply_freeze(all);  // requires_grad as the policies set it: what autograd keeps follows
  p.pb = planned_batch(a, p.recipe, p.cfg);
  p.micro_batches = planned_micro_batches(a, p.recipe);
  if (p.pp > 1)
    plan_pipeline(p, plan_stage);
  else
    plan_stage(p);
  return p;
}

nlohmann::json plan_json(const RecipePlan& p) {
  namespace sh = vlm::sharding;
  const auto checkpointed = p.checkpointed_fn();
  const MemoryPlan& mem = p.mem;
  nlohmann::json j;
  j["recipe"] = p.recipe.source;
  j["model"] = p.source;
  j["family"] = vlm::family_name(p.cfg.family);
  j["world_size"] = p.world;
  if (p.ep > 1)
    j["expert_parallel"] = {{"ep", p.ep}, {"experts_per_rank", p.cfg.text.num_experts / p.ep},
                            {"all_to_all_bytes_per_micro_batch", p.all_to_all_bytes}};
  if (p.cp > 1)
    j["context_parallel"] = {{"cp", p.cp}, {"mode", p.recipe.dist.cp_mode},
                             {"decoder_tokens_per_rank", p.pb.shape.decoder_tokens()},
                             {"all_to_all_bytes_per_micro_batch", p.cp_bytes}};
  if (p.tp > 1)
    j["tensor_parallel"] = {{"tp", p.tp}, {"data_parallel", p.data_parallel()}, {"params_per_rank", p.rank_params()},
                            {"bytes_per_micro_batch", p.tp_bytes}};
  if (p.pp > 1) j["pipeline_parallel"] = pipeline_json(p);
  j["micro_batches"] = p.micro_batches;
  j["mesh"] = {{"nproc_per_node", p.local_world}, {"dp_shard", p.mesh.shard()}, {"dp_replicate", p.mesh.replicate()}};
  j["param_dtype"] = p.recipe.precision.param_dtype;
  j["reduce_dtype"] = p.recipe.precision.reduce_dtype;
  j["total_params"] = p.total;
  j["trainable_params"] = p.counts.trainable;
  auto& arr = j["units"] = nlohmann::json::array();
  for (size_t i = 0; i < p.units.size(); ++i) {
    const auto& u = p.units[i];
    const auto& m = mem.units[i];
    arr.push_back({{"path", u.path}, {"aliases", u.aliases}, {"policy", sh::policy_name(u.policy)},
                   {"strategy", sh::strategy_name(u.strategy)}, {"sharding", sh::sharding_name(u.sharding)},
                   {"rule", u.rule}, {"params", u.numel}, {"trainable", u.trainable()},
                   {"param_bytes", m.param_bytes},
                   {"grad_bytes", m.grad_bytes}, {"optim_bytes", m.optim_bytes}, {"total_bytes", m.total()},
                   {"host_optim_bytes", m.host_optim_bytes}, {"activation_checkpointing", u.checkpointed},
                   {"activation_bytes", p.unit_activation(u)}});
  }
  j["totals"] = {{"param_bytes", mem.total.param_bytes}, {"grad_bytes", mem.total.grad_bytes},
                 {"optim_bytes", mem.total.optim_bytes}, {"total_bytes", mem.total.total()},
                 {"host_optim_bytes", mem.total.host_optim_bytes}};
  j["optimizer_offload"] = p.opts.optimizer_offload;
  j["offload_saved_bytes"] = mem.offload_saved_bytes;
  j["gathered_peak_bytes"] = mem.gathered_peak_bytes;
  j["reduce_scatter_peak_bytes"] = mem.reduce_scatter_peak_bytes;
  j["unsharded_accum_bytes"] = mem.unsharded_accum_bytes;
  j["peak_bytes"] = mem.peak_bytes();
  j["startup_peak_bytes"] = mem.startup_peak_bytes();
  j["whole_load_peak_bytes"] = mem.whole_load_peak_bytes();
  const PlannedBatch& pb = p.pb;
  j["activations"] = {{"tokens", pb.shape.tokens()}, {"image_tokens", pb.image_tokens},
                      {"patches", pb.shape.patches}, {"packed", pb.shape.packed}, {"device", pb.device},
                      {"forward_bytes", p.act.forward_bytes(checkpointed)}, {"peak_bytes", p.act.peak_bytes(checkpointed)}};
  const StepMemory& step = p.step;
  j["step_peak"] = {{"persistent_bytes", step.persistent}, {"inputs_bytes", step.inputs},
                    {"gathered_bytes", step.gathered}, {"reduce_scatter_bytes", step.reduce},
                    {"loss_backward_activation_bytes", step.act_head},
                    {"unit_backward_activation_bytes", step.act_units}, {"unit_grad_bytes", step.grads},
                    {"step_grad_bytes", step.step_grads}, {"cublas_workspace_bytes", step.workspace},
                    {"total_bytes", step.total()}};
  auto& ops = j["traffic"]["ops"] = nlohmann::json::array();
  for (const auto& o : p.traffic.ops)
    ops.push_back({{"unit", o.unit}, {"op", o.op}, {"group", comm_group_name(o.group)},
                   {"inter_node", o.inter_node}, {"bytes", o.bytes}, {"per_micro_batch", o.per_micro_batch},
                   {"per_step", o.per_step}});
  j["traffic"]["step_1mb"] = {{"intra_node_bytes", p.traffic.intra_node_bytes(1)},
                              {"inter_node_bytes", p.traffic.inter_node_bytes(1)}};
  j["traffic"]["per_extra_micro_batch"] = {
      {"intra_node_bytes", p.traffic.intra_node_bytes(2) - p.traffic.intra_node_bytes(1)},
      {"inter_node_bytes", p.traffic.inter_node_bytes(2) - p.traffic.inter_node_bytes(1)}};
  j["warnings"] = mem.warnings;
  return j;
}

// The unit table: one row per unit, then the totals per rank.
void print_unit_table(const RecipePlan& p) {
  namespace sh = vlm::sharding;
  const MemoryPlan& mem = p.mem;
  size_t width = 10;
  for (const auto& u : p.units) width = std::max(width, u.path.size() + (u.aliases.empty() ? 0 : u.aliases.size() + 3));
  std::printf("recipe %s, model %s (%s) on the meta device, world size %d, params %s, grads reduced in %s\n\n",
              p.recipe.source.c_str(), p.source.c_str(), vlm::family_name(p.cfg.family).c_str(), p.world,
              p.recipe.precision.param_dtype.c_str(), p.recipe.precision.reduce_dtype.c_str());
  const int w = static_cast<int>(width);
  std::printf("%-*s %-7s %-16s %-16s %15s %11s %11s %11s %11s %11s  %s\n", w, "unit", "policy", "strategy",
              "sharding", "params", "params/rank", "grads/rank", "optim/rank", "total/rank", "activations", "act.ckpt");
  for (size_t i = 0; i < p.units.size(); ++i) {
    const auto& u = p.units[i];
    const auto& m = mem.units[i];
    const std::string name = u.aliases.empty() ? u.path : u.path + " (" + u.aliases + ")";
    std::printf("%-*s %-7s %-16s %-16s %15s %11s %11s %11s %11s %11s  %s\n", w, name.c_str(),
                sh::policy_name(u.policy), sh::strategy_name(u.strategy), sh::sharding_name(u.sharding),
                with_commas(u.numel).c_str(), human_bytes(m.param_bytes).c_str(), human_bytes(m.grad_bytes).c_str(),
                human_bytes(m.optim_bytes).c_str(), human_bytes(m.total()).c_str(),
                human_bytes(p.unit_activation(u)).c_str(), u.checkpointed ? "yes" : "no");
  }
  std::printf("\n%-*s %-7s %-16s %-16s %15s %11s %11s %11s %11s %11s\n", w, "total per rank", "", "", "",
              with_commas(p.total).c_str(), human_bytes(mem.total.param_bytes).c_str(),
              human_bytes(mem.total.grad_bytes).c_str(), human_bytes(mem.total.optim_bytes).c_str(),
              human_bytes(mem.total.total()).c_str(), human_bytes(p.act.forward_bytes(p.checkpointed_fn())).c_str());
}

// Transient buffers, activations, the step's peak, accumulation and offload lines.
void print_memory(const RecipePlan& p) {
  const MemoryPlan& mem = p.mem;
  const auto checkpointed = p.checkpointed_fn();
  if (mem.gathered_peak_bytes > 0 || mem.reduce_scatter_peak_bytes > 0)
    std::printf("\ntransient: gathered flat parameters %s (every shard_grad_op unit + the three largest full_shard "
                "units: running + two prefetched), reduce-scatter buffers in flight %s (the two largest trainable "
                "fsdp units, reduce dtype); peak per rank %s before activations (below)\n",
                human_bytes(mem.gathered_peak_bytes).c_str(), human_bytes(mem.reduce_scatter_peak_bytes).c_str(),
                human_bytes(mem.peak_bytes()).c_str());
  const bool sharded_load = p.recipe.model.sharded_load;
  std::printf("\nstart-up peak per rank: %s with model.sharded_load = true%s (each rank allocates only what it "
              "keeps; gather buffers get memory only while gathered), %s with false%s (the whole model in %s on "
              "every rank first)\n",
              human_bytes(mem.startup_peak_bytes()).c_str(), sharded_load ? " (this recipe)" : "",
              human_bytes(mem.whole_load_peak_bytes()).c_str(), sharded_load ? "" : " (this recipe)",
              c10::toString(p.opts.param_dtype));
  const PlannedBatch& pb = p.pb;
  std::printf("\nactivations for one micro-batch of %lld tokens (%lld image tokens = %lld patches%s; %s kernels; "
              "--tokens / --image-tokens to change): %s kept at the end of the forward (column above), peak %s "
              "through backward\n",
              static_cast<long long>(pb.shape.tokens()), static_cast<long long>(pb.image_tokens),
              static_cast<long long>(pb.shape.patches), pb.shape.packed ? ", packed" : "", pb.device.c_str(),
              human_bytes(p.act.forward_bytes(checkpointed)).c_str(), human_bytes(p.act.peak_bytes(checkpointed)).c_str());
  const StepMemory& step = p.step;
  std::printf("step peak per rank (app/plan/step_memory.h): persistent %s + inputs %s%s + max(gathered units %s + "
              "max(loss backward %s, reduce-scatter buffers %s + unit backward %s) + a unit's parameter gradient %s, "
              "gradients until the optimizer %s) = %s\n",
              human_bytes(step.persistent).c_str(), human_bytes(step.inputs).c_str(),
              step.workspace > 0 ? (" + cuBLAS workspaces " + human_bytes(step.workspace)).c_str() : "",
              human_bytes(step.gathered).c_str(),
              human_bytes(step.act_head).c_str(), human_bytes(step.reduce).c_str(), human_bytes(step.act_units).c_str(),
              human_bytes(step.grads).c_str(), human_bytes(step.step_grads).c_str(), human_bytes(step.total()).c_str());
  if (mem.unsharded_accum_bytes > 0)
    std::printf("fsdp_accumulate = \"unsharded\": unsharded gradient sums %s during gradient accumulation "
                "(every trainable fsdp unit, reduce dtype; included in the peak), one reduce-scatter per unit "
                "and step instead of one per micro-batch\n",
                human_bytes(mem.unsharded_accum_bytes).c_str());
  if (p.opts.optimizer_offload)
    std::printf("optimizer_offload: optimizer state in host memory (pinned on CUDA: fp32 master, m, v and grad "
                "staging) %s per rank; device memory saved %s per rank (optim/rank above is what stays)\n",
                human_bytes(mem.total.host_optim_bytes).c_str(), human_bytes(mem.offload_saved_bytes).c_str());
}

// Bytes per rank and step within a node and across nodes, and per process group.
void print_traffic(const RecipePlan& p) {
  const TrafficPlan& traffic = p.traffic;
  std::printf("\ntraffic per rank and step (ring volumes; %d node%s x %d ranks", p.world / p.local_world,
              p.world / p.local_world == 1 ? "" : "s", p.local_world);
  if (uses_hybrid_shard(p.recipe)) std::printf("; mesh dp_replicate %d x dp_shard %d", p.mesh.replicate(), p.mesh.shard());
  std::printf("): within a node %s + %s per extra micro-batch, across nodes %s + %s per extra micro-batch\n",
              human_bytes(traffic.intra_node_bytes(1)).c_str(),
              human_bytes(traffic.intra_node_bytes(2) - traffic.intra_node_bytes(1)).c_str(),
              human_bytes(traffic.inter_node_bytes(1)).c_str(),
              human_bytes(traffic.inter_node_bytes(2) - traffic.inter_node_bytes(1)).c_str());
  for (CommGroup g : {CommGroup::kWorld, CommGroup::kShard, CommGroup::kReplicate, CommGroup::kExpertReplicate}) {
    const double b = traffic.group_bytes(g, 1);
    if (b > 0)
      std::printf("  %-9s group %s: %s per step of one micro-batch\n", comm_group_name(g),
                  TrafficPlan::spans_nodes(p.mesh, g) ? "(across nodes)" : "(within a node)", human_bytes(b).c_str());
  }
}

int plan_recipe(const PlanArgs& a) {
  const RecipePlan p = make_recipe_plan(a);
  if (a.json) {
    std::cout << plan_json(p).dump(2) << "\n";
    return 0;
  }
  print_unit_table(p);
  print_memory(p);
  if (p.world > 1) print_traffic(p);
  if (p.ep > 1)
    std::printf("expert parallelism: dist.ep = %d, %lld of %lld experts per sparse layer and rank (the +experts "
                "rows above: one rank's experts); all-to-all on the EP group %s per rank and micro-batch of %lld tokens (uniform "
                "routing assumed; not in the totals above)\n",
                p.ep, static_cast<long long>(p.cfg.text.num_experts / p.ep),
                static_cast<long long>(p.cfg.text.num_experts), human_bytes(p.all_to_all_bytes).c_str(),
                static_cast<long long>(p.pb.shape.tokens()));
  if (p.cp > 1)
    std::printf("context parallelism: dist.cp = %d (%s), %d data-parallel group(s) of %d ranks; each rank's decoder "
                "holds %lld of the micro-batch's %lld tokens (the activations above); all-to-all on the cp group %s "
                "per rank and micro-batch (not in the totals above)\n",
                p.cp, p.recipe.dist.cp_mode.c_str(), p.world / p.cp, p.cp,
                static_cast<long long>(p.pb.shape.decoder_tokens()), static_cast<long long>(p.pb.shape.tokens()),
                human_bytes(p.cp_bytes).c_str());
  if (p.tp > 1)
    std::printf("tensor parallelism: dist.tp = %d, %d data-parallel rank(s) per tp rank (DDP / FSDP over them: the "
                "rows above are one rank's slices, %s parameters); on the tp group %s per rank and micro-batch (not in "
                "the totals above); activations above: one rank's heads over the whole sequence (the sequence split "
                "of the norms between layers is not planned yet)\n",
                p.tp, p.data_parallel(), with_commas(p.rank_params()).c_str(), human_bytes(p.tp_bytes).c_str());
  print_pipeline(p);
  std::printf("\nparams: total %s, trainable %s (%.4f%%)\n", with_commas(p.total).c_str(),
              with_commas(p.counts.trainable).c_str(), p.total > 0 ? 100.0 * p.counts.trainable / p.total : 0.0);
  for (const auto& warning : p.mem.warnings) std::printf("warning: %s\n", warning.c_str());
  return 0;
}

}  // namespace

CommandRun declare_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  app.description(R"(usage: vlmtrain plan RECIPE [--preset NAME] [--world-size N] [--nproc-per-node L]
                         [--tokens T] [--image-tokens M] [--micro-batches M] [--device cpu|cuda] [--json]
                         [--set KEY=VALUE]...
       vlmtrain plan --preset NAME [--json] [--leaves]

Builds the model on the meta device and prints every module with its parameter count,
policy and bytes per rank, plus totals.
)");
  add_recipe(app, a->recipe, /*required=*/false);
  std::string presets;
  for (const auto& n : vlm::preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  add_value(app, "--preset", a->preset, "NAME", "model preset (every registered family): " + presets);
  add_value(app, "--world-size", a->world_size, "N", "ranks to plan for (default 1)");
  add_value(app, "--nproc-per-node", a->nproc_per_node, "L",
            "ranks per node (default: the world size, one node): the link class of each\n"
            "collective's group, and hybrid_shard's shard group when dist.dp_shard = 0");
  add_flag(app, "--json", a->json,
           "one JSON object: preset, total_params, vision_params (incl. merger),\n"
           "merger_params (merger and DeepStack mergers), llm_params, modules [{path, params}]; with a RECIPE\n"
           "instead total_params and trainable_params (LoRA adapters included),\n"
           "world_size, param_dtype, units [{path, aliases, policy, strategy, sharding,\n"
           "rule, params, trainable, param_bytes, grad_bytes, optim_bytes, total_bytes,\n"
           "host_optim_bytes, activation_checkpointing, activation_bytes}], totals {...}, gathered_peak_bytes,\n"
           "reduce_scatter_peak_bytes, unsharded_accum_bytes, peak_bytes, startup_peak_bytes,\n"
           "whole_load_peak_bytes, optimizer_offload,\n"
           "offload_saved_bytes, mesh {nproc_per_node, dp_shard, dp_replicate}, traffic {ops [{unit,\n"
           "op, group, inter_node, bytes, per_micro_batch, per_step}], step_1mb,\n"
           "per_extra_micro_batch}, activations {tokens, image_tokens, patches, packed, device,\n"
           "forward_bytes, peak_bytes}, step_peak {persistent_bytes, inputs_bytes, sharding_bytes,\n"
           "activations_bytes, unit_grad_bytes, step_grad_bytes, total_bytes}, micro_batches, warnings;\n"
           "with dist.pp pipeline_parallel {pp, data_parallel, micro_batches, bubble,\n"
           "link_bytes_per_micro_batch, reported_stage, stages [{stage, first_layer, end_layer,\n"
           "params_per_rank, persistent_bytes, step_peak_bytes, in_flight, dp_intra_node_bytes_per_step,\n"
           "dp_inter_node_bytes_per_step, tp_bytes_per_micro_batch, send_bytes_per_micro_batch,\n"
           "next_link_inter_node, tied_gradient_bytes_per_step}]} (units and totals: reported_stage's)");
  add_flag(app, "--leaves", a->leaves, "list every parameter-owning layer instead of the sharding units");
  add_value(app, "--tokens", a->tokens, "T", "activations for a micro-batch of T tokens (default batch.max_tokens)");
  add_value(app, "--image-tokens", a->image_tokens, "M",
            "of which M merged image tokens (default min(batch.max_image_tokens, T))");
  add_value(app, "--micro-batches", a->micro_batches, "M",
            "micro-batches per step: the step peak (gradients accumulating) and, with dist.pp, the\n"
            "bubble and the micro-batches in flight per stage (default 1; with dist.pp\n"
            "min(batch.samples_per_rank, batch.max_micro_batches), one sample each)");
  add_value(app, "--device", a->device, "cpu|cuda",
            "whose kernels' activations (default cuda, cpu when dist.device = \"cpu\")");
  app.footer(R"(Bytes per rank as the engine allocates them (P unit parameters, N ranks, p / r bytes of
precision.param_dtype / reduce_dtype, S = ceil(P/N); app/plan/memory_plan.h):
  freeze pP | ddp pP + grads + 12P (bf16; fp32: 8P); grads = rP (the bucket, where they
  accumulate) when r > p (bf16 params, fp32 reduce), else (p + r)P (.grad + bucket)
  ddp shard_optimizer: optimizer state S*12 | fsdp shard_grad_op and full_shard: params S*p,
  fp32 grads S*4, optimizer S*12 (hybrid_shard: the same with N = dist.dp_shard, the shard
  group); shard_grad_op units are gathered whole during the step
  (transient). Transient peaks: gathered flat buffers, reduce-scatter buffers in flight.
  lora: a unit with adapters shows as two rows: <unit> (the frozen base: pP, or S*p with
  strategy = "full_shard") and <unit>+lora (the adapters, trained like ddp).
  sharding.optimizer_offload = true: optimizer 0 on the device; host memory 16 B per state
  element (fp32 master, m, v, grad staging), shown apart with the device bytes saved.)");
  return [a] { return plan(*a); };
}

}  // namespace vlm::app

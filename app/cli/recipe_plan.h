// The state of `vlmtrain plan RECIPE` (app/cli/cmd_plan.cpp) and its parallel dimensions'
// steps (app/cli/plan_parallel.cpp): expert, context and tensor parallelism change the meta
// model, the activation shape and the bytes per rank before the cost models run; pipeline
// parallelism runs the cost models once per stage.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/config/recipe.h"
#include "app/plan/activation_memory.h"
#include "app/plan/memory_plan.h"
#include "app/plan/step_memory.h"
#include "app/plan/traffic_plan.h"
#include "sharding/parallel/lora.h"
#include "sharding/parallel/policy.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/model/config.h"
#include "vlm/model/pipeline_stage.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::app {

// The micro-batch `plan` sizes activations for: the recipe's budget unless overridden.
struct PlannedBatch {
  vlm::app::MicroBatchShape shape;
  int64_t image_tokens = 0;
  std::string device;
};

// One pipeline stage (dist.pp > 1): what a rank of the stage holds, keeps and moves.
struct StagePlan {
  vlm::PipelineStage stage;
  int64_t params = 0;           // parameters a rank holds: its units' (one tp rank's slices)
  double persistent_bytes = 0;  // StepMemory::persistent
  double peak_bytes = 0;        // StepMemory::total(), its activations min(pp - s, m) micro-batches'
  int64_t in_flight = 1;        // micro-batches whose activations it keeps at once
  double dp_intra_bytes = 0;    // DDP / FSDP bytes per rank and step of the plan's micro-batches,
  double dp_inter_bytes = 0;    // within a node / across nodes
  double tp_bytes = 0;          // on the tp group per micro-batch
  double send_bytes = 0;        // sent on its pipeline links per micro-batch (activations, gradients)
  bool next_inter_node = false; // its link to the next stage spans nodes
  double tie_bytes = 0;         // a tied head: the embedding gradient's sum with the other end, per step
};

// Everything `plan RECIPE` prints, computed once: the mesh, the model on the meta device with
// the recipe's policies, and the cost models over it.
struct RecipePlan {
  Recipe recipe;
  int world = 1;
  int local_world = 1;
  vlm::app::MeshShape mesh;
  std::string source;  // "preset NAME" or the model path
  vlm::VlmConfig cfg;
  vlm::sharding::ShardingOptions opts;
  vlm::VisionLanguageModel model{nullptr};
  std::vector<vlm::sharding::UnitPlan> units;
  vlm::sharding::ParamCounts counts;
  MemoryPlan mem;
  TrafficPlan traffic;
  PlannedBatch pb;
  StepMemory step;
  ActivationPlan act;
  int64_t total = 0;
  int ep = 1;                  // dist.ep when an ep rule is present (the units hold E / ep experts)
  double all_to_all_bytes = 0; // ep: planned all-to-all bytes per rank and micro-batch (see plan_experts)
  int cp = 1;                  // dist.cp: context parallelism (Ulysses)
  double cp_bytes = 0;         // cp: all-to-all bytes per rank and micro-batch on the cp group
  int tp = 1;                  // dist.tp: tensor parallelism (the model holds one rank's slices)
  double tp_bytes = 0;         // tp: bytes per rank and micro-batch on the tp group
  int pp = 1;                  // dist.pp: pipeline stages (model, units and plans: one stage's)
  int64_t micro_batches = 1;   // per step (--micro-batches): the step peak; pp's bubble and in-flight count
  std::vector<StagePlan> stages;  // pp: every stage
  size_t reported_stage = 0;   // pp: the stage with the largest step peak, whose rows the plan holds
  double link_bytes = 0;       // pp: bytes per micro-batch on each link, forward and backward

  // Ranks that hold the same parameters: DDP / FSDP run over them.
  int data_parallel() const { return world / (pp * tp); }
  // Parameters a rank holds: its units' (one tp rank's slices, one stage's units).
  int64_t rank_params() const {
    int64_t n = 0;
    for (const auto& u : units) n += u.numel;
    return n;
  }

  bool checkpointed(const std::string& path) const {
    for (const auto& u : units)
      if (u.path == path) return u.checkpointed;
    return false;
  }
  std::function<bool(const std::string&)> checkpointed_fn() const {
    return [this](const std::string& p) { return checkpointed(p); };
  }
  // A unit's activation bytes at the end of the forward (a tied lm_head's rows join its unit).
  double unit_activation(const vlm::sharding::UnitPlan& u) const {
    if (!u.adapter_of.empty()) return 0.0;
    double b = act.unit_forward_bytes(u.path, checkpointed_fn());
    if (!u.aliases.empty()) b += act.unit_forward_bytes(u.aliases, checkpointed_fn());
    return b;
  }
};

// "1,234,567".
std::string with_commas(int64_t n);

// Expert parallelism: the meta model keeps one rank's experts (split_experts); the planned
// all-to-all bytes per rank and micro-batch (plan_all_to_all).
void split_experts(RecipePlan& p);
double plan_all_to_all(const RecipePlan& p);
// Context parallelism: the activation shape's cp and the exchanges' bytes.
void plan_context_parallel(RecipePlan& p);
// Tensor parallelism: the split's check and cfg.text.tensor_parallel (before the meta model is
// built); the tp group's bytes (after the units and the batch are known).
void plan_tensor_parallel_shape(RecipePlan& p);
void plan_tensor_parallel_bytes(RecipePlan& p);
// The data-parallel ranks of a (tp rank, stage) as a mesh: world / (pp x tp) ranks, those of
// a node counted among the node's ranks of the stage (the recipe's mesh without tp and pp).
vlm::app::MeshShape data_parallel_mesh(const RecipePlan& p);
// Pipeline parallelism: the checks (pp divides the world size, tp the stage's ranks); then
// plan_stage on the meta model set to each stage of pipeline_split, every stage's summary,
// and p left planned for the stage with the largest step peak; its report and JSON.
void plan_pipeline_shape(RecipePlan& p);
void plan_pipeline(RecipePlan& p, const std::function<void(RecipePlan&)>& plan_stage);
void print_pipeline(const RecipePlan& p);
nlohmann::json pipeline_json(const RecipePlan& p);

}  // namespace vlm::app

// The trainer's start-up log lines (contract in startup_log.h).
#include "app/train/startup_log.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "sharding/dist/device_context.h"
#include "sharding/parallel/lora.h"
#include "sharding/parallel/pipeline.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/host_malloc.h"
#include "vlm/runtime/process_memory.h"

namespace vlm::app {

std::string short_bytes(double b) {
  const char* units[] = {"B", "K", "M", "G", "T"};
  int k = 0;
  while (b >= 1024 && k < 4) {
    b /= 1024;
    ++k;
  }
  return fmt::format("{:.1f}{}", b, units[k]);
}

void announce_run(const Recipe& recipe, const vlm::sharding::DistEnv& env, vlm::sharding::ParallelDims& dims) {
  if (!dims.is_main()) return;
  spdlog::info("vlmtrain {} | {} | recipe {} (hash {})", VLMTRAIN_VERSION, env.describe(), recipe.source,
               recipe_hash(recipe));
  if (!vlm::host_malloc_setting().empty()) spdlog::info("{}", vlm::host_malloc_setting());
  if (dims.distributed())
    spdlog::info("comm: data plane {}, one group per lane (main, fsdp-gather, fsdp-reduce, ddp) | control plane {}",
                 dims.comm().transport(), dims.control().transport());
  if (!dims.comm_warm_ups().empty()) {
    std::string made;
    double total = 0;
    for (const auto& w : dims.comm_warm_ups()) {
      made += fmt::format("{}{} ({} ranks) {:.3f} s", made.empty() ? "" : ", ", w.plane, w.size, w.seconds);
      total += w.seconds;
    }
    spdlog::info("comm: {} communicators created at start-up, in this order: {} ({:.2f} s in all)",
                 dims.comm_warm_ups().size(), made, total);
  }
  if (dims.has_mesh())
    spdlog::info("mesh: dp_replicate {} x dp_shard {}: hybrid_shard units are sharded within groups of {} "
                 "consecutive ranks and their gradients all-reduced across {} replicas",
                 dims.dp_replicate(), dims.dp_shard(), dims.dp_shard(), dims.dp_replicate());
  spdlog::info("resolved recipe:\n{}", to_toml(recipe));
  spdlog::info("resolved recipe saved to {}", save_resolved_recipe(recipe, recipe.run.output_dir));
}

void log_sharded_load(const vlm::sharding::ShardedLoadStats& st, const vlm::sharding::MemoryReport& m,
                      const MemoryPlan& plan, int64_t rss_before_model, int64_t device_before,
                      vlm::sharding::ParallelDims& dims, bool random_init, bool sharded) {
  if (!dims.is_main()) return;
  const vlm::sharding::DeviceMemory dev = dims.device_context().memory();
  const std::string how =
      sharded ? vlm::str(random_init ? "initialised" : "read", " on rank 0: ", st.sharded_units, " units sharded, ",
                         st.whole_units, " whole, ", st.elements_filled, " elements filled, ",
                         short_bytes(static_cast<double>(st.bytes_read)), " read")
              : std::string("whole model on every rank, rank 0's broadcast (model.sharded_load = false)");
  spdlog::info("weights: {} | persistent share {} | start-up peak of {} tensor bytes {} (plan {}) | host RSS {} "
               "before the model, {} now, peak {}",
               how, short_bytes(m.persistent()), dims.device().is_cuda() ? "device" : "CPU",
               short_bytes(static_cast<double>(dev.peak_allocated - device_before)),
               short_bytes(sharded ? plan.startup_peak_bytes() : plan.whole_load_peak_bytes()),
               short_bytes(static_cast<double>(rss_before_model)), short_bytes(static_cast<double>(current_rss_bytes())),
               short_bytes(static_cast<double>(std::max(peak_rss_bytes(), current_rss_bytes()))));  // maxrss lags
}

void log_unit_table(const vlm::sharding::ShardedModel& sm, const MemoryPlan& plan, bool main) {
  if (!main) return;
  const vlm::sharding::MemoryReport m0 = sm.memory();
  const vlm::sharding::ParamCounts pc = vlm::sharding::count_params(sm.unit_table());
  spdlog::info("unit table:\n{}params: total {}, trainable {}\nmemory per rank: params {} + grads {} + "
               "optimizer {} (persistent){}; plan: {} persistent + {} transient (gathered units, reduce-scatter "
               "buffers, unsharded sums) = {} before activations; the step log's mem is the measured peak "
               "of tensor bytes on the device, next to the plan for the micro-batches the window ran "
               "(inputs and activations added; app/plan/step_memory.h)",
               vlm::sharding::unit_table_text(sm.unit_table()), pc.total, pc.trainable,
               short_bytes(m0.param_bytes), short_bytes(m0.grad_bytes), short_bytes(m0.optim_bytes),
               m0.host_optim_bytes > 0 ? fmt::format("; optimizer state in host memory {} (sharding.optimizer_offload)",
                                                     short_bytes(m0.host_optim_bytes))
                                       : std::string(),
               short_bytes(plan.total.total()), short_bytes(plan.peak_bytes() - plan.total.total()),
               short_bytes(plan.peak_bytes()));
  for (const auto& n : sm.notes()) spdlog::warn("{}", n);
}

void log_step_memory_plan(const StepMemory& planned, bool main) {
  if (!main) return;
  spdlog::info("memory plan of step 1 (app/plan/step_memory.h): persistent {} + inputs {} + max(gathered units {} "
               "+ max(loss backward {}, reduce-scatter buffers {} + unit backward {}) + a unit's parameter "
               "gradient {}, gradients until the optimizer {}) = {} (measured: the step log's mem)",
               short_bytes(planned.persistent), short_bytes(planned.inputs), short_bytes(planned.gathered),
               short_bytes(planned.act_head), short_bytes(planned.reduce), short_bytes(planned.act_units),
               short_bytes(planned.grads), short_bytes(planned.step_grads), short_bytes(planned.total()));
}

// The ranks that share a data-parallel rank's samples, for the data line.
namespace {
std::string data_group_name(const vlm::sharding::ParallelDims& dims) {
  const std::string stages = dims.pp() > 1 ? fmt::format(" in each of {} pipeline stages", dims.pp()) : "";
  if (dims.cp() > 1) return fmt::format("group of {} context-parallel ranks{}", dims.cp(), stages);
  if (dims.tp() > 1) return fmt::format("group of {} tensor-parallel ranks{}", dims.tp(), stages);
  return dims.pp() > 1 ? "rank" + stages : std::string("rank");
}
}  // namespace

void log_data(const Recipe& recipe, const TrainData& data, int64_t steps_total, vlm::sharding::ParallelDims& dims) {
  if (!dims.is_main()) return;
  spdlog::info("data: {} | {} steps per epoch of {} samples ({} per {}) | {} steps | packing {}",
               data.dataset().summary(), data.steps_per_epoch(), recipe.batch.samples_per_rank * dims.dp_size(),
               recipe.batch.samples_per_rank,
               data_group_name(dims),
               steps_total, recipe.batch.packing ? "on (padding-free rows)" : "off (padded rows)");
}

void log_pipeline_stages(vlm::VisionLanguageModelImpl& model, vlm::sharding::ParallelDims& dims) {
  if (!dims.is_main() || dims.pp() == 1) return;
  std::string line;
  for (const vlm::PipelineStage& s : vlm::sharding::pipeline_split(model, dims.pp()))
    line += fmt::format("{}stage {}: layers [{}, {}){}{}", line.empty() ? "" : "; ", s.index, s.first_layer,
                        s.end_layer, s.first() ? " + vision tower, embedding" : "", s.last() ? " + norm, head" : "");
  spdlog::info("pipeline: {} stages of {} rank(s), 1F1B: {} (docs/pipeline_parallel.md)", dims.pp(), dims.stage_size(),
               line);
}

}  // namespace vlm::app

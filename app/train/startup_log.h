// The trainer's start-up log lines (rank 0): what runs where, how the weights arrived, the
// unit table with its memory plan, and the plan of step 1. Every function logs on rank 0
// only (dims.is_main() / `main`) and changes nothing else, except announce_run, which also
// saves the resolved recipe.
#pragma once
#include <cstdint>
#include <string>

#include "app/config/recipe.h"
#include "app/plan/memory_plan.h"
#include "app/plan/step_memory.h"
#include "app/train/train_data.h"
#include "sharding/dist/dist_env.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"

namespace vlm::app {

// Bytes in one short word for log lines: "512.0B", "1.5K", "3.2M", "7.9G", "1.0T".
std::string short_bytes(double bytes);

// Rank 0: version, launcher, the planes' transports, the mesh, the resolved recipe; then
// saves the resolved recipe to <run.output_dir>/recipe.toml and says where.
void announce_run(const Recipe& recipe, const vlm::sharding::DistEnv& env, vlm::sharding::ParallelDims& dims);

// Rank 0: one line on how the weights arrived on this rank (sharded loading,
// sharding/parallel/sharded_load.h) and what start-up cost in host and device memory, next to
// the rank's persistent share it must stay close to, and the start-up peak of device tensor
// bytes (the CUDA caching allocator's peak; on the CPU the tensor memory meter's) against
// the plan's (memory_plan.h startup_peak_bytes / whole_load_peak_bytes). `rss_before_model`:
// host RSS before load_model; `device_before`: device tensor bytes then (the peak was reset
// there); `random_init`: a preset (nothing read); `sharded`: model.sharded_load.
void log_sharded_load(const vlm::sharding::ShardedLoadStats& st, const vlm::sharding::MemoryReport& m,
                      const MemoryPlan& plan, int64_t rss_before_model, int64_t device_before,
                      vlm::sharding::ParallelDims& dims, bool random_init, bool sharded);

// Rank 0 (`main`): the unit table, parameter counts, the memory per rank and its plan
// (persistent + transient before activations), then the sharding notes as warnings.
void log_unit_table(const vlm::sharding::ShardedModel& sm, const MemoryPlan& plan, bool main);

// Rank 0: the data set, steps per epoch, the global batch and who shares a data-parallel
// rank's samples (a cp / tp group, the pipeline's stages), the steps, packing.
void log_data(const Recipe& recipe, const TrainData& data, int64_t steps_total, vlm::sharding::ParallelDims& dims);

// Rank 0: the pipeline's stages (dist.pp > 1: their layers, which holds the vision tower and
// the head; the unit table above is stage 0's).
void log_pipeline_stages(vlm::VisionLanguageModelImpl& model, vlm::sharding::ParallelDims& dims);

// Rank 0 (`main`): the memory plan of step 1 term by term (app/plan/step_memory.h), to read
// next to the step log's measured mem.
void log_step_memory_plan(const StepMemory& planned, bool main);

}  // namespace vlm::app

// Context parallelism (dist.cp, either mode) on the CPU: one rank of a cp group, launched with
// `vlmtrain launch --nproc-per-node CP --exec build/bench/context_parallel_bench --cp CP
// [--mode ulysses|ring] ...`
// (world = cp: one data-parallel group). Every rank trains on the same synthetic micro-batch
// (bench/synthetic_batch.h: one row of `text` tokens around one image of `image` merged
// tokens), DDP, fp32, AdamW; the first step is warm-up, then `reps` steps are measured.
// scripts/bench/context_parallel.py runs it over sequence lengths and cp and writes
// bench/RESULTS.md's context-parallel section.
//
//   vlmtrain launch --nproc-per-node 2 --exec build/bench/context_parallel_bench --cp 2 --text 4000
//
// Rank 0 prints one JSON line: cp, mode, seq_len, the measured peak of CPU tensor bytes over a step
// (vlm/runtime/tensor_memory.h, rank 0) and the step plan's (app/plan/step_memory.h with
// shape.cp), the step's wall seconds (median), the CPU seconds of a step summed over the
// ranks (getrusage: user + system, every thread), and rank 0's all-to-all bytes per step (ring:
// the hops, each an all-to-all with one non-empty split).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "app/plan/memory_plan.h"
#include "app/plan/step_memory.h"
#include "bench/synthetic_batch.h"
#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/model/meta_init.h"
#include "vlm/runtime/tensor_memory.h"

namespace {

int64_t arg(int argc, char** argv, const std::string& name, int64_t dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (name == argv[i]) return std::atoll(argv[i + 1]);
  return dflt;
}
std::string sarg(int argc, char** argv, const std::string& name, const std::string& dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (name == argv[i]) return argv[i + 1];
  return dflt;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  namespace sh = vlm::sharding;
  const int cp = static_cast<int>(arg(argc, argv, "--cp", 1));
  const int64_t text = arg(argc, argv, "--text", 2000), image = arg(argc, argv, "--image", 64);
  const int64_t reps = arg(argc, argv, "--reps", 3);
  const std::string preset = sarg(argc, argv, "--preset", "small");
  const std::string mode = sarg(argc, argv, "--mode", "ulysses");
  vlm::TensorMemoryMeter::install();
  sh::ParallelOptions po;
  po.device = "cpu";
  po.cp = cp;
  po.timeout = std::chrono::seconds(600);
  sh::ParallelDims dims = sh::ParallelDims::from_environment(po);

  const vlm::VlmConfig cfg = vlm::preset(preset);
  vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat32));
  vlm::materialize(*model, {torch::kCPU, torch::kFloat32, 5});
  sh::ShardingOptions so;
  so.default_policy = "ddp";
  so.cp_mode = mode;
  auto sm = sh::apply_policies(*model, so, dims);
  vlm::Batch batch = vlm::bench::synthetic_batch(cfg, 1, text, image, 7);
  batch.right_padded = true;
  const int64_t tokens = vlm::supervised_rows(batch.labels).size(0);

  const vlm::app::MemoryPlan plan =
      vlm::app::plan_memory(sm->unit_table(), dims.world_size(), torch::kFloat32, torch::kFloat32, false, 0);
  vlm::app::StepMemoryModel step_model(*model, plan, sm->unit_table(), torch::kFloat32, vlm::app::AttentionPath::cpu, 0);
  vlm::app::MicroBatchShape shape;
  shape.seq_len = batch.input_ids.size(1);
  shape.patches = batch.pixel_values.size(0);
  shape.loss_rows = tokens;
  shape.cp = cp;
  shape.cp_ring = mode == "ring";
  const double planned = step_model.step(shape, 1, 1).total();

  std::vector<double> walls, cpus;
  int64_t peak = 0;
  double a2a = 0;
  for (int64_t s = 0; s <= reps; ++s) {
    dims.reset_data_stats();
    vlm::TensorMemoryMeter::reset_peak();
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    sm->set_sync(true);
    auto out = model->forward(batch);
    (out.loss_sum / static_cast<double>(tokens)).backward();
    sm->finish_backward("bench");
    sm->optimizer().clip_grad_norm("bench");
    sm->optimizer().step();
    sm->optimizer().zero_grad();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    torch::Tensor c = torch::tensor({cpu_seconds() - c0}, torch::kFloat64);
    dims.control().all_reduce(c, sh::ReduceOp::kSum, "bench: cpu seconds");
    if (s == 0) continue;  // warm-up
    walls.push_back(wall);
    cpus.push_back(c.item<double>());
    peak = std::max(peak, vlm::TensorMemoryMeter::peak_bytes());
    a2a = dims.cp_comm().stats()[sh::OpKind::kAllToAll].logical_bytes;
  }
  std::sort(walls.begin(), walls.end());
  std::sort(cpus.begin(), cpus.end());
  if (dims.is_main()) {
    nlohmann::json j = {{"preset", preset},
                        {"cp", cp},
                        {"mode", cp > 1 ? mode : "-"},
                        {"seq_len", shape.seq_len},
                        {"threads", at::get_num_threads()},
                        {"measured_peak_bytes", peak},
                        {"planned_peak_bytes", planned},
                        {"step_s", walls[walls.size() / 2]},
                        {"cpu_s_all_ranks", cpus[cpus.size() / 2]},
                        {"all_to_all_bytes", a2a}};
    std::printf("%s\n", j.dump().c_str());
  }
  dims.control().barrier("bench: end");
  return 0;
}

// LoRA vs full fine-tuning, measured against each other in one process (world 1, CPU):
// step time, persistent sharding memory (ShardedModel::memory()), trainable parameters.
// Not run in CI.
//
//   lora_bench [--preset small] [--r 8] [--steps 5] [--warmup 2] [--threads 1]
//              [--samples 2] [--text 64] [--image-tokens 32] [--plan-world 8] [--json]
//
// Two copies of the preset, materialised from the same seed, each with its own ShardedModel:
//   full  every parameter trained (sharding.default = "ddp"; step_bench --mix ddp)
//   lora  recipes/ocr_qwen_lora.toml's shape: vision tower frozen, merger ddp, adapters of
//         rank --r (alpha 2r, dropout 0) on q/k/v/o and gate/up/down of every LLM layer with
//         the frozen base FSDP-sharded (strategy = "full_shard"; at world 1 nothing is
//         split), embedding / norm / head frozen
// The steps alternate between the two (full, lora, lora, full, ...) on one fixed batch (as
// step_bench: B samples of T text + K image tokens, half the text supervised), so both see
// the same machine load; the warm-up steps of each are discarded, step time is the median
// of the rest (wall and CPU s). Memory is what the ShardedModel holds (params + grads +
// optimizer state, bytes of this rank), next to the plan's formulas (memory_plan.h) at
// world 1 (a check: measured = plan) and at --plan-world N, where full fine-tuning is planned
// with every unit fsdp full_shard (ZeRO-3, how it would run at scale) and LoRA with its frozen
// base full_shard. Activations are not counted (both share one process: no peak RSS).
//
// Measured once at 40509f0 on the shared 2-core machine (load average 3.1-3.3, other
// engineers building), OMP_NUM_THREADS=1 lora_bench --steps 7 --warmup 2 (small preset, fp32,
// r 8, 2 samples x 98 tokens; docs/lora.md):
//          params      trainable   step s  CPU s  persistent MB (= plan w1)  plan w8 MB fp32 / bf16
//   full   41,000,448  41,000,448  0.776   0.761  820.0 (164 + 328 + 328)   82.0 / 92.3 (ZeRO-3)
//   lora   41,582,080   3,730,176  0.436   0.428  226.0 (166 + 30 + 30)     147.1 / 103.4
//   lora / full: step 0.56x, CPU 0.56x, persistent 0.276x, trainable 0.091x (581,632 adapter
//   params + the 3,148,544 of the merger); both started from loss 9.443758 at step 1.
// At world 8 the LoRA recipe holds more per rank than ZeRO-3 full fine-tuning (1.79x fp32):
// its frozen vision tower, embedding and ddp merger stay whole on every rank.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/lora_rules.h"
#include "sharding/parallel/lora.h"
#include "app/plan/memory_plan.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/runtime/host_malloc.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "bench/synthetic_batch.h"

namespace {

struct Options {
  std::string preset = "small";
  int64_t r = 8;
  int steps = 5, warmup = 2, threads = 1;
  int samples = 2, text = 64, image_tokens = 32;
  int plan_world = 8;
  bool json = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      VLM_CHECK(i + 1 < argc, "lora_bench: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--preset") o.preset = val();
    else if (a == "--r") o.r = std::stoll(val());
    else if (a == "--steps") o.steps = std::stoi(val());
    else if (a == "--warmup") o.warmup = std::stoi(val());
    else if (a == "--threads") o.threads = std::stoi(val());
    else if (a == "--samples") o.samples = std::stoi(val());
    else if (a == "--text") o.text = std::stoi(val());
    else if (a == "--image-tokens") o.image_tokens = std::stoi(val());
    else if (a == "--plan-world") o.plan_world = std::stoi(val());
    else if (a == "--json") o.json = true;
    else VLM_CHECK(false, "lora_bench: unknown option ", a, " (see the header of bench/lora_bench.cpp)");
  }
  VLM_CHECK(o.steps >= 1 && o.warmup >= 0 && o.samples >= 1 && o.text >= 2 && o.image_tokens >= 1 && o.r >= 1 &&
                o.plan_world >= 1,
            "lora_bench: bad sizes (steps, samples, r, plan-world >= 1; warmup >= 0; text >= 2)");
  return o;
}

vlm::sharding::ShardingOptions lora_bench_sharding(const Options& o, bool lora) {
  vlm::sharding::ShardingOptions s;
  s.optim.lr = 1e-4;
  s.optim.weight_decay = 0.01;
  if (!lora) return s;  // default ddp: everything trained
  vlm::bench::apply_lora_rules(s, o.r);
  return s;
}

// One rank's fixed batch, as step_bench builds it: [T/2 prompt] <vs> [K image] <ve> [T - T/2 answer].
vlm::Batch lora_bench_batch(const vlm::VlmConfig& c, const Options& o) {
  return vlm::bench::synthetic_batch(c, o.samples, o.text, o.image_tokens, 1234);
}

double lora_bench_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double lora_bench_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// One configuration: its model, sharding and the times of its measured steps.
struct Arm {
  std::string name;
  vlm::VisionLanguageModel model{nullptr};
  std::unique_ptr<vlm::sharding::ShardedModel> sm;
  std::vector<double> wall, cpu, loss;
  double first_loss = 0;  // step 1: equal for both (same init, B = 0 makes LoRA the base)
  int done = 0;
};

void lora_bench_step(Arm& a, const vlm::Batch& batch, int64_t supervised, vlm::sharding::Comm& comm, int warmup) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = lora_bench_cpu_s();
  const int64_t global = vlm::sharding::global_token_count(comm, supervised);
  a.sm->set_sync(true);
  vlm::ForwardOutput out = a.model->forward(batch);
  torch::Tensor loss = out.loss_sum / static_cast<double>(std::max<int64_t>(1, global));
  loss.backward();
  a.sm->finish_backward("lora_bench backward");
  a.sm->optimizer().clip_grad_norm("lora_bench grad norm");
  a.sm->optimizer().step(1.0, "lora_bench optimizer");
  a.sm->optimizer().zero_grad();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.done == 0) a.first_loss = loss.item<double>();
  if (a.done++ >= warmup) {
    a.wall.push_back(wall);
    a.cpu.push_back(lora_bench_cpu_s() - c0);
    a.loss.push_back(loss.item<double>());
  }
}

// `sharded_units`: the unit table planned at world N (full: the same model with every unit
// fsdp full_shard, as full fine-tuning would shard at scale; lora: its own table).
nlohmann::json lora_bench_report(const Arm& a, const std::vector<vlm::sharding::UnitPlan>& sharded_units,
                                 int plan_world) {
  using vlm::app::plan_memory;
  const vlm::sharding::MemoryReport m = a.sm->memory();
  const auto counts = vlm::sharding::count_params(a.sm->unit_table());
  int64_t adapters = 0;
  for (const auto& u : a.sm->unit_table())
    if (!u.adapter_of.empty()) adapters += u.numel;
  const auto p1 = plan_memory(a.sm->unit_table(), 1, torch::kFloat32);
  const auto pn = plan_memory(sharded_units, plan_world, torch::kFloat32);
  const auto pn_bf16 = plan_memory(sharded_units, plan_world, torch::kBFloat16);
  return {{"config", a.name},
          {"params", counts.total},
          {"trainable_params", counts.trainable},
          {"adapter_params", adapters},
          {"step_s", lora_bench_median(a.wall)},
          {"step_s_all", a.wall},
          {"cpu_s", lora_bench_median(a.cpu)},
          {"first_loss", a.first_loss},
          {"losses", a.loss},
          {"param_bytes", m.param_bytes},
          {"grad_bytes", m.grad_bytes},
          {"optim_bytes", m.optim_bytes},
          {"persistent_bytes", m.persistent()},
          {"plan_persistent_bytes_world1", p1.total.total()},
          {"plan_persistent_bytes_world_n", pn.total.total()},
          {"plan_persistent_bytes_world_n_bf16", pn_bf16.total.total()}};
}

}  // namespace

int main(int argc, char** argv) {
  vlm::tune_host_malloc();
  try {
    const Options o = parse(argc, argv);
    at::set_num_threads(o.threads);
    vlm::sharding::ParallelDims dims =
        vlm::sharding::ParallelDims::init(vlm::sharding::detect_dist_env({}), vlm::sharding::ParallelOptions{});
    VLM_CHECK(dims.world_size() == 1, "lora_bench runs as one process (world 1)");
    const vlm::VlmConfig cfg = vlm::preset(o.preset);
    std::vector<Arm> arms(2);
    for (int i = 0; i < 2; ++i) {
      const bool lora = i == 1;
      Arm& a = arms[i];
      a.name = lora ? "lora" : "full";
      a.model = vlm::VisionLanguageModel(cfg, torch::TensorOptions().device(torch::kMeta));
      vlm::materialize(*a.model, {torch::kCPU, torch::kFloat32, 7});
      a.model->train();
      a.sm = vlm::sharding::apply_policies(*a.model, lora_bench_sharding(o, lora), dims);
    }
    const vlm::Batch batch = lora_bench_batch(cfg, o);
    const int64_t supervised = o.samples * (o.text - o.text / 2 - 1);
    for (int s = 0; s < o.warmup + o.steps; ++s) {  // full, lora | lora, full | ...
      const bool lora_first = s % 2 == 1;
      lora_bench_step(arms[lora_first ? 1 : 0], batch, supervised, dims.comm(), o.warmup);
      lora_bench_step(arms[lora_first ? 0 : 1], batch, supervised, dims.comm(), o.warmup);
    }
    vlm::sharding::ShardingOptions fsdp_all = lora_bench_sharding(o, false);
    fsdp_all.default_policy = "fsdp";
    fsdp_all.default_strategy = "full_shard";
    vlm::VisionLanguageModel meta(cfg, torch::TensorOptions().device(torch::kMeta));
    const nlohmann::json full = lora_bench_report(arms[0], vlm::sharding::resolve_units(*meta, fsdp_all), o.plan_world);
    const nlohmann::json lora = lora_bench_report(arms[1], arms[1].sm->unit_table(), o.plan_world);
    auto ratio = [&](const char* k) { return lora.at(k).get<double>() / full.at(k).get<double>(); };
    nlohmann::json j = {{"preset", o.preset},
                        {"r", o.r},
                        {"threads", at::get_num_threads()},
                        {"samples", o.samples},
                        {"seq_len", o.text + o.image_tokens + 2},
                        {"steps", o.steps},
                        {"warmup", o.warmup},
                        {"plan_world", o.plan_world},
                        {"full", full},
                        {"lora", lora},
                        {"lora_over_full",
                         {{"step_s", ratio("step_s")},
                          {"cpu_s", ratio("cpu_s")},
                          {"persistent_bytes", ratio("persistent_bytes")},
                          {"plan_persistent_bytes_world_n", ratio("plan_persistent_bytes_world_n")},
                          {"plan_persistent_bytes_world_n_bf16", ratio("plan_persistent_bytes_world_n_bf16")},
                          {"trainable_params", ratio("trainable_params")}}}};
    if (o.json) {
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    std::printf("%s, fp32, %d thread(s), %d samples x %d tokens, median of %d steps after %d warm-up, "
                "interleaved; LoRA r %lld on q/k/v/o + gate/up/down\n",
                o.preset.c_str(), at::get_num_threads(), o.samples, o.text + o.image_tokens + 2, o.steps, o.warmup,
                static_cast<long long>(o.r));
    std::printf("%-6s %12s %12s %10s %9s %9s %13s %13s %13s\n", "", "params", "trainable", "adapters", "step s",
                "CPU s", "persistent MB", "plan w1 MB", ("plan w" + std::to_string(o.plan_world) + " MB").c_str());
    for (const auto* a : {&full, &lora})
      std::printf("%-6s %12lld %12lld %10lld %9.3f %9.3f %13.1f %13.1f %13.1f\n",
                  a->at("config").get<std::string>().c_str(), a->at("params").get<long long>(),
                  a->at("trainable_params").get<long long>(), a->at("adapter_params").get<long long>(),
                  a->at("step_s").get<double>(), a->at("cpu_s").get<double>(),
                  a->at("persistent_bytes").get<double>() / 1e6, a->at("plan_persistent_bytes_world1").get<double>() / 1e6,
                  a->at("plan_persistent_bytes_world_n").get<double>() / 1e6);
    std::printf("step-1 loss (same start): full %.6f, lora %.6f\n", full.at("first_loss").get<double>(),
                lora.at("first_loss").get<double>());
    std::printf("lora / full: step %.2fx (CPU %.2fx), persistent memory %.3fx (plan at world %d, full fine-tuning "
                "all full_shard: %.3fx fp32, %.3fx bf16), trainable params %.4fx\n",
                ratio("step_s"), ratio("cpu_s"), ratio("persistent_bytes"), o.plan_world,
                ratio("plan_persistent_bytes_world_n"), ratio("plan_persistent_bytes_world_n_bf16"),
                ratio("trainable_params"));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lora_bench: error: %s\n", e.what());
    return 1;
  }
}

// Training-step bench: model + policies + optimizer on a fixed synthetic batch (no data
// pipeline), timed per step, with the communication bytes per step held against the ring
// formulas. Not run in CI; scripts/bench.sh drives it (and scripts/gpu/run_bench.sh on CUDA).
//
//   ./bench/step_bench --preset small --mix ddp --world 2 --threads 1 --steps 6 --warmup 2
//
// --world N > 1 spawns N copies of itself with torchrun's environment (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT); rank 0 prints one JSON
// line (with --json) or a short text summary. Under a real launcher (RANK set) it runs
// as that rank directly.
//
// Batch per rank and step (same on every rank, seeded): --samples B samples, each
//   [--text T/2 prompt ids] <vision_start> [--image-tokens K image tokens] <vision_end>
//   [T - T/2 answer ids, supervised]                       -> sequence L = T + K + 2
// with one image per sample of grid (1, 2, 2K) patches = 4K patches [4K, 1176].
// Policy mixes (--mix), the recipe rows the trainer would apply:
//   ddp         everything ddp
//   frozen      visual.patch_embed|visual.blocks.* freeze, visual.merger ddp, the rest fsdp
//               (full_shard)
//   full_shard  everything fsdp full_shard
//   lora        recipes/ocr_qwen_lora.toml's shape (as bench/lora_bench): adapters of rank
//               --lora-r (default 8, alpha 2r, dropout 0) on q/k/v/o and gate/up/down of every
//               LLM layer, their frozen base fsdp full_shard, visual.merger ddp, the rest frozen
// --ckpt adds activation checkpointing on model.layers.* (checkpoint_match).
// FSDP and activation checkpointing run as the sharding engine runs them today; its notes
// (e.g. "fsdp units run as ddp no_shard") are printed in the result.
//
// Ring formulas (M = bytes of the trainable parameters in the reduce dtype, N ranks):
//   ddp:        all-reduce 2(N-1)/N x M per step
//   full_shard: all-gather (forward) + all-gather (backward) + reduce-scatter =
//               3(N-1)/N x M (M in param dtype for the gathers; equal for fp32)
// The bench reports the measured logical and wire bytes of the optimizer step's units
// and the step statistics (a few scalars), per step and rank, next to both formulas.
//
// FLOP convention for MFU (PaLM, REFERENCE.md): per LLM token 6 x P_trained(LLM) +
// 12 x layers x L x hidden (attention); per patch 6 x P_trained (vision blocks +
// patch_embed) + 12 x depth x patches_per_image x embed_dim, the merger per 4 patches;
// a frozen unit counts 2 x P (forward only). Recompute under checkpointing is not counted.
// Peak: --peak-tflops (per rank) or VLMTRAIN_PEAK_TFLOPS; MFU is omitted without one, and
// for --mix lora (its frozen base still runs the input-gradient matmuls; no convention here).
//
// --profile FILE: the measured steps run under the torch profiler (Kineto, CPU and CUDA
// activities), each inside a "vlmtrain_step" annotation; the Chrome trace goes to FILE
// (scripts/gpu/trace_summary.py reads it). Profiled step times are not the bench's times.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/plan/step_memory.h"
#include "bench/lora_rules.h"
#include "sharding/dist/comm.h"
#include "sharding/parallel/ddp.h"
#include "app/plan/memory_plan.h"
#include "sharding/dist/device_context.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/runtime_info.h"
#include "vlm/model/config.h"
#include "vlm/runtime/host_malloc.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "bench/synthetic_batch.h"

#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>

extern char** environ;

namespace {

using vlm::sharding::OpKind;

struct Options {
  std::string preset = "small";
  std::string mix = "ddp";  // ddp | frozen | full_shard | lora
  int64_t lora_r = 8;       // adapter rank of --mix lora
  bool ckpt = false;
  int world = 1;
  int threads = 0;          // intra-op threads per rank; 0 = cores / world
  int samples = 4;          // per rank and step
  int text = 96;            // text tokens per sample (half supervised)
  int image_tokens = 64;    // merged image tokens per sample
  int steps = 6;            // measured steps
  int warmup = 2;           // discarded steps
  std::string dtype = "fp32";   // fp32 | bf16 (param dtype; reduce stays fp32)
  std::string device = "cpu";   // cpu | cuda
  double peak_tflops = 0;
  bool json = false;
  std::string dump_config;  // write the preset's HF config.json here and exit
  std::string profile;      // Chrome trace of the measured steps (torch profiler)
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--preset small] [--mix ddp|frozen|full_shard|lora] [--lora-r R] [--ckpt] [--world N]\n"
               "          [--threads T] [--samples B] [--text T] [--image-tokens K] [--steps S]\n"
               "          [--warmup W] [--dtype fp32|bf16] [--device cpu|cuda] [--peak-tflops X] [--json]\n"
               "          [--profile TRACE.json] [--dump-config FILE]   (the preset's HF config.json, e.g. for\n"
               "          the HF timing script)\n",
               argv0);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (a == "--preset") o.preset = val();
    else if (a == "--mix") o.mix = val();
    else if (a == "--lora-r") o.lora_r = std::stoll(val());
    else if (a == "--profile") o.profile = val();
    else if (a == "--ckpt") o.ckpt = true;
    else if (a == "--world") o.world = std::stoi(val());
    else if (a == "--threads") o.threads = std::stoi(val());
    else if (a == "--samples") o.samples = std::stoi(val());
    else if (a == "--text") o.text = std::stoi(val());
    else if (a == "--image-tokens") o.image_tokens = std::stoi(val());
    else if (a == "--steps") o.steps = std::stoi(val());
    else if (a == "--warmup") o.warmup = std::stoi(val());
    else if (a == "--dtype") o.dtype = val();
    else if (a == "--device") o.device = val();
    else if (a == "--peak-tflops") o.peak_tflops = std::stod(val());
    else if (a == "--json") o.json = true;
    else if (a == "--dump-config") o.dump_config = val();
    else usage(argv[0]);
  }
  if (o.peak_tflops == 0 && std::getenv("VLMTRAIN_PEAK_TFLOPS") != nullptr)
    o.peak_tflops = std::atof(std::getenv("VLMTRAIN_PEAK_TFLOPS"));
  VLM_CHECK(o.mix == "ddp" || o.mix == "frozen" || o.mix == "full_shard" || o.mix == "lora",
            "--mix: expected ddp, frozen, full_shard or lora, got '", o.mix, "'");
  VLM_CHECK(o.lora_r >= 1, "--lora-r: expected >= 1, got ", o.lora_r);
  VLM_CHECK(o.world >= 1 && o.samples >= 1 && o.steps >= 1 && o.warmup >= 0 && o.text >= 2 && o.image_tokens >= 1,
            "bad sizes (world, samples, steps >= 1; warmup >= 0; text >= 2; image-tokens >= 1)");
  return o;
}

vlm::sharding::ShardingOptions sharding_for(const Options& o) {
  vlm::sharding::ShardingOptions s;
  if (o.mix == "ddp") {
    s.default_policy = "ddp";
  } else if (o.mix == "frozen") {
    s.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", ""}, {"visual.merger", "ddp", ""}};
    s.default_policy = "fsdp";
    s.default_strategy = "full_shard";
  } else if (o.mix == "lora") {
    vlm::bench::apply_lora_rules(s, o.lora_r);
  } else {
    s.default_policy = "fsdp";
    s.default_strategy = "full_shard";
  }
  if (o.ckpt) s.checkpoint_match = "model.layers.*";
  s.param_dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  s.reduce_dtype = torch::kFloat32;
  s.optim.lr = 1e-4;
  s.optim.weight_decay = 0.01;
  return s;
}

// The fixed batch of one rank (see the header comment); seeded by rank.
vlm::Batch make_batch(const vlm::VlmConfig& c, const Options& o, int rank, torch::Device dev, torch::Dtype dt) {
  vlm::Batch batch = vlm::bench::synthetic_batch(c, o.samples, o.text, o.image_tokens, 1234 + rank);
  batch.input_ids = batch.input_ids.to(dev);
  batch.labels = batch.labels.to(dev);
  batch.attention_mask = batch.attention_mask.to(dev);
  batch.pixel_values = batch.pixel_values.to(dev, dt);
  batch.image_grid_thw = batch.image_grid_thw.to(dev);
  return batch;
}

int64_t peak_rss() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// CPU seconds (user + system, all threads) this process has used: on a shared machine a
// step's CPU time moves less with other users' load than its wall time does.
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

void device_sync(torch::Device dev) {
  if (dev.is_cuda()) torch::cuda::synchronize(dev.index());
}

int64_t peak_device_bytes(torch::Device dev) {
  if (dev.is_cuda()) {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
    return s.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// Model FLOPs of one step on one rank (convention in the header comment).
double step_flops(const std::vector<vlm::sharding::UnitPlan>& units, const vlm::VlmConfig& c, const Options& o) {
  if (o.mix == "lora") return 0;  // no convention for a frozen base under trained adapters
  const double b = o.samples, k = o.image_tokens, l = o.text + o.image_tokens + 2;
  const double tokens = b * l, patches = b * 4 * k, per_image = 4 * k;
  double flops = 0;
  for (const auto& u : units) {
    // The embedding lookup costs nothing; a tied table stands for the head's matmul.
    if (u.path == "model.embed_tokens" && !c.tie_word_embeddings) continue;
    const double per = (u.trainable() ? 6.0 : 2.0) * static_cast<double>(u.numel);
    if (u.path.rfind("visual.merger", 0) == 0) flops += per * patches / 4;
    else if (u.path.rfind("visual.", 0) == 0) flops += per * patches;
    else flops += per * tokens;
  }
  // Attention scores and values: 12 x layers x context x width per token (6 x 2 x ctx x d).
  flops += 12.0 * c.text.num_hidden_layers * l * c.text.hidden_size * tokens;
  const bool vis_trained = o.mix != "frozen";
  flops += (vis_trained ? 12.0 : 4.0) * c.vision.depth * per_image * c.vision.embed_dim * patches;
  return flops;
}

// The trainer's planned peak of device memory for this step (app/plan/step_memory.h: the memory
// plan + the batch + the activations of the kernels that run), shown next to the measured one.
double planned_peak(vlm::VisionLanguageModelImpl& model, vlm::sharding::ShardedModel& sm, vlm::sharding::ParallelDims& dims,
                    const Options& o) {
  const vlm::sharding::ShardingOptions so = sharding_for(o);
  const vlm::app::MemoryPlan plan = vlm::app::plan_memory(
      sm.unit_table(), dims.world_size(), so.param_dtype, so.reduce_dtype, so.fsdp_accumulate_unsharded, 0);
  const auto path = dims.device().is_cuda() ? vlm::app::AttentionPath::cuda : vlm::app::AttentionPath::cpu;
  const vlm::app::StepMemoryModel step(model, plan, sm.unit_table(), so.param_dtype, path, 0);
  vlm::app::MicroBatchShape shape;
  shape.rows = o.samples;
  shape.seq_len = o.text + o.image_tokens + 2;
  shape.patches = int64_t{4} * o.image_tokens * o.samples;
  shape.loss_rows = o.samples * (o.text - o.text / 2 - 1);
  return step.step(shape, 1, o.samples).total();
}

// The torch profiler (Kineto) on the host and, on CUDA, the device (--profile).
void start_profiler(torch::Device dev) {
  namespace prof = torch::profiler::impl;
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (dev.is_cuda()) activities.insert(prof::ActivityType::CUDA);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

// ---------------------------------------------------------------- one rank
int run_rank(const Options& o) {
  vlm::sharding::ParallelOptions po;
  po.device = o.device;
  po.timeout = std::chrono::seconds(600);
  const auto env = vlm::sharding::detect_dist_env(vlm::sharding::process_env());
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(o.threads > 0 ? o.threads : std::max(1, hw / std::max(1, env.local_world_size)));
  vlm::sharding::ParallelDims dims = vlm::sharding::ParallelDims::init(env, po);
  vlm::sharding::Comm& comm = dims.comm();
  const int rank = dims.rank(), world = dims.world_size();
  const torch::Device dev = dims.device();
  const torch::Dtype dt = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;

  const vlm::VlmConfig cfg = vlm::preset(o.preset);
  vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*model, {dev, dt, 7});
  model->train();
  const int64_t n_params = vlm::count_parameters(*model);
  auto sm = vlm::sharding::apply_policies(*model, sharding_for(o), dims);
  int64_t trainable = 0;
  for (const auto& u : sm->unit_table())
    if (u.trainable()) trainable += u.numel;
  const vlm::Batch batch = make_batch(cfg, o, rank, dev, dt);
  const double planned = planned_peak(*model, *sm, dims, o);
  const int64_t local_sup = o.samples * (o.text - o.text / 2 - 1);  // shifted labels

  std::vector<double> times, cpu;
  vlm::sharding::CommStats at_warm;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) {
      comm.barrier("bench: end of warm-up");
      at_warm = dims.data_stats();
      if (!o.profile.empty()) start_profiler(dev);
    }
    device_sync(dev);
    std::optional<at::RecordFunction> step_scope;
    if (!o.profile.empty() && s >= o.warmup) {
      step_scope.emplace(at::RecordScope::USER_SCOPE);
      if (step_scope->isActive()) step_scope->before("vlmtrain_step");
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    const int64_t global_sup = vlm::sharding::global_token_count(comm, local_sup);
    sm->set_sync(true);
    vlm::ForwardOutput out = model->forward(batch);
    (out.loss_sum / static_cast<double>(std::max<int64_t>(1, global_sup))).backward();
    sm->finish_backward("bench backward");
    sm->optimizer().clip_grad_norm("bench grad norm");
    sm->optimizer().step(1.0, "bench optimizer");
    sm->optimizer().zero_grad();
    device_sync(dev);
    step_scope.reset();
    const double dt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= o.warmup) {
      times.push_back(dt_s);
      cpu.push_back(cpu_seconds() - c0);
    }
  }
  if (!o.profile.empty()) torch::autograd::profiler::disableProfiler()->save(o.profile);
  const vlm::sharding::CommStats end = dims.data_stats();  // every lane of the data plane
  const vlm::sharding::DeviceMemory blas = dims.device_context().memory();
  // Peak memory and the slowest rank's step times (ranks are in lockstep through the
  // collectives; the max guards against a rank that waits less).
  torch::Tensor agg = torch::tensor({static_cast<double>(peak_rss()), static_cast<double>(peak_device_bytes(dev))},
                                    torch::kFloat64);
  comm.all_reduce(agg, vlm::sharding::ReduceOp::kMax, "bench: peak memory");
  torch::Tensor tt = torch::tensor(times, torch::kFloat64);
  comm.all_reduce(tt, vlm::sharding::ReduceOp::kMax, "bench: step times");
  times.assign(tt.data_ptr<double>(), tt.data_ptr<double>() + tt.numel());
  torch::Tensor tc = torch::tensor(cpu, torch::kFloat64);  // summed over ranks
  comm.all_reduce(tc, vlm::sharding::ReduceOp::kSum, "bench: step cpu times");
  cpu.assign(tc.data_ptr<double>(), tc.data_ptr<double>() + tc.numel());
  comm.barrier("bench: end");
  if (rank != 0) return 0;

  const double n = world, steps = o.steps;
  auto per_step = [&](OpKind k, bool wire) {
    const auto& a = at_warm[k];
    const auto& b = end[k];
    return ((wire ? b.wire_bytes : b.logical_bytes) - (wire ? a.wire_bytes : a.logical_bytes)) / steps;
  };
  auto wait_per_step = [&](OpKind k) { return (end[k].wait_s - at_warm[k].wait_s) / steps; };
  double logical = 0, wire = 0;
  for (int k = 0; k < vlm::sharding::kNumOpKinds; ++k) {
    logical += per_step(static_cast<OpKind>(k), false);
    wire += per_step(static_cast<OpKind>(k), true);
  }
  const double m_bytes = 4.0 * static_cast<double>(trainable);  // fp32 reduce dtype
  const double step_s = median(times);
  const double l = o.text + o.image_tokens + 2;
  const double flops = step_flops(sm->unit_table(), cfg, o);
  nlohmann::json j = {
      {"impl", "vlmtrain"},
      {"preset", o.preset},
      {"mix", o.mix},
      {"lora_r", o.mix == "lora" ? o.lora_r : 0},
      {"ckpt", o.ckpt},
      {"world", world},
      {"threads_per_rank", at::get_num_threads()},
      {"device", dev.str()},
      {"dtype", o.dtype},
      {"torch", vlm::torch_version()},
      {"params", n_params},
      {"trainable_params", trainable},
      {"samples_per_rank", o.samples},
      {"seq_len", l},
      {"image_tokens", o.image_tokens},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"step_s", step_s},
      {"step_s_all", times},
      {"cpu_s_per_rank", median(cpu) / world},  // CPU seconds per step, mean over ranks
      {"tokens_per_s", world * o.samples * l / step_s},
      {"images_per_s", world * o.samples / step_s},
      {"peak_rss_bytes", agg[0].item<double>()},
      {"peak_device_bytes", agg[1].item<double>()},
      {"planned_peak_bytes", planned},  // rank 0's plan (app/plan/step_memory.h)
      {"blas_workspaces", blas.blas_workspaces},  // rank 0's cuBLAS workspaces (CUDA; 0 on the CPU)
      {"blas_workspace_bytes", blas.blas_workspace_bytes},
      {"flops_per_rank_step", flops},
      {"mfu", o.peak_tflops > 0 ? flops / step_s / (o.peak_tflops * 1e12) : 0.0},
      {"mfu_convention", "PaLM: 6P trained / 2P frozen per token or patch + 12*layers*ctx*width attention; no recompute"},
      {"comm_logical_bytes_per_step", logical},
      {"comm_wire_bytes_per_step", wire},
      {"comm_all_reduce_bytes_per_step", per_step(OpKind::kAllReduce, false)},
      {"comm_all_gather_bytes_per_step", per_step(OpKind::kAllGather, false)},
      {"comm_reduce_scatter_bytes_per_step", per_step(OpKind::kReduceScatter, false)},
      {"comm_wait_s_per_step", (end.wait_s() - at_warm.wait_s()) / steps},  // rank 0's exposed comm
      {"comm_wait_s_per_step_by_op",
       {{"all_reduce", wait_per_step(OpKind::kAllReduce)},
        {"all_gather", wait_per_step(OpKind::kAllGather)},
        {"reduce_scatter", wait_per_step(OpKind::kReduceScatter)}}},
      {"trainable_bytes_fp32", m_bytes},
      {"ring_ddp_bytes", 2 * (n - 1) / n * m_bytes},
      {"ring_full_shard_bytes", 3 * (n - 1) / n * m_bytes},
      {"host_malloc", vlm::host_malloc_setting()},
      {"transport", comm.transport()},
      {"notes", sm->notes()},
  };
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s %s%s world %d: step %.3f s (median of %d; %.3f CPU s per rank), %.0f tokens/s, %.1f images/s, "
                "peak RSS %.0f MB\n",
                o.preset.c_str(), o.mix.c_str(), o.ckpt ? "+ckpt" : "", world, step_s, o.steps, median(cpu) / world,
                j["tokens_per_s"].get<double>(), j["images_per_s"].get<double>(), agg[0].item<double>() / 1e6);
    std::printf("comm per step and rank: %.2f MB logical, %.2f MB wire; ring ddp %.2f MB, full_shard %.2f MB\n",
                logical / 1e6, wire / 1e6, 2 * (n - 1) / n * m_bytes / 1e6, 3 * (n - 1) / n * m_bytes / 1e6);
    for (const auto& note : sm->notes()) std::printf("note: %s\n", note.c_str());
  }
  std::fflush(stdout);
  return 0;
}

// ---------------------------------------------------------------- launcher
int free_port() {
  // The kernel picks a free port for a bound socket; close it and hope it stays free (as
  // torchrun does); rank 0 reports a taken port clearly.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  VLM_CHECK(fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
            "cannot pick a free port on 127.0.0.1");
  ::close(fd);
  return ntohs(addr.sin_port);
}

int launch(int world, char** argv) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  VLM_CHECK(n > 0, "readlink(/proc/self/exe) failed");
  self[n] = 0;
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (const std::string& kv :
         {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world), "LOCAL_RANK=" + std::to_string(r),
          "LOCAL_WORLD_SIZE=" + std::to_string(world), std::string("GROUP_RANK=0"),
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port)})
      env.push_back(kv);
    std::vector<char*> cenv;
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    argv[0] = self;
    const pid_t pid = ::fork();
    VLM_CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
      if (r != 0) {  // only rank 0 reports; the others' errors still go to stderr
        const int fd = ::open("/dev/null", O_WRONLY);
        ::dup2(fd, 1);
      }
      ::execve(self, argv, cenv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && rc == 0) {
      rc = code;
      for (pid_t q : pids)
        if (q != p) ::kill(q, SIGTERM);  // a failed rank leaves the others waiting
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  vlm::tune_host_malloc();  // as vlmtrain does (VLMTRAIN_HOST_MALLOC=system for glibc's defaults)
  try {
    const Options o = parse(argc, argv);
    if (!o.dump_config.empty()) {
      std::FILE* f = std::fopen(o.dump_config.c_str(), "w");
      VLM_CHECK(f != nullptr, "cannot write ", o.dump_config);
      std::fprintf(f, "%s\n", vlm::to_hf_json(vlm::preset(o.preset)).dump(2).c_str());
      std::fclose(f);
      return 0;
    }
    if (o.world > 1 && std::getenv("RANK") == nullptr) return launch(o.world, argv);
    return run_rank(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_bench: error: %s\n", e.what());
    return 1;
  }
}

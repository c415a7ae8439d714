// FLOPs of a training step and the device's peak FLOP/s (see flop_model.h).
#include "app/plan/flop_model.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include <ATen/cuda/CUDAContext.h>

#include <algorithm>

#include "vlm/runtime/check.h"

namespace vlm::app {

namespace {
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// The parameters a token computes with: a sparse layer's fused experts (`*.mlp.experts.*`,
// [held, ...]) count top-k experts' worth, not all of them (nor only the held slice under
// expert parallelism); everything else (the router included) counts whole.
double active_numel(const vlm::sharding::UnitPlan& u, const vlm::TextConfig& t) {
  double n = static_cast<double>(u.numel);
  for (const auto& p : u.params) {
    if (p.name.find(".mlp.experts.") == std::string::npos || p.param.dim() != 3 || p.param.size(0) == 0) continue;
    const double per_expert = static_cast<double>(p.param.numel() / p.param.size(0));
    n += per_expert * static_cast<double>(t.num_experts_per_tok) - static_cast<double>(p.param.numel());
  }
  return n;
}
}  // namespace

FlopModel::FlopModel(const std::vector<vlm::sharding::UnitPlan>& units, const vlm::VlmConfig& cfg)
    : merge_unit_(cfg.vision.merge_unit()) {
  for (const auto& u : units) {
    // Trained: forward + both backward matmuls (6P). Frozen: forward only (2P), except a
    // LoRA base, whose backward computes the input gradient for the adapters below (4P).
    const double f = u.trainable() ? 6.0 : u.has_adapters ? 4.0 : 2.0;
    const double n = active_numel(u, cfg.text);
    const std::string& path = u.adapter_of.empty() ? u.path : u.adapter_of;
    if (path == "visual.merger" || starts_with(path, "visual.deepstack_merger_list.")) {
      per_merged_patch_ += f * n;  // Qwen3-VL's DeepStack mergers also see merged tokens
    } else if (starts_with(path, "visual.")) {
      per_patch_ += f * n;
    } else if (path == "model.embed_tokens") {
      if (!u.aliases.empty())  // tied head: the embedding matrix is also the head's weight
        per_token_ += f * static_cast<double>(cfg.text.vocab_size * cfg.text.hidden_size);
    } else {
      per_token_ += f * n;
    }
    // Gated DeltaNet layers (Qwen3.5): the chunked rule's own matmuls, per token and value
    // head (chunk c = 64): scores q k^T and (beta k) k^T, the UT solves, the intra-chunk
    // product, and the state's three products (read twice, write once). Trained: forward +
    // backward (3x); frozen: the forward (and the input gradient through it, not counted).
    if (starts_with(path, "model.layers.") && u.adapter_of.empty() &&
        path.find('.', std::string("model.layers.").size()) == std::string::npos) {
      const int64_t layer = std::atoll(path.c_str() + std::string("model.layers.").size());
      const auto& t = cfg.text;
      if (layer < t.num_hidden_layers && t.mixer(layer) == vlm::MixerKind::linear_attention) {
        const double c = 64, dk = static_cast<double>(t.linear_key_head_dim);
        const double dv = static_cast<double>(t.linear_value_head_dim);
        const double core = static_cast<double>(t.linear_num_value_heads) *
                            (4 * c * dk + c * (dk + dv) + 2 * c * dv + 6 * dk * dv);
        per_token_ += (u.trainable() ? 3.0 : 1.0) * core;
      }
    }
  }
}

double FlopModel::flops(int64_t llm_tokens, int64_t patches) const {
  return per_token_ * static_cast<double>(llm_tokens) + per_patch_ * static_cast<double>(patches) +
         per_merged_patch_ * static_cast<double>(patches) / static_cast<double>(merge_unit_);
}

double gpu_peak_tflops(const std::string& name, torch::Dtype dtype) {
  struct Row {
    const char* match;  // substrings of the device name, all present ("|"-separated)
    double half;        // bf16 / fp16 dense tensor-core TFLOP/s
    double fp32;        // fp32 CUDA-core TFLOP/s
  };
  // NVIDIA data sheets; rows tried in order (the more specific first).
  static const Row rows[] = {
      {"H100|PCIe", 756.5, 51.2}, {"H100|NVL", 835.5, 60.0}, {"H100", 989.4, 66.9},  // SXM5
      {"H200|NVL", 835.5, 60.0},  {"H200", 989.4, 66.9},
      {"A100", 312.0, 19.5},      {"B200", 2250.0, 75.0},    {"L40S", 362.05, 91.6},
  };
  const bool half = dtype == torch::kBFloat16 || dtype == torch::kHalf;
  for (const Row& r : rows) {
    bool all = true;
    std::string m = r.match;
    for (size_t a = 0; a <= m.size();) {
      const size_t b = std::min(m.find('|', a), m.size());
      if (name.find(m.substr(a, b - a)) == std::string::npos) all = false;
      a = b + 1;
    }
    if (all) return half ? r.half : (dtype == torch::kFloat32 ? r.fp32 : 0.0);
  }
  return 0;
}

double peak_flops_per_rank(torch::Device device, torch::Dtype dtype, std::string* how) {
  if (const char* env = std::getenv("VLMTRAIN_PEAK_TFLOPS"); env != nullptr && *env != '\0') {
    const double v = std::atof(env);
    VLM_CHECK(v > 0, "VLMTRAIN_PEAK_TFLOPS: expected a positive number of TFLOP/s, got '", env, "'");
    if (how) *how = vlm::str("VLMTRAIN_PEAK_TFLOPS = ", v);
    return v * 1e12;
  }
  if (device.is_cuda()) {
    const std::string name = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->name;
    const double t = gpu_peak_tflops(name, dtype);
    if (how)
      *how = t > 0 ? vlm::str(name, " data-sheet dense ", c10::toString(dtype), " peak ", t,
                              " TFLOP/s (set VLMTRAIN_PEAK_TFLOPS to override)")
                   : vlm::str(name, ": peak not in vlmtrain's table (set VLMTRAIN_PEAK_TFLOPS; MFU not reported)");
    return t * 1e12;
  }
  // CPU: the theoretical fp32 peak of the cores this rank computes on (its intra-op
  // threads): cores x clock x FLOPs per cycle (AVX-512: 2 FMA x 16 lanes x 2 = 64;
  // AVX2 + FMA: 32; else 8), from /proc/cpuinfo.
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  double mhz = 0;
  int per_cycle = 8;
  while (std::getline(in, line)) {
    if (mhz == 0 && line.rfind("cpu MHz", 0) == 0) mhz = std::atof(line.substr(line.find(':') + 1).c_str());
    if (line.rfind("flags", 0) == 0) {
      if (line.find(" avx512f") != std::string::npos) per_cycle = 64;
      else if (line.find(" avx2") != std::string::npos && line.find(" fma") != std::string::npos) per_cycle = 32;
      break;
    }
  }
  if (mhz <= 0) mhz = 2000;  // cpuinfo without a clock (some VMs): a conservative guess
  const int threads = at::get_num_threads();
  const double peak = threads * mhz * 1e6 * per_cycle;
  if (how)
    *how = vlm::str("theoretical fp32 peak of ", threads, " core(s) x ", mhz / 1000, " GHz x ", per_cycle,
                    " FLOP/cycle = ", peak / 1e9, " GFLOP/s (set VLMTRAIN_PEAK_TFLOPS to override)");
  return peak;
}

}  // namespace vlm::app

// Memory and time of the training loss: full logits (logits = h W^T in full, upcast,
// cross_entropy, backward) against vlmtrain's chunked linear + cross-entropy
// (vlm/model/chunked_cross_entropy.h), forward + backward, one process per mode so that each
// peak RSS is its own.
//
//   loss_memory_bench --mode full|chunked [--rows 2048] [--dim 1536] [--vocab 151936]
//                     [--dtype fp32|bf16] [--chunk-mib 256]
// Prints one JSON line: mode, shapes, seconds, peak_rss_bytes, rss_before_bytes (after the
// inputs and weight exist), loss. scripts/bench.sh runs both modes and reports the ratio.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "vlm/runtime/process_memory.h"
#include "vlm/model/chunked_cross_entropy.h"

namespace {
const char* arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = arg(argc, argv, "--mode", "chunked");
  const int64_t n = std::atoll(arg(argc, argv, "--rows", "2048"));
  const int64_t d = std::atoll(arg(argc, argv, "--dim", "1536"));
  const int64_t v = std::atoll(arg(argc, argv, "--vocab", "151936"));
  const std::string dt_name = arg(argc, argv, "--dtype", "fp32");
  const int64_t chunk_mib = std::atoll(arg(argc, argv, "--chunk-mib", "256"));
  if (mode != "full" && mode != "chunked") {
    std::fprintf(stderr, "loss_memory_bench: --mode must be full or chunked, got %s\n", mode.c_str());
    return 2;
  }
  const auto dt = dt_name == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  torch::manual_seed(0);
  auto h = (torch::randn({n, d}) * 0.5).to(dt).requires_grad_(true);
  auto w = (torch::randn({v, d}) * 0.02).to(dt).requires_grad_(true);
  auto labels = torch::randint(0, v, {n}, torch::kInt64);
  const int64_t before = vlm::peak_rss_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor loss;
  if (mode == "full") {
    auto logits = torch::matmul(h, w.t()).to(torch::kFloat32);  // [N, V]
    loss = torch::nn::functional::cross_entropy(
        logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  } else {
    loss = vlm::chunked_linear_cross_entropy(h, w, labels, vlm::cross_entropy_chunk_rows(v, chunk_mib << 20));
  }
  loss.backward();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json j = {{"mode", mode},   {"rows", n},          {"dim", d},
                      {"vocab", v},     {"dtype", dt_name},   {"seconds", s},
                      {"peak_rss_bytes", vlm::peak_rss_bytes()}, {"rss_before_bytes", before},
                      {"loss", loss.item<double>()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

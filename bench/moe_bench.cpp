// One sparse MoE block (vlm/model/moe.h: router, top-k, sorted rows, one GEMM pair per
// non-empty expert, weighted index_add; optional shared expert), forward + backward on the
// CPU in fp32, timed per repetition (the first is warm-up and left out).
// scripts/bench_hf_moe.py runs it interleaved with transformers' block at the same shapes
// and threads.
//
//   build/bench/moe_bench --hidden 2048 --experts 128 --top-k 8 --inter 768 --shared 0 --len 2048 --reps 5
//
// Prints one JSON line: {"impl": "vlmtrain", "shape": {...}, "threads", "times_s": [...]}.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/moe.h"

namespace {

int64_t arg(int argc, char** argv, const std::string& name, int64_t dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (name == argv[i]) return std::atoll(argv[i + 1]);
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  vlm::TextConfig t;
  t.hidden_size = arg(argc, argv, "--hidden", 2048);
  t.num_experts = arg(argc, argv, "--experts", 128);
  t.num_experts_per_tok = arg(argc, argv, "--top-k", 8);
  t.moe_intermediate_size = arg(argc, argv, "--inter", 768);
  t.shared_expert_intermediate_size = arg(argc, argv, "--shared", 0);
  const int64_t len = arg(argc, argv, "--len", 2048), batch = arg(argc, argv, "--batch", 1);
  const int64_t reps = arg(argc, argv, "--reps", 5);
  torch::manual_seed(0);
  vlm::SparseMoeBlock m(t, torch::TensorOptions().device(torch::kMeta));
  // std 0.02 everywhere: the router's logits spread the tokens over the experts.
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 1, 0.02});
  auto x = torch::randn({batch, len, t.hidden_size}).requires_grad_(true);
  auto w = torch::randn({batch, len, t.hidden_size});
  std::vector<double> times;
  for (int64_t r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    (m(x, nullptr) * w).sum().backward();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) times.push_back(s);
    m->zero_grad();
    x.mutable_grad() = torch::Tensor();
  }
  std::printf("{\"impl\": \"vlmtrain\", \"shape\": {\"hidden\": %lld, \"experts\": %lld, \"top_k\": %lld, "
              "\"inter\": %lld, \"shared\": %lld, \"len\": %lld, \"batch\": %lld}, \"threads\": %d, \"times_s\": [",
              static_cast<long long>(t.hidden_size), static_cast<long long>(t.num_experts),
              static_cast<long long>(t.num_experts_per_tok), static_cast<long long>(t.moe_intermediate_size),
              static_cast<long long>(t.shared_expert_intermediate_size), static_cast<long long>(len),
              static_cast<long long>(batch), at::get_num_threads());
  for (size_t i = 0; i < times.size(); ++i) std::printf("%s%.6f", i ? ", " : "", times[i]);
  std::printf("]}\n");
  return 0;
}

// One Gated DeltaNet layer (vlm/model/gated_delta_net.h), forward + backward on the CPU in
// fp32, timed per repetition (the first is warm-up and left out). scripts/bench_hf_gdn.py
// runs it interleaved with HF's torch implementation at the same shapes and threads.
//
//   build/bench/gdn_bench --hidden 1024 --k-heads 16 --v-heads 16 --head-dim 128 --len 1024 --reps 5
//
// Prints one JSON line: {"impl": "vlmtrain", "shape": {...}, "threads", "times_s": [...]}.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "vlm/model/config.h"
#include "vlm/model/gated_delta_net.h"
#include "vlm/model/meta_init.h"

namespace {

int64_t arg(int argc, char** argv, const std::string& name, int64_t dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (name == argv[i]) return std::atoll(argv[i + 1]);
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  vlm::TextConfig t;
  t.hidden_size = arg(argc, argv, "--hidden", 1024);
  t.linear_num_key_heads = arg(argc, argv, "--k-heads", 16);
  t.linear_num_value_heads = arg(argc, argv, "--v-heads", 16);
  t.linear_key_head_dim = t.linear_value_head_dim = arg(argc, argv, "--head-dim", 128);
  t.linear_conv_kernel_dim = 4;
  const int64_t len = arg(argc, argv, "--len", 1024), batch = arg(argc, argv, "--batch", 1);
  const int64_t reps = arg(argc, argv, "--reps", 5);
  torch::manual_seed(0);
  vlm::GatedDeltaNet m(t, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 1, 0.02});
  auto x = torch::randn({batch, len, t.hidden_size}).requires_grad_(true);
  auto w = torch::randn({batch, len, t.hidden_size});
  std::vector<double> times;
  for (int64_t r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto y = m(x, torch::Tensor(), nullptr);
    (y * w).sum().backward();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) times.push_back(s);
    m->zero_grad();
    x.mutable_grad() = torch::Tensor();
  }
  std::printf("{\"impl\": \"vlmtrain\", \"shape\": {\"hidden\": %lld, \"k_heads\": %lld, \"v_heads\": %lld, "
              "\"head_dim\": %lld, \"len\": %lld, \"batch\": %lld}, \"threads\": %d, \"times_s\": [",
              static_cast<long long>(t.hidden_size), static_cast<long long>(t.linear_num_key_heads),
              static_cast<long long>(t.linear_num_value_heads), static_cast<long long>(t.linear_key_head_dim),
              static_cast<long long>(len), static_cast<long long>(batch), at::get_num_threads());
  for (size_t i = 0; i < times.size(); ++i) std::printf("%s%.6f", i ? ", " : "", times[i]);
  std::printf("]}\n");
  return 0;
}

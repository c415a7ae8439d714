// Shared by the DDP engine tests (ddp_dist_test.cpp, ddp_bf16_dist_test.cpp): the tiny model,
// deterministic equal-length image samples, the policy options of the two configurations
// ('a': everything ddp; 'b': frozen vision tower, ddp merger, ZeRO-1 LLM) and the worker's
// process set-up.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <vector>

#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/policy.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace ddp_testing {

using vlm::sharding::ParallelDims;
using vlm::sharding::ParallelOptions;
using vlm::sharding::ShardingOptions;

constexpr int kSamples = 6;
constexpr int kSteps = 5;
constexpr double kLr = 1e-4, kMergerLr = 2e-4, kWd = 0.1, kClip = 1.0;

inline vlm::VisionLanguageModel make_model(torch::Dtype dtype = torch::kFloat32) {
  vlm::VisionLanguageModel m(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, dtype, 7});
  return m;
}

struct Sample {
  std::vector<int64_t> ids, labels;
  torch::Tensor pixels;  // [16, 1176]
  std::vector<int64_t> grid;
};

// Deterministic sample `i` of step `step` (same on every rank).
inline Sample make_sample(const vlm::VlmConfig& c, int step, int i) {
  torch::manual_seed(1000 * step + i);
  Sample s;
  auto text = torch::randint(10, 1000, {11}, torch::kInt64);
  for (int k = 0; k < 5; ++k) s.ids.push_back(text[k].item<int64_t>());
  s.ids.push_back(c.vision_start_token_id);
  for (int k = 0; k < 4; ++k) s.ids.push_back(c.image_token_id);
  s.ids.push_back(c.vision_end_token_id);
  s.labels.assign(s.ids.size(), -100);
  for (int k = 5; k < 11; ++k) {
    s.ids.push_back(text[k].item<int64_t>());
    s.labels.push_back(text[k].item<int64_t>());
  }
  s.pixels = torch::randn({16, c.vision.patch_dim()});
  s.grid = (i % 2 == 0) ? std::vector<int64_t>{1, 4, 4} : std::vector<int64_t>{1, 2, 8};
  return s;
}

// Equal-length samples -> one Batch without padding.
inline vlm::Batch pack(const std::vector<Sample>& samples, torch::Dtype pixel_dtype = torch::kFloat32) {
  const int64_t b = static_cast<int64_t>(samples.size()), l = static_cast<int64_t>(samples[0].ids.size());
  vlm::Batch batch;
  std::vector<int64_t> ids, labels, grid;
  std::vector<torch::Tensor> pix;
  for (const auto& s : samples) {
    ids.insert(ids.end(), s.ids.begin(), s.ids.end());
    labels.insert(labels.end(), s.labels.begin(), s.labels.end());
    grid.insert(grid.end(), s.grid.begin(), s.grid.end());
    pix.push_back(s.pixels);
  }
  batch.input_ids = torch::tensor(ids, torch::kInt64).view({b, l});
  batch.labels = torch::tensor(labels, torch::kInt64).view({b, l});
  batch.pixel_values = torch::cat(pix).to(pixel_dtype);
  batch.image_grid_thw = torch::tensor(grid, torch::kInt64).view({b, 3});
  return batch;
}

inline bool no_decay(const std::string& n) {
  auto ends = [&](const std::string& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  return ends(".bias") || (n.find("norm") != std::string::npos && ends(".weight")) || ends("ln_q.weight");
}

inline bool frozen_in(char config, const std::string& name) {
  return config == 'b' && (name.rfind("visual.patch_embed.", 0) == 0 || name.rfind("visual.blocks.", 0) == 0);
}

inline ShardingOptions options(char config) {
  ShardingOptions o;
  if (config == 'b') {
    o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", ""},
               {"visual.merger", "ddp", ""},
               {"model.*|lm_head", "ddp", "shard_optimizer"}};
  }
  o.ddp_bucket_mb = 0.05;
  o.optim.lr = kLr;
  o.optim.weight_decay = kWd;
  o.optim.grad_clip = kClip;
  o.optim.groups = {{"visual.merger", kMergerLr, std::nullopt}};
  return o;
}

inline ParallelDims init_ddp_worker() {
  ParallelOptions o;
  o.timeout = std::chrono::seconds(120);
  o.device = "cpu";
  return ParallelDims::init(vlm::sharding::detect_dist_env(vlm::sharding::process_env()), o);
}

}  // namespace ddp_testing

// Padding-free packing bench (issue #27): tokens/s of forward + backward and the padding
// fraction, padded rows vs packed rows, on a synthetic OCR-like set whose sample lengths
// spread log-uniformly over [--min-len, --max-len] (default 20 .. 2000 tokens). Each sample
// is one image (--image-share of its tokens, default 0.4, a near-square grid; 0 = text
// only) plus text, the answer half of
// the text supervised. Both modes run the same samples per step (the step plan of
// collate/, world 1, batch.max_tokens = --max-tokens), interleaved step by step; tokens/s
// counts real tokens only (padding excluded). CPU, fp32. Not run in CI.
//
//   ./bench/packing_bench --preset tiny --samples 16 --steps 4 --warmup 1 --threads 2 [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "collate/micro_batch.h"
#include "collate/step_plan.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace {

struct Args {
  std::string preset = "tiny";
  int64_t samples = 16, steps = 4, warmup = 1, threads = 2, min_len = 20, max_len = 2000, max_tokens = 4096;
  double image_share = 0.4;
  bool json = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("packing_bench: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--preset") a.preset = next();
    else if (k == "--samples") a.samples = std::stoll(next());
    else if (k == "--steps") a.steps = std::stoll(next());
    else if (k == "--warmup") a.warmup = std::stoll(next());
    else if (k == "--threads") a.threads = std::stoll(next());
    else if (k == "--min-len") a.min_len = std::stoll(next());
    else if (k == "--max-len") a.max_len = std::stoll(next());
    else if (k == "--max-tokens") a.max_tokens = std::stoll(next());
    else if (k == "--image-share") a.image_share = std::stod(next());
    else if (k == "--json") a.json = true;
    else throw std::runtime_error("packing_bench: unknown option " + k + " (see the header of bench/packing_bench.cpp)");
  }
  return a;
}

// One OCR-like sample of about `len` tokens: text, <vision_start>, a (1, 2a, 2b)-patch image
// (a*b merged tokens, `share` of len), <vision_end>, answer text (supervised); share 0: text only.
vlm::TokenizedSample ocr_sample(const vlm::VlmConfig& cfg, std::mt19937_64& rng, int64_t index, int64_t len,
                                double share) {
  const bool image = share > 0;
  const int64_t want = std::max<int64_t>(4, static_cast<int64_t>(static_cast<double>(len) * share));
  const int64_t a = std::max<int64_t>(1, static_cast<int64_t>(std::sqrt(static_cast<double>(want))));
  const int64_t b = std::max<int64_t>(1, want / a);
  const int64_t text = std::max<int64_t>(4, image ? len - a * b - 2 : len);
  vlm::TokenizedSample s;
  s.index = index;
  auto word = [&] { return 10 + static_cast<int64_t>(rng() % 1000); };
  for (int64_t i = 0; i < text / 2; ++i) s.input_ids.push_back(word());
  if (image) {
    s.input_ids.push_back(cfg.vision_start_token_id);
    for (int64_t i = 0; i < a * b; ++i) s.input_ids.push_back(cfg.image_token_id);
    s.input_ids.push_back(cfg.vision_end_token_id);
  }
  const size_t answer_from = s.input_ids.size();
  for (int64_t i = 0; i < text - text / 2; ++i) s.input_ids.push_back(word());
  s.labels.assign(s.input_ids.size(), -100);
  for (size_t i = answer_from; i < s.input_ids.size(); ++i) s.labels[i] = s.input_ids[i];
  if (!image) return s;
  const int64_t m = cfg.vision.spatial_merge_size;
  s.grid_thw.push_back({1, m * a, m * b});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(rng());
  s.pixel_values = torch::randn({m * a * m * b, cfg.vision.patch_dim()}, gen);
  return s;
}

// The step plan's view of a sample: its image at exactly its grid's size (factor = patch x
// merge, m = merge).
vlm::collate::SampleCost sample_cost_of(const vlm::TokenizedSample& s, int64_t factor, int64_t m) {
  vlm::collate::SampleCost c;
  c.index = s.index;
  c.text_tokens = static_cast<int64_t>(s.input_ids.size());
  if (s.grid_thw.empty()) return c;
  const auto& g = s.grid_thw.at(0);
  c.images.push_back({g[1] / m * factor, g[2] / m * factor});
  c.text_tokens = static_cast<int64_t>(s.input_ids.size()) - g[1] * g[2] / (m * m);
  return c;
}

struct ModeStats {
  double seconds = 0;
  int64_t real_tokens = 0, steps = 0, micro_batches = 0;
  vlm::collate::PaddingCount padding;
};

// Forward + backward of every micro-batch of one planned step; returns seconds.
double run_step(vlm::VisionLanguageModel& model, const std::vector<vlm::collate::MicroBatch>& mbs) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  for (const auto& mb : mbs) model->forward(mb.batch).loss_sum.backward();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse_args(argc, argv);
  at::set_num_threads(static_cast<int>(a.threads));
  vlm::VisionLanguageModel model(vlm::preset(a.preset));
  vlm::MaterializeOptions mopts;
  mopts.seed = 1;
  vlm::materialize(*model, mopts);
  model->train();
  const vlm::VlmConfig cfg = model->cfg;
  const int64_t factor = cfg.vision.patch_size * cfg.vision.spatial_merge_size;

  vlm::collate::Budgets budgets;
  budgets.factor = factor;
  budgets.pixels.min_pixels = factor * factor;
  budgets.pixels.max_pixels = int64_t{1} << 40;
  budgets.max_image_tokens = 1 << 20;
  budgets.max_seq_len = a.max_len + 64;
  budgets.max_tokens = a.max_tokens;
  budgets.batch_image_tokens = a.max_tokens;

  std::mt19937_64 rng(2026);
  const double lo = std::log(static_cast<double>(a.min_len)), hi = std::log(static_cast<double>(a.max_len));
  std::uniform_real_distribution<double> u(lo, hi);
  ModeStats stats[2];  // [0] padded, [1] packed
  for (int64_t step = 0; step < a.warmup + a.steps; ++step) {
    std::vector<vlm::TokenizedSample> samples;
    std::vector<vlm::collate::SampleCost> costs;
    for (int64_t i = 0; i < a.samples; ++i) {
      samples.push_back(ocr_sample(cfg, rng, step * a.samples + i, static_cast<int64_t>(std::exp(u(rng))), a.image_share));
      costs.push_back(sample_cost_of(samples.back(), factor, cfg.vision.spatial_merge_size));
    }
    for (int mode = 0; mode < 2; ++mode) {
      budgets.packing = mode == 1;
      const vlm::collate::StepPlan plan = vlm::collate::plan_step(costs, 1, budgets);
      std::vector<vlm::collate::MicroBatch> mbs;
      for (const auto& mbp : plan.ranks[0].micro_batches) {
        std::vector<vlm::TokenizedSample> rows;
        for (const auto& ps : mbp.samples) rows.push_back(samples[static_cast<size_t>(ps.index - step * a.samples)]);
        mbs.push_back(budgets.packing ? vlm::collate::build_packed_micro_batch(rows, cfg)
                                      : vlm::collate::build_micro_batch(rows, cfg, 0));
      }
      const double dt = run_step(model, mbs);
      if (step < a.warmup) continue;
      ModeStats& s = stats[mode];
      s.seconds += dt;
      s.steps += 1;
      s.micro_batches += plan.micro_batches;
      s.padding += vlm::collate::plan_padding(plan);
      for (const auto& mb : mbs) s.real_tokens += mb.batch.attention_mask.sum().item<int64_t>();
    }
  }
  nlohmann::json out = {{"preset", a.preset}, {"samples_per_step", a.samples}, {"steps", a.steps},
                        {"threads", a.threads}, {"min_len", a.min_len}, {"max_len", a.max_len},
                        {"max_tokens", a.max_tokens}, {"image_share", a.image_share}};
  const char* names[2] = {"padded", "packed"};
  for (int mode = 0; mode < 2; ++mode) {
    const ModeStats& s = stats[mode];
    out[names[mode]] = {{"tokens_per_s", s.real_tokens / s.seconds},
                        {"step_s", s.seconds / static_cast<double>(s.steps)},
                        {"padding_fraction", s.padding.fraction()},
                        {"micro_batches_per_step", static_cast<double>(s.micro_batches) / static_cast<double>(s.steps)},
                        {"tokens_in_micro_batches", s.padding.tokens},
                        {"real_tokens", s.real_tokens}};
  }
  out["speedup"] = stats[1].real_tokens / stats[1].seconds / (stats[0].real_tokens / stats[0].seconds);
  if (a.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("packing bench: preset %s, %lld samples/step (lengths %lld..%lld, log-uniform, image share %.2f), "
                "%lld steps, max_tokens %lld, %lld threads\n",
                a.preset.c_str(), static_cast<long long>(a.samples), static_cast<long long>(a.min_len),
                static_cast<long long>(a.max_len), a.image_share, static_cast<long long>(a.steps),
                static_cast<long long>(a.max_tokens), static_cast<long long>(a.threads));
    for (int mode = 0; mode < 2; ++mode) {
      const auto& j = out[names[mode]];
      std::printf("  %-6s  %8.0f tokens/s  %6.2f s/step  padding %5.1f%%  %.1f micro-batches/step\n", names[mode],
                  j["tokens_per_s"].get<double>(), j["step_s"].get<double>(),
                  100 * j["padding_fraction"].get<double>(), j["micro_batches_per_step"].get<double>());
    }
    std::printf("  packed / padded tokens/s: %.2fx\n", out["speedup"].get<double>());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}

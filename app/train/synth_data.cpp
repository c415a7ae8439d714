// The synthetic OCR set of data.synth (contract in synth_data.h).
#include "app/train/synth_data.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "app/report/progress.h"
#include "data/synth_ocr.h"
#include "vlm/runtime/check.h"

namespace fs = std::filesystem;
using vlm::sharding::ReduceOp;

namespace vlm::app {
namespace {

// The renderer's options from the recipe's data.synth section (output next to data.train[0]).
vlm::data::SynthOcrOptions synth_options(const Recipe& recipe) {
  const auto& syn = recipe.data.synth;
  vlm::data::SynthOcrOptions so;
  so.out_dir = fs::path(recipe.data.train.front()).parent_path().string();
  so.train = syn.train;
  so.val = syn.val;
  so.seed = static_cast<uint64_t>(syn.seed);
  so.layout = syn.layout;
  so.style = syn.style;
  so.min_height = syn.min_height;
  so.max_height = syn.max_height;
  so.tokenizer_type = syn.tokenizer;
  so.vocab_size = syn.vocab_size;
  so.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return so;
}

}  // namespace

void ensure_synth_data(const Recipe& recipe, vlm::sharding::Comm& comm, bool main) {
  if (!recipe.data.synth.generate_if_missing || recipe.data.train.empty()) return;
  vlm::data::SynthOcrOptions so = synth_options(recipe);
  const std::string why = main ? vlm::data::synth_ocr_refresh_reason(so) : "";
  torch::Tensor render = torch::tensor({why.empty() ? 0.0 : 1.0}, torch::kFloat64);
  comm.all_reduce(render, ReduceOp::kSum, "synthetic data check");
  if (render.item<double>() == 0) return;
  std::string error;
  if (main) {
    spdlog::info("data.synth: {}: rendering {} + {} synthetic OCR lines into {}", why, so.train, so.val,
                 so.out_dir);
    so.on_progress = part_progress("data.synth", "images");
    try {
      vlm::data::SynthOcrResult r = vlm::data::write_synth_ocr(so);
      spdlog::info("data.synth: done in {:.1f} s", r.seconds);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  torch::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kFloat64);
  comm.all_reduce(failed, ReduceOp::kSum, "synthetic data");
  if (!error.empty()) throw vlm::Error("data.synth: " + error);
  VLM_CHECK(failed.item<double>() == 0, "data.synth: rank 0 failed to render the synthetic set (see its log)");
  VLM_CHECK(fs::exists(recipe.data.train.front()), "data.synth: rendered the set but ", recipe.data.train.front(),
            " is still missing (hint: data.train[0] must be <folder>/train.jsonl)");
}

}  // namespace vlm::app

// VLMTRAIN_DUMP_BATCHES (see batch_dump.h).
#include "app/train/batch_dump.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "vlm/runtime/check.h"
#include "vlm/io/safetensors.h"

namespace vlm::app {

std::string batch_dump_dir() {
  const char* env = std::getenv("VLMTRAIN_DUMP_BATCHES");
  if (env == nullptr || *env == '\0') return "";
  std::error_code ec;
  std::filesystem::create_directories(env, ec);
  VLM_CHECK(!ec, "VLMTRAIN_DUMP_BATCHES: cannot create directory '", env, "': ", ec.message());
  return env;
}

void dump_micro_batches(const std::string& dir, int64_t step, int rank,
                        const std::vector<vlm::collate::MicroBatch>& mbs) {
  for (size_t k = 0; k < mbs.size(); ++k) {
    const auto& mb = mbs[k];
    const vlm::Batch& b = mb.batch;
    vlm::NamedTensors t = {{"input_ids", b.input_ids}, {"labels", b.labels}};
    if (b.attention_mask.defined()) t.emplace_back("attention_mask", b.attention_mask.to(torch::kInt64));
    if (b.position_ids.defined()) t.emplace_back("position_ids", b.position_ids);
    if (b.text_cu_seqlens.defined()) t.emplace_back("text_cu_seqlens", b.text_cu_seqlens);
    if (b.pixel_values.defined() && b.pixel_values.size(0) > 0) {
      t.emplace_back("pixel_values", b.pixel_values);
      t.emplace_back("image_grid_thw", b.image_grid_thw);
    }
    vlm::SafetensorsWriteOptions o;
    o.metadata = {{"step", std::to_string(step)},
                  {"rank", std::to_string(rank)},
                  {"micro_batch", std::to_string(k)},
                  {"micro_batches", std::to_string(mbs.size())},
                  {"filler", mb.filler ? "1" : "0"},
                  {"supervised_tokens", std::to_string(mb.supervised_tokens)}};
    vlm::save_safetensors(fmt::format("{}/step-{:06d}.rank-{}.mb-{}.safetensors", dir, step, rank, k), t, o);
  }
}

}  // namespace vlm::app

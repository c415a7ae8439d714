#include "app/config/collate_options.h"

namespace vlm::app {

vlm::collate::Budgets collate_budgets(const Recipe& recipe, const vlm::data::PixelConfig& pixels) {
  vlm::collate::Budgets b;
  b.pixels = pixels.limits;
  b.factor = pixels.geometry.factor();
  b.max_image_tokens = pixels.max_image_tokens;
  b.max_seq_len = recipe.data.max_seq_len;
  b.max_tokens = recipe.batch.max_tokens;
  b.batch_image_tokens = recipe.batch.max_image_tokens;
  b.max_micro_batches = recipe.batch.max_micro_batches;
  b.packing = recipe.batch.packing;
  return b;
}

}  // namespace vlm::app

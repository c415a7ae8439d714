// One training/eval sample after rendering, tokenization and pixel processing: the hand-off
// between data/ (which produces it) and collate/ (which batches it). A plain struct in vlm/
// because data/ and collate/ may not include each other.
#pragma once
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <vector>

namespace vlm {

struct TokenizedSample {
  int64_t index = 0;                              // global dataset index
  std::vector<int64_t> input_ids;                 // image pads already expanded
  std::vector<int64_t> labels;                    // same length; -100 = not supervised
  torch::Tensor pixel_values;                     // [P, 1176] float32, all images; undefined if none
  std::vector<std::array<int64_t, 3>> grid_thw;   // per image (t, gh, gw) in patches, prompt order
};

}  // namespace vlm

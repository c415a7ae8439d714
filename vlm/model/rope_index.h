// M-RoPE position ids (HF get_rope_index) for images: three streams (temporal, height,
// width) per token, computed per sequence over its unmasked tokens.
//   text:  the same position on all three streams, counting on from (max so far) + 1;
//   image: a t x H' x W' block of merged tokens (H' = gh/merge, W' = gw/merge) whose first
//          token would be at `base` gets base + (t_idx, row, col) in raster order;
//          t_idx = the frame when cfg.text.image_frames_advance_time (as Qwen2-VL), else 0
//          (as Qwen2.5-VL's images, second_per_grid_t = 0);
//   padding (attention_mask 0): 1 on all streams.
// rope_delta = (max position + 1) - L, so during cached decoding the token at cache index c
// gets position c + delta on all streams.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "vlm/model/config.h"

namespace vlm {

struct RopeIndex {
  torch::Tensor position_ids;  // [3, B, L] int64
  torch::Tensor rope_deltas;   // [B, 1] int64
};

// input_ids: [B, L] int64; image_grid_thw: [N, 3] int64 (images in order of appearance
// across the batch; may be undefined when there are none); attention_mask: [B, L]
// (undefined = all ones). An image block is <|vision_start|> followed by exactly
// t*gh*gw/merge^2 image_token_id tokens (the vision_start decides where an image begins, as
// in HF's processor output, not a run of pads alone): fewer pads there, or a pad anywhere
// else (typed in the text, one too many), is an error naming the sequence and position.
RopeIndex get_rope_index(const torch::Tensor& input_ids, const torch::Tensor& image_grid_thw,
                         const torch::Tensor& attention_mask, const VlmConfig& cfg);

// Position ids of a packed row (padding-free packing): segment i = tokens [cu[i], cu[i+1])
// is one whole sample, and gets exactly get_rope_index of that sample alone (restarting at
// 0). image_grid_thw holds the images of all segments in order; each segment takes as many
// rows as its image blocks. input_ids: [1, L]; cu: [S + 1] (0 .. L) -> [3, 1, L] int64
torch::Tensor packed_position_ids(const torch::Tensor& input_ids, const torch::Tensor& image_grid_thw,
                                  const std::vector<int64_t>& cu, const VlmConfig& cfg);

}  // namespace vlm

// Shared checks of the chat-template parity tests (chat_template_test.cpp for Qwen2-VL,
// chat_template_qwen3_test.cpp for Qwen3-VL) against one row of
// scripts/chat_template_reference.py's output.
#pragma once
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "vlm/text/chat_template.h"
#include "vlm/text/tokenizer.h"

namespace vlm::test {

// Merged tokens of each image of the reference row (its image_grid_thw).
inline std::vector<int64_t> hf_image_token_counts(const nlohmann::json& row) {
  std::vector<int64_t> counts;
  for (const auto& g : row["image_grid_thw"])
    counts.push_back(vlm::merged_image_tokens(g[0].get<int64_t>(), g[1].get<int64_t>(), g[2].get<int64_t>()));
  return counts;
}

// input_ids equal to the reference's, and image spans equal to its runs of
// mm_token_type_ids == 1. Fatal failures return early (check HasFatalFailure()).
inline void expect_ids_and_spans_equal_hf(const vlm::Tokenizer& tok, const vlm::RenderedChat& rendered,
                                          const nlohmann::json& row) {
  const auto hf_ids = row["input_ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(rendered.input_ids.size(), hf_ids.size()) << "\nvlmtrain: " << tok.decode(rendered.input_ids)
                                                      << "\nHF:       " << tok.decode(hf_ids);
  for (size_t i = 0; i < hf_ids.size(); ++i)
    ASSERT_EQ(rendered.input_ids[i], hf_ids[i]) << "first difference at token " << i;
  const auto types = row["mm_token_type_ids"].get<std::vector<int64_t>>();
  std::vector<std::pair<int64_t, int64_t>> hf_runs;
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != 1) continue;
    if (i > 0 && types[i - 1] == 1) ++hf_runs.back().second;
    else hf_runs.push_back({int64_t(i), 1});
  }
  ASSERT_EQ(rendered.image_spans.size(), hf_runs.size());
  for (size_t i = 0; i < hf_runs.size(); ++i) {
    EXPECT_EQ(rendered.image_spans[i].begin, hf_runs[i].first);
    EXPECT_EQ(rendered.image_spans[i].length, hf_runs[i].second);
  }
}

}  // namespace vlm::test

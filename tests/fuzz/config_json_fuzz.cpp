// Fuzz target: an HF config.json (Qwen2-VL / Qwen2.5-VL) through vlm::parse_hf_config, which
// validates the result; an accepted config is exported back (to_hf_json) and re-parsed,
// which must succeed and give the same export.
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "vlm/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  vlm::VlmConfig cfg;
  try {
    cfg = vlm::parse_hf_config(text, "<fuzz>/config.json");
  } catch (const vlm::Error&) {
    return 0;
  }
  // Accepted: the round trip must hold (a failure here is a bug, so it is not caught).
  const std::string exported = vlm::to_hf_json(cfg).dump();
  vlm::VlmConfig again = vlm::parse_hf_config(exported, "<fuzz>/config.json (exported)");
  if (vlm::to_hf_json(again).dump() != exported) __builtin_trap();
  (void)cfg.vision.head_dim();
  (void)cfg.vision.patch_dim();
  (void)cfg.text.head_dim();
  return 0;
}

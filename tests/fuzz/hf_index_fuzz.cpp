// Fuzz target: model.safetensors.index.json through vlm::HfCheckpoint::open. The bytes are
// the index file of a scratch checkpoint directory that also holds two small valid shards
// (model-00001-of-00002.safetensors: "model.embed_tokens.weight", "visual.patch_embed.proj.weight";
// model-00002-of-00002.safetensors: "lm_head.weight") and a subdirectory "sub", so the
// fuzzer can reach the cross-checks between the index and the shards. Every tensor an
// accepted checkpoint names is read.
#include <filesystem>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "vlm/io/hf_checkpoint.h"

namespace {

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    std::string d = vlm::fuzz::scratch_dir() + "/ckpt";
    fs::create_directories(d + "/sub");
    vlm::save_safetensors(d + "/model-00001-of-00002.safetensors",
                          {{"model.embed_tokens.weight", torch::arange(12, torch::kFloat).view({4, 3})},
                           {"visual.patch_embed.proj.weight", torch::ones({2, 2}, torch::kBFloat16)}});
    vlm::save_safetensors(d + "/model-00002-of-00002.safetensors",
                          {{"lm_head.weight", torch::full({4, 3}, 2.0f)}});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  vlm::fuzz::write_bytes(dir + "/model.safetensors.index.json", data, size);
  vlm::fuzz::expect_only_vlm_errors([&] {
    auto ck = vlm::HfCheckpoint::open(dir);
    for (const auto& name : ck.names()) {
      (void)ck.stored_name(name);
      (void)ck.file_of(name);
      torch::Tensor t = ck.get(name);
      (void)t.to(torch::kFloat).sum().item<double>();
    }
    (void)ck.index_total_size();
  });
  return 0;
}

// Fuzz target: a safetensors file image (header and data) through vlm::SafetensorsFile,
// reading every tensor (zero-copy views and misaligned copies) and converting it to fp32.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "vlm/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlm::fuzz::expect_only_vlm_errors([&] {
    // The pure validator on the caller's bytes (what a memory-mapped file gives it).
    vlm::parse_safetensors(data, size, "<fuzz>");
    // The reader on an owned copy, then every tensor's bytes.
    auto file = vlm::SafetensorsFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size),
                                                 "<fuzz>");
    double sum = 0;
    for (const auto& name : file.names()) {
      torch::Tensor t = file.get(name);
      if (t.numel() == 0) continue;
      // Touch every byte (ASan checks the reads); NaN/inf from random bits are fine.
      torch::Tensor f = file.get(name, torch::kFloat);
      sum += f.sum().item<double>();
    }
    (void)sum;
  });
  return 0;
}

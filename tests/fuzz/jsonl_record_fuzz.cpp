// Fuzz target: dataset files (JSONL lines or a JSON array; messages / llava / plain OCR /
// alpaca / embedded base64 records) through
// vlm::data::load_dataset, with image probing off (image paths are never opened: the
// fuzzer would otherwise read arbitrary files). Every accepted record is also measured.
#include <string>

#include "data/dataset.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = vlm::fuzz::scratch_dir() + "/data.jsonl";
  vlm::fuzz::write_bytes(path, data, size);
  vlm::data::DatasetOptions opts;
  opts.probe_images = false;
  opts.use_index_cache = false;
  opts.max_bad_fraction = 1.0;
  opts.image_root = "/nonexistent-image-root";
  opts.warn = [](const std::string&) {};
  vlm::fuzz::expect_only_vlm_errors([&] {
    vlm::data::Dataset ds = vlm::data::load_dataset({path}, opts);
    for (const auto& r : ds.records) {
      (void)vlm::data::count_image_markers(r);
      (void)vlm::data::approx_token_cost(r, vlm::PixelLimits{});
      (void)r.location();
    }
    (void)ds.summary();
  });
  return 0;
}

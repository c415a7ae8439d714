// Image pipeline per file, one thread: the training loader's path (read the file, decode,
// smart_resize, resize, normalise + patchify: data/loader.cpp does decode_image_rgb +
// process_image, which is process_image_file), timed in-process. Driven by
// scripts/bench_image_hf.py, which times HF's image processors on the same files between
// runs of this binary and checks the pixels first (--dump).
//   ./image_file_bench [--cap TOKENS] [--iters N] [--warmup CALLS] [--dump DIR]
//                      [--jpeg-reduced-decode] FILE...
// prints one JSON line per file:
//   {"file", "cap", "iters", "s": [seconds per image, one per iteration],
//    "stages_ms": {"read", "decode", "resize", "patchify"} (means over a second set of
//    iterations timed stage by stage), "faults": minor page faults per timed image,
//    "grid": [t, h, w], "source": [h, w]}
// --cap 0 means Qwen2-VL's defaults (max_pixels 12845056); --dump writes
// DIR/<file name>.cap<TOKENS>.f32 (pixel_values, float32, row-major) before timing.
// glibc malloc is tuned as in `vlmtrain` (vlm/runtime/host_malloc.h), so freed pixel buffers are
// reused instead of page-faulted again.
#include <opencv2/core.hpp>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/pixel_pipeline.h"
#include "vlm/runtime/host_malloc.h"
#include "vlm/model/image_geometry.h"

namespace {

using Clock = std::chrono::steady_clock;
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Args {
  int64_t cap = 0;
  int iters = 10;
  int warmup = 6;  // untimed calls per file before its timed ones
  bool reduced = false;  // PixelConfig::jpeg_reduced_decode
  std::string dump;
  std::vector<std::string> files;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--cap" && i + 1 < argc) a.cap = std::atoll(argv[++i]);
    else if (s == "--iters" && i + 1 < argc) a.iters = std::atoi(argv[++i]);
    else if (s == "--dump" && i + 1 < argc) a.dump = argv[++i];
    else if (s == "--warmup" && i + 1 < argc) a.warmup = std::atoi(argv[++i]);
    else if (s == "--jpeg-reduced-decode") a.reduced = true;
    else a.files.push_back(s);
  }
  return a;
}

void dump(const Args& a, const std::string& file, const vlm::data::PixelImage& img) {
  const std::string base = file.substr(file.find_last_of('/') + 1);
  const std::string path = a.dump + "/" + base + ".cap" + std::to_string(a.cap) +
                           (a.reduced ? ".reduced" : "") + ".f32";
  std::ofstream out(path, std::ios::binary);
  const torch::Tensor pv = img.pixel_values.contiguous();
  out.write(static_cast<const char*>(pv.data_ptr()), pv.numel() * sizeof(float));
}

// Stage means in ms over n iterations: read, decode, resize (to the target in `sizes`),
// normalise + patchify.
std::array<double, 4> stages(const std::string& file, const vlm::data::PixelConfig& cfg,
                             const vlm::data::PixelImage& sizes, int n) {
  std::array<double, 4> ms{};
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    std::vector<uint8_t> bytes = vlm::data::read_file_bytes(file);
    auto t1 = Clock::now();
    cv::Mat rgb = vlm::data::decode_image_rgb(bytes, file, vlm::data::jpeg_decode_scale(bytes, cfg));
    auto t2 = Clock::now();
    const int64_t h = sizes.resized_height, w = sizes.resized_width;  // smart_resize's target
    cv::Mat resized = (h == rgb.rows && w == rgb.cols) ? rgb : vlm::data::resize_bicubic_aa(rgb, h, w);
    auto t3 = Clock::now();
    torch::Tensor pv = vlm::data::normalize_patchify_rgb(resized, cfg);
    auto t4 = Clock::now();
    ms[0] += 1e3 * seconds(t0, t1) / n;
    ms[1] += 1e3 * seconds(t1, t2) / n;
    ms[2] += 1e3 * seconds(t2, t3) / n;
    ms[3] += 1e3 * seconds(t3, t4) / n;
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  vlm::tune_host_malloc();  // as vlmtrain's main does before the loader runs
  cv::setNumThreads(1);
  torch::set_num_threads(1);
  vlm::data::PixelConfig cfg;
  cfg.max_image_tokens = a.cap;
  cfg.jpeg_reduced_decode = a.reduced;
  // One untimed call per file first: sizes for the report, pixels for --dump.
  std::vector<vlm::data::PixelImage> first;
  for (const std::string& file : a.files) {
    first.push_back(vlm::data::process_image_file(file, cfg));
    if (!a.dump.empty()) dump(a, file, first.back());
    first.back().pixel_values = torch::Tensor();  // keep the sizes, free the buffer
  }
  for (size_t f = 0; f < a.files.size(); ++f) {
    const std::string& file = a.files[f];
    const vlm::data::PixelImage& img = first[f];
    // Untimed calls first: after a change of image size glibc's heap takes a few calls to
    // hold buffers that fit (until then each call page-faults its pixel_values afresh).
    for (int i = 0; i < a.warmup; ++i) vlm::data::process_image_file(file, cfg);
    std::vector<double> s;
    const long faults0 = minor_faults();
    for (int i = 0; i < a.iters; ++i) {  // each result freed before the next call, as in
      auto t0 = Clock::now();            // the Python side's loop
      vlm::data::PixelImage out = vlm::data::process_image_file(file, cfg);
      s.push_back(seconds(t0, Clock::now()));
    }
    const double faults = double(minor_faults() - faults0) / std::max(1, a.iters);
    const std::array<double, 4> ms = stages(file, cfg, img, std::max(1, a.iters / 2));
    std::printf("{\"file\": \"%s\", \"cap\": %lld, \"iters\": %d, \"s\": [", file.c_str(),
                static_cast<long long>(a.cap), a.iters);
    for (size_t i = 0; i < s.size(); ++i) std::printf("%s%.6f", i ? ", " : "", s[i]);
    std::printf("], \"stages_ms\": {\"read\": %.3f, \"decode\": %.3f, \"resize\": %.3f, "
                "\"patchify\": %.3f}, \"faults\": %.0f, \"grid\": [%lld, %lld, %lld], \"source\": [%lld, %lld]}\n",
                ms[0], ms[1], ms[2], ms[3], faults, static_cast<long long>(img.grid_thw[0]),
                static_cast<long long>(img.grid_thw[1]), static_cast<long long>(img.grid_thw[2]),
                static_cast<long long>(img.source_height),
                static_cast<long long>(img.source_width));
    std::fflush(stdout);
  }
  return 0;
}

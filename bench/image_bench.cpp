// Image pipeline throughput: decode + resize + patchify of JPEGs, single thread.
//   ./image_bench [iterations]     prints images/s per core for each size and cap.
// Not run in CI. The JPEGs are synthetic (smooth gradients + text + noise, quality 90),
// encoded in memory so disk speed does not enter the numbers.
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "data/image.h"
#include "data/pixel_pipeline.h"
#include "vlm/model/image_geometry.h"

namespace {

std::vector<uint8_t> make_jpeg(int h, int w) {
  cv::Mat img(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      img.at<cv::Vec3b>(y, x) = cv::Vec3b(uchar(x * 255 / w), uchar(y * 255 / h), 128);
  for (int y = 60; y < h; y += 80)
    cv::putText(img, "The quick brown fox 0123456789", {20, y}, cv::FONT_HERSHEY_SIMPLEX, 1.5,
                {0, 0, 0}, 2, cv::LINE_AA);
  cv::Mat noise(h, w, CV_8UC3);
  cv::randu(noise, 0, 16);
  img += noise;
  std::vector<uint8_t> out;
  cv::imencode(".jpg", img, out, {cv::IMWRITE_JPEG_QUALITY, 90});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  cv::setNumThreads(1);
  torch::set_num_threads(1);
  struct Size { int h, w; };
  for (Size s : {Size{1024, 1024}, Size{2000, 3000}}) {
    std::vector<uint8_t> jpg = make_jpeg(s.h, s.w);
    for (int64_t cap : {0, 1024, 256}) {
      vlm::data::PixelConfig cfg;
      cfg.max_image_tokens = cap;
      double decode_s = 0, resize_s = 0, patch_s = 0;
      int64_t tokens = 0;
      for (int i = 0; i < iters; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        cv::Mat rgb = vlm::data::decode_image_rgb(jpg, "bench");
        auto t1 = std::chrono::steady_clock::now();
        vlm::ImageSize target = vlm::smart_resize(rgb.rows, rgb.cols, cfg.effective_limits());
        cv::Mat resized = vlm::data::resize_bicubic_aa(rgb, target.height, target.width);
        auto t2 = std::chrono::steady_clock::now();
        torch::Tensor pv = vlm::data::normalize_patchify_rgb(resized, cfg);
        auto t3 = std::chrono::steady_clock::now();
        decode_s += std::chrono::duration<double>(t1 - t0).count();
        resize_s += std::chrono::duration<double>(t2 - t1).count();
        patch_s += std::chrono::duration<double>(t3 - t2).count();
        tokens = pv.size(0) / 4;
      }
      const double total_s = decode_s + resize_s + patch_s;
      std::printf("%4dx%-4d jpeg %5zu KB  cap %5lld -> %5lld tokens: %5.1f images/s/core "
                  "(decode %5.1f ms, resize %5.1f ms, normalise+patchify %5.1f ms)\n",
                  s.h, s.w, jpg.size() / 1024, static_cast<long long>(cap),
                  static_cast<long long>(tokens), iters / total_s, 1000 * decode_s / iters,
                  1000 * resize_s / iters, 1000 * patch_s / iters);
    }
  }
  return 0;
}

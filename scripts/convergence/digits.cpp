// Probe datasets for docs/notes/tiny_convergence.md: lines of random digits in one font
// (Hershey Simplex, thickness 2, black on white, no noise), 56 px high.
//
//   g++ -O1 -std=c++17 digits.cpp -o digits $(pkg-config --cflags --libs opencv4)
//   digits OUT N SEED MIN_LEN MAX_LEN MODE [CANVAS_PX]
//
// MODE fixed: cap height 0.55 x 56, left margin 4 px (constant digit pitch);
// MODE varied: cap height 0.40-0.65 x 56, left margin 2-21 px.
// CANVAS_PX: every image this wide (text left-aligned); absent: as wide as the text.
// DIGITS_THICKNESS (environment) overrides the stroke thickness of 2.
// Writes OUT/images/NNNNNN.png and OUT/data.jsonl ({"image", "text"}).
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s OUT N SEED MIN_LEN MAX_LEN fixed|varied [CANVAS_PX]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int n = std::atoi(argv[2]);
  std::mt19937 g(static_cast<unsigned>(std::atoi(argv[3])));
  const int lo = std::atoi(argv[4]), hi = std::atoi(argv[5]);
  const bool fixed = std::string(argv[6]) == "fixed";
  const int canvas = argc > 7 ? std::atoi(argv[7]) : 0;
  std::filesystem::create_directories(out + "/images");
  FILE* f = std::fopen((out + "/data.jsonl").c_str(), "w");
  if (f == nullptr) return 1;
  const int h = 56, font = cv::FONT_HERSHEY_SIMPLEX;
  const int thick = std::getenv("DIGITS_THICKNESS") ? std::atoi(std::getenv("DIGITS_THICKNESS")) : 2;
  for (int i = 0; i < n; ++i) {
    const int len = lo + int(g() % unsigned(hi - lo + 1));
    std::string t;
    for (int k = 0; k < len; ++k) t += char('0' + g() % 10);
    const double frac = fixed ? 0.55 : 0.40 + 0.25 * double(g() % 1000) / 1000.0;
    int base = 0;
    const cv::Size unit = cv::getTextSize("0", font, 1.0, thick, &base);
    const double s = frac * h / unit.height;
    const cv::Size sz = cv::getTextSize(t, font, s, thick, &base);
    const int margin = fixed ? 4 : 2 + int(g() % 20);
    const int width = canvas > 0 ? canvas : std::max(56, sz.width + margin + 8);
    cv::Mat img(h, width, CV_8UC3, cv::Scalar(255, 255, 255));
    cv::putText(img, t, cv::Point(margin, (h + sz.height) / 2), font, s, cv::Scalar(0, 0, 0), thick,
                cv::LINE_AA);
    char name[64];
    std::snprintf(name, sizeof name, "images/%06d.png", i);
    cv::imwrite(out + "/" + name, img);
    std::fprintf(f, "{\"image\":\"%s\",\"text\":\"%s\"}\n", name, t.c_str());
  }
  std::fclose(f);
  return 0;
}

// Image decode: colour conversions, EXIF orientation (checked against the EXIF spec's
// pixel mapping written out independently here), header probing vs decoded size.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "data/image.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"

namespace {

using vlm::data::decode_image_rgb;
using vlm::data::parse_image_header;

std::vector<uint8_t> encode(const std::string& ext, const cv::Mat& m,
                            std::vector<int> params = {}) {
  std::vector<uint8_t> out;
  EXPECT_TRUE(cv::imencode(ext, m, out, params)) << ext;
  return out;
}

// Minimal big-endian TIFF block holding IFD0 with one Orientation entry.
std::vector<uint8_t> tiff_with_orientation(int o) {
  return {'M', 'M', 0, 42, 0, 0, 0, 8,  // header, IFD0 at 8
          0, 1,                          // one entry
          0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, uint8_t(o), 0, 0,  // tag, SHORT, count 1, value
          0, 0, 0, 0};                   // next IFD
}

uint32_t crc32(const uint8_t* d, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= d[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(x >> s));
}

// PNG with an eXIf chunk inserted after IHDR.
std::vector<uint8_t> png_with_orientation(const cv::Mat& bgr, int o) {
  std::vector<uint8_t> png = encode(".png", bgr);
  std::vector<uint8_t> tiff = tiff_with_orientation(o);
  std::vector<uint8_t> chunk;
  put_be32(chunk, uint32_t(tiff.size()));
  const char* type = "eXIf";
  chunk.insert(chunk.end(), type, type + 4);
  chunk.insert(chunk.end(), tiff.begin(), tiff.end());
  put_be32(chunk, crc32(chunk.data() + 4, chunk.size() - 4));
  std::vector<uint8_t> out(png.begin(), png.begin() + 33);  // signature + IHDR
  out.insert(out.end(), chunk.begin(), chunk.end());
  out.insert(out.end(), png.begin() + 33, png.end());
  return out;
}

// JPEG with an APP1 Exif segment right after SOI.
std::vector<uint8_t> jpeg_with_orientation(const cv::Mat& bgr, int o) {
  std::vector<uint8_t> jpg = encode(".jpg", bgr, {cv::IMWRITE_JPEG_QUALITY, 95});
  std::vector<uint8_t> tiff = tiff_with_orientation(o);
  std::vector<uint8_t> seg = {0xFF, 0xE1};
  size_t len = 2 + 6 + tiff.size();
  seg.push_back(uint8_t(len >> 8));
  seg.push_back(uint8_t(len & 0xFF));
  const char exif[6] = {'E', 'x', 'i', 'f', 0, 0};
  seg.insert(seg.end(), exif, exif + 6);
  seg.insert(seg.end(), tiff.begin(), tiff.end());
  std::vector<uint8_t> out(jpg.begin(), jpg.begin() + 2);
  out.insert(out.end(), seg.begin(), seg.end());
  out.insert(out.end(), jpg.begin() + 2, jpg.end());
  return out;
}

// EXIF spec: displayed pixel (y, x) comes from stored pixel src(y', x') of an H x W image.
cv::Point source_of(int o, int y, int x, int H, int W) {
  switch (o) {
    case 1: return {x, y};
    case 2: return {W - 1 - x, y};
    case 3: return {W - 1 - x, H - 1 - y};
    case 4: return {x, H - 1 - y};
    case 5: return {y, x};
    case 6: return {y, H - 1 - x};
    case 7: return {W - 1 - y, H - 1 - x};
    case 8: return {W - 1 - y, x};
  }
  return {-1, -1};
}

cv::Mat random_bgr(int h, int w, uint64_t seed) {
  cv::Mat m(h, w, CV_8UC3);
  cv::RNG rng(seed);
  rng.fill(m, cv::RNG::UNIFORM, 0, 256);
  return m;
}

TEST(Image, ColourConversions) {
  // BGR (OpenCV) -> RGB.
  cv::Mat bgr(4, 5, CV_8UC3, cv::Scalar(10, 20, 30));
  cv::Mat rgb = decode_image_rgb(encode(".png", bgr), "bgr");
  ASSERT_EQ(rgb.type(), CV_8UC3);
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 0), cv::Vec3b(30, 20, 10));
  // Grayscale -> 3 equal channels.
  cv::Mat gray(3, 3, CV_8UC1, cv::Scalar(77));
  rgb = decode_image_rgb(encode(".png", gray), "gray");
  EXPECT_EQ(rgb.at<cv::Vec3b>(1, 1), cv::Vec3b(77, 77, 77));
  // 16-bit -> high byte (v >> 8, as Pillow decodes 16-bit PNGs).
  cv::Mat g16(2, 2, CV_16UC1, cv::Scalar(257 * 200));
  rgb = decode_image_rgb(encode(".png", g16), "16bit");
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 1), cv::Vec3b(200, 200, 200));
  cv::Mat c16(2, 2, CV_16UC3, cv::Scalar(0, 257 * 100, 65535));
  rgb = decode_image_rgb(encode(".png", c16), "16bit colour");
  EXPECT_EQ(rgb.at<cv::Vec3b>(1, 1), cv::Vec3b(255, 100, 0));
  // Alpha composited over white: a=0 -> white, a=255 -> colour, a=128 -> blend.
  cv::Mat bgra(1, 3, CV_8UC4);
  bgra.at<cv::Vec4b>(0, 0) = {0, 0, 200, 0};
  bgra.at<cv::Vec4b>(0, 1) = {0, 0, 200, 255};
  bgra.at<cv::Vec4b>(0, 2) = {0, 0, 200, 128};
  rgb = decode_image_rgb(encode(".png", bgra), "alpha");
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 0), cv::Vec3b(255, 255, 255));
  EXPECT_EQ(rgb.at<cv::Vec3b>(0, 1), cv::Vec3b(200, 0, 0));
  // PIL.Image.alpha_composite's integer result: round((c a + 255 (255 - a)) / 255).
  cv::Vec3b blend = rgb.at<cv::Vec3b>(0, 2);
  EXPECT_EQ(blend[0], std::lround((200.0 * 128 + 255.0 * 127) / 255));  // 227
  EXPECT_EQ(blend[1], std::lround(255.0 * 127 / 255));                   // 127
}

TEST(Image, PngOrientationMatchesExifSpec) {
  const int H = 5, W = 7;
  cv::Mat bgr = random_bgr(H, W, 7);
  cv::Mat stored_rgb;
  cv::cvtColor(bgr, stored_rgb, cv::COLOR_BGR2RGB);
  for (int o = 1; o <= 8; ++o) {
    std::vector<uint8_t> bytes = png_with_orientation(bgr, o);
    auto info = parse_image_header(bytes);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->orientation, o);
    const bool swap = o >= 5;
    EXPECT_EQ(info->width, swap ? H : W) << "orientation " << o;
    EXPECT_EQ(info->height, swap ? W : H) << "orientation " << o;
    cv::Mat out = decode_image_rgb(bytes, "png");
    ASSERT_EQ(out.rows, info->height);
    ASSERT_EQ(out.cols, info->width);
    for (int y = 0; y < out.rows; ++y)
      for (int x = 0; x < out.cols; ++x) {
        cv::Point s = source_of(o, y, x, H, W);
        ASSERT_EQ(out.at<cv::Vec3b>(y, x), stored_rgb.at<cv::Vec3b>(s.y, s.x))
            << "orientation " << o << " at " << y << "," << x;
      }
  }
}

TEST(Image, JpegHeaderAndOrientation) {
  cv::Mat bgr(60, 40, CV_8UC3, cv::Scalar(0, 0, 0));
  bgr(cv::Rect(0, 0, 20, 30)).setTo(cv::Scalar(255, 255, 255));  // top-left block white
  for (int o : {1, 3, 6, 8}) {
    std::vector<uint8_t> bytes = jpeg_with_orientation(bgr, o);
    auto info = parse_image_header(bytes);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->format, "jpeg");
    EXPECT_EQ(info->orientation, o);
    cv::Mat out = decode_image_rgb(bytes, "jpeg");
    EXPECT_EQ(out.cols, info->width) << o;
    EXPECT_EQ(out.rows, info->height) << o;
    // Where does the white stored top-left corner land? Check a pixel well inside it.
    cv::Point corner;
    if (o == 1) corner = {2, 2};
    if (o == 3) corner = {out.cols - 3, out.rows - 3};
    if (o == 6) corner = {out.cols - 3, 2};
    if (o == 8) corner = {2, out.rows - 3};
    EXPECT_GT(out.at<cv::Vec3b>(corner)[0], 200) << "orientation " << o;
  }
}

TEST(Image, WebpHeader) {
  cv::Mat bgr = random_bgr(33, 47, 3);
  std::vector<uint8_t> lossy, lossless;
  if (!cv::imencode(".webp", bgr, lossy, {cv::IMWRITE_WEBP_QUALITY, 80})) {
    GTEST_SKIP() << "OpenCV built without WebP encoder";
  }
  ASSERT_TRUE(cv::imencode(".webp", bgr, lossless, {cv::IMWRITE_WEBP_QUALITY, 101}));
  for (auto* b : {&lossy, &lossless}) {
    auto info = parse_image_header(*b);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->format, "webp");
    EXPECT_EQ(info->width, 47);
    EXPECT_EQ(info->height, 33);
    cv::Mat out = decode_image_rgb(*b, "webp");
    EXPECT_EQ(out.cols, 47);
  }
}

TEST(Image, ProbeFallsBackToDecodeAndRejectsBadFiles) {
  vlm::test::TempDir dir("image");
  cv::Mat bgr = random_bgr(9, 11, 5);
  ASSERT_TRUE(cv::imwrite(dir / "a.tiff", bgr));
  auto info = vlm::data::probe_image(dir / "a.tiff");
  EXPECT_EQ(info.format, "other");
  EXPECT_EQ(info.width, 11);
  EXPECT_EQ(info.height, 9);
  EXPECT_THROW(vlm::data::probe_image(dir / "missing.png"), vlm::Error);
  vlm::test::write_file(dir / "garbage.png", "this is not an image");
  EXPECT_THROW(vlm::data::probe_image(dir / "garbage.png"), vlm::Error);
  // A truncated PNG: header parses, decoding fails with a message naming the file.
  std::vector<uint8_t> png = encode(".png", random_bgr(64, 64, 1));
  std::string cut(png.begin(), png.begin() + png.size() / 2);
  vlm::test::write_file(dir / "cut.png", cut);
  try {
    vlm::data::decode_image_rgb(dir / "cut.png");
    ADD_FAILURE() << "expected decode to fail";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.png"), std::string::npos) << e.what();
  }
}

}  // namespace

// Regression test from tests/fuzz/image_decode_fuzz.cpp: a header announcing a huge image is
// refused with a clear error before decoding (OpenCV would otherwise allocate gigabytes),
// both when probing for the dataset index and when decoding.
TEST(Image, RefusesAbsurdDimensionsBeforeDecoding) {
  cv::Mat small(4, 4, CV_8UC3, cv::Scalar(1, 2, 3));
  std::vector<uint8_t> png;
  ASSERT_TRUE(cv::imencode(".png", small, png));
  auto set_be32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) png[at + k] = uint8_t(v >> (24 - 8 * k));
  };
  set_be32(16, 100000);  // IHDR width
  set_be32(20, 100000);  // IHDR height: 10^10 pixels
  vlm::test::TempDir dir("bomb");
  vlm::test::write_file(dir / "bomb.png", std::string(png.begin(), png.end()));
  for (const auto& attempt : std::vector<std::function<void()>>{
           [&] { vlm::data::probe_image(dir / "bomb.png"); },
           [&] { vlm::data::decode_image_rgb(png, "bomb.png"); }}) {
    try {
      attempt();
      FAIL() << "expected a vlm::Error";
    } catch (const vlm::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("bomb.png"), std::string::npos) << what;
      EXPECT_NE(what.find("100000x100000"), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(vlm::data::kMaxImagePixels)), std::string::npos) << what;
    }
  }
  // A JPEG SOF of 65535 x 65535 (4.3e9 pixels) too.
  std::vector<uint8_t> jpg;
  ASSERT_TRUE(cv::imencode(".jpg", small, jpg));
  for (size_t i = 2; i + 8 < jpg.size(); ++i)
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) {
      jpg[i + 5] = jpg[i + 6] = jpg[i + 7] = jpg[i + 8] = 0xFF;
      break;
    }
  EXPECT_THROW(vlm::data::decode_image_rgb(jpg, "bomb.jpg"), vlm::Error);
}

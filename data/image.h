// Image files: cheap header probing (size + EXIF orientation without decoding) and
// decoding to 8-bit RGB with orientation applied (OpenCV).
//
// Both paths read the EXIF orientation with the same parser, so the size the dataset
// index reports (from the header) is the size decode_image_rgb returns: orientations 5-8
// swap width and height.
#pragma once
#include <opencv2/core.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vlm::data {

// Largest image accepted, in pixels (PIL's decompression-bomb error threshold, 2 x 89,478,485):
// a header announcing more is refused before anything is decoded or allocated.
constexpr int64_t kMaxImagePixels = 178'956'970;

struct ImageInfo {
  int64_t width = 0;        // oriented (as displayed) width in pixels
  int64_t height = 0;       // oriented height
  int orientation = 1;      // EXIF orientation 1..8 (1 when absent)
  std::string format;       // "png", "jpeg", "webp", or "other" (probed by decoding)
};

// Reads the whole file; throws vlm::Error naming the path when it cannot be read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

// Parses PNG / JPEG / WebP headers (IHDR, SOFn + APP1 Exif, VP8/VP8L/VP8X + EXIF chunk).
// nullopt when the bytes are not one of these formats or the header is malformed.
std::optional<ImageInfo> parse_image_header(const std::vector<uint8_t>& bytes);

// Size and orientation of an image file: from the header when possible, otherwise by
// decoding (TIFF, BMP, ...). Throws vlm::Error (missing, unreadable, corrupt, zero-size,
// more than kMaxImagePixels).
ImageInfo probe_image(const std::string& path);

// EXIF orientation (1..8) of the bytes, 1 when absent or unreadable.
int exif_orientation(const std::vector<uint8_t>& bytes);

// Decodes to CV_8UC3 in RGB order with EXIF orientation applied (as PIL's
// ImageOps.exif_transpose). Grayscale is expanded; alpha (RGBA, gray+alpha, palette tRNS) is
// composited over white exactly as PIL.Image.alpha_composite; 16-bit keeps the high byte
// (v >> 8, as Pillow decodes 16-bit RGB PNGs); float is scaled from [0, 1]. HF's own loaders
// differ on alpha and 16-bit: docs/image_parity.md says where and why.
// Throws vlm::Error naming `what` (usually the path) on failure, and before decoding when
// the header announces more than kMaxImagePixels.
cv::Mat decode_image_rgb(const std::vector<uint8_t>& bytes, const std::string& what);
// As above, with a JPEG decoded at 1 / jpeg_scale_denom of its size (2, 4 or 8; libjpeg's DCT
// scaling, ceil of each side): much faster, but not the pixels Pillow decodes. Other formats
// and 1-component JPEGs are decoded at full size.
cv::Mat decode_image_rgb(const std::vector<uint8_t>& bytes, const std::string& what,
                         int jpeg_scale_denom);
cv::Mat decode_image_rgb(const std::string& path);

// Applies EXIF orientation 1..8 to an image (returns a new or the same Mat).
cv::Mat apply_orientation(const cv::Mat& image, int orientation);

}  // namespace vlm::data

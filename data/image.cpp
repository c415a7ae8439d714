#include "data/image.h"

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <csetjmp>
#include <cstdio>  // before jpeglib.h (FILE, size_t)
#include <cstring>
#include <fstream>
#include <iterator>

#include "vlm/runtime/check.h"

#include <jpeglib.h>

namespace vlm::data {
namespace {

uint32_t be16(const uint8_t* p) { return (uint32_t(p[0]) << 8) | p[1]; }
uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}
uint32_t le16(const uint8_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }
uint32_t le24(const uint8_t* p) { return le16(p) | (uint32_t(p[2]) << 16); }
uint32_t le32(const uint8_t* p) { return le24(p) | (uint32_t(p[3]) << 24); }

// Orientation tag (0x0112) of IFD0 in a TIFF-structured block (the body of an Exif
// segment). Returns 1 when absent or malformed.
int tiff_orientation(const uint8_t* d, size_t n) {
  if (n >= 6 && std::memcmp(d, "Exif\0\0", 6) == 0) { d += 6; n -= 6; }
  if (n < 8) return 1;
  bool little;
  if (d[0] == 'I' && d[1] == 'I') little = true;
  else if (d[0] == 'M' && d[1] == 'M') little = false;
  else return 1;
  auto u16 = [&](size_t off) { return little ? le16(d + off) : be16(d + off); };
  auto u32 = [&](size_t off) { return little ? le32(d + off) : be32(d + off); };
  if (u16(2) != 42) return 1;
  size_t ifd = u32(4);
  if (ifd + 2 > n) return 1;
  size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    size_t e = ifd + 2 + 12 * i;
    if (e + 12 > n) return 1;
    if (u16(e) == 0x0112) {
      uint32_t type = u16(e + 2);
      uint32_t v = type == 3 ? u16(e + 8) : (type == 4 ? u32(e + 8) : 0);
      return (v >= 1 && v <= 8) ? int(v) : 1;
    }
  }
  return 1;
}

bool swaps_axes(int orientation) { return orientation >= 5 && orientation <= 8; }

std::optional<ImageInfo> parse_png(const std::vector<uint8_t>& b) {
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (b.size() < 33 || std::memcmp(b.data(), sig, 8) != 0) return std::nullopt;
  if (std::memcmp(b.data() + 12, "IHDR", 4) != 0) return std::nullopt;
  ImageInfo info;
  info.format = "png";
  info.width = be32(b.data() + 16);
  info.height = be32(b.data() + 20);
  // Look for an eXIf chunk before the image data.
  size_t pos = 8;
  while (pos + 8 <= b.size()) {
    uint64_t len = be32(b.data() + pos);
    const uint8_t* type = b.data() + pos + 4;
    if (std::memcmp(type, "IDAT", 4) == 0 || std::memcmp(type, "IEND", 4) == 0) break;
    if (pos + 8 + len > b.size()) break;
    if (std::memcmp(type, "eXIf", 4) == 0) {
      info.orientation = tiff_orientation(b.data() + pos + 8, len);
      break;
    }
    pos += 12 + len;
  }
  return info;
}

std::optional<ImageInfo> parse_jpeg(const std::vector<uint8_t>& b) {
  if (b.size() < 4 || b[0] != 0xFF || b[1] != 0xD8) return std::nullopt;
  ImageInfo info;
  info.format = "jpeg";
  size_t pos = 2;
  while (pos + 4 <= b.size()) {
    if (b[pos] != 0xFF) return std::nullopt;
    uint8_t m = b[pos + 1];
    if (m == 0xFF) { ++pos; continue; }  // fill byte
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) { pos += 2; continue; }
    if (m == 0xD9 || m == 0xDA) return std::nullopt;  // no SOF before scan data
    size_t len = be16(b.data() + pos + 2);
    if (len < 2 || pos + 2 + len > b.size()) return std::nullopt;
    const uint8_t* seg = b.data() + pos + 4;
    size_t seg_len = len - 2;
    if (m == 0xE1 && seg_len >= 6 && std::memcmp(seg, "Exif\0\0", 6) == 0) {
      info.orientation = tiff_orientation(seg, seg_len);
    } else if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      if (seg_len < 5) return std::nullopt;
      info.height = be16(seg + 1);
      info.width = be16(seg + 3);
      return info;  // Exif (APP1) precedes SOF in valid files
    }
    pos += 2 + len;
  }
  return std::nullopt;
}

std::optional<ImageInfo> parse_webp(const std::vector<uint8_t>& b) {
  if (b.size() < 30 || std::memcmp(b.data(), "RIFF", 4) != 0 ||
      std::memcmp(b.data() + 8, "WEBP", 4) != 0)
    return std::nullopt;
  ImageInfo info;
  info.format = "webp";
  bool have_size = false;
  size_t pos = 12;
  while (pos + 8 <= b.size()) {
    const uint8_t* fourcc = b.data() + pos;
    uint64_t len = le32(b.data() + pos + 4);
    const uint8_t* d = b.data() + pos + 8;
    size_t avail = b.size() - pos - 8;
    if (std::memcmp(fourcc, "VP8X", 4) == 0 && avail >= 10) {
      info.width = le24(d + 4) + 1;
      info.height = le24(d + 7) + 1;
      have_size = true;
    } else if (std::memcmp(fourcc, "VP8 ", 4) == 0 && avail >= 10 && !have_size) {
      if (d[3] != 0x9D || d[4] != 0x01 || d[5] != 0x2A) return std::nullopt;
      info.width = le16(d + 6) & 0x3FFF;
      info.height = le16(d + 8) & 0x3FFF;
      return info;  // simple format: no EXIF chunk
    } else if (std::memcmp(fourcc, "VP8L", 4) == 0 && avail >= 5 && !have_size) {
      if (d[0] != 0x2F) return std::nullopt;
      uint32_t bits = le32(d + 1);
      info.width = (bits & 0x3FFF) + 1;
      info.height = ((bits >> 14) & 0x3FFF) + 1;
      return info;
    } else if (std::memcmp(fourcc, "EXIF", 4) == 0 && len <= avail) {
      info.orientation = tiff_orientation(d, len);
    }
    pos += 8 + len + (len & 1);
  }
  if (!have_size) return std::nullopt;
  return info;
}

void check_pixel_count(int64_t width, int64_t height, const std::string& what) {
  VLM_CHECK(width <= kMaxImagePixels / std::max<int64_t>(height, 1), "image '", what, "' is ", width,
            "x", height, " = ", static_cast<double>(width) * static_cast<double>(height),
            " pixels, more than the limit of ", kMaxImagePixels,
            " (hint: a decompression bomb or a corrupt header; downscale the image if it is real)");
}

// Samples -> 8 bits as Pillow decodes them: 16-bit keeps the high byte (v >> 8, Pillow's
// RGB;16B / RGBA;16B raw modes), float is scaled from [0, 1]. raw: any depth, 1-4 channels.
cv::Mat to_8bit(const cv::Mat& raw, const std::string& what) {
  switch (raw.depth()) {
    case CV_8U: return raw;
    case CV_16U: {
      cv::Mat m8(raw.size(), CV_MAKETYPE(CV_8U, raw.channels()));
      const int n = raw.cols * raw.channels();
      for (int y = 0; y < raw.rows; ++y) {
        const uint16_t* src = raw.ptr<uint16_t>(y);
        uint8_t* dst = m8.ptr<uint8_t>(y);
        for (int i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(src[i] >> 8);
      }
      return m8;
    }
    case CV_32F:
    case CV_64F: {
      cv::Mat m8;
      raw.convertTo(m8, CV_8U, 255.0);
      return m8;
    }
    default:
      throw vlm::Error(vlm::str("image '", what, "' has unsupported pixel depth ", raw.depth(),
                                " (hint: convert it to 8- or 16-bit)"));
  }
}

// Gray+alpha or BGRA (8-bit) -> RGB composited over opaque white, bit-identical to
// PIL.Image.alpha_composite(white, image) (HF's convert_to_rgb): out = round((c a + 255 (255
// - a)) / 255) in integers (no ties: 255 is odd).
cv::Mat composite_over_white(const cv::Mat& m8) {
  const int nc = m8.channels();
  cv::Mat rgb(m8.size(), CV_8UC3);
  for (int y = 0; y < m8.rows; ++y) {
    const uint8_t* src = m8.ptr<uint8_t>(y);
    uint8_t* dst = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < m8.cols; ++x, src += nc, dst += 3) {
      const uint32_t a = src[nc - 1];
      const uint8_t bgr[3] = {src[0], src[nc == 4 ? 1 : 0], src[nc == 4 ? 2 : 0]};
      for (int c = 0; c < 3; ++c)
        dst[c] = static_cast<uint8_t>((bgr[2 - c] * a + 255 * (255 - a) + 127) / 255);
    }
  }
  return rgb;
}

// ---- CMYK / YCCK JPEG: OpenCV converts CMYK with its own approximation (x k >> 8), so
// these files are decoded here with libjpeg, as Pillow decodes them.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_quiet(j_common_ptr, int) {}  // warnings (e.g. a truncated file) are not printed

// Decodes a JPEG with libjpeg: 4 components to their raw samples [h, w, 4] (Adobe-inverted
// CMYK, as stored; YCCK is converted to CMYK by libjpeg), 3 components (YCbCr or RGB) to RGB
// [h, w, 3] in one pass (what OpenCV's decoder computes, without its BGR order and our swap
// back), into `out`. Returns 0 for another number of components (left to OpenCV), 1 when
// decoded, -1 on a libjpeg error (message in `error`), -2 when the header announces more
// than kMaxImagePixels. scale_denom 1 (full size), 2, 4 or 8: libjpeg's DCT scaling.
// No C++ object with a destructor lives in this frame across setjmp.
int decode_jpeg_libjpeg(const std::vector<uint8_t>& bytes, int scale_denom, cv::Mat& out,
                        char* error) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_quiet;
  if (setjmp(err.jump)) {
    std::memcpy(error, err.message, JMSG_LENGTH_MAX);
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.num_components != 4 && cinfo.num_components != 3) {
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  if (static_cast<uint64_t>(cinfo.image_width) * cinfo.image_height > kMaxImagePixels) {
    jpeg_destroy_decompress(&cinfo);
    return -2;
  }
  const bool cmyk = cinfo.num_components == 4;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.scale_num = 1;  // DCT scaling: output ceil(size / scale_denom)
  cinfo.scale_denom = static_cast<unsigned int>(scale_denom);
  jpeg_start_decompress(&cinfo);
  out.create(static_cast<int>(cinfo.output_height), static_cast<int>(cinfo.output_width),
             cmyk ? CV_8UC4 : CV_8UC3);
  JSAMPROW rows[16];
  while (cinfo.output_scanline < cinfo.output_height) {
    const int y = static_cast<int>(cinfo.output_scanline);
    const int n = std::min<int>(16, out.rows - y);
    for (int i = 0; i < n; ++i) rows[i] = out.ptr<uint8_t>(y + i);
    jpeg_read_scanlines(&cinfo, rows, static_cast<JDIMENSION>(n));
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return 1;
}

// Adobe-inverted CMYK [h, w, 4] -> RGB [h, w, 3] as Pillow: rawmode "CMYK;I" (C = 255 - c'),
// then cmyk2rgb: R = (255 - K) - MULDIV255(C, 255 - K), the same for G (M) and B (Y).
cv::Mat inverted_cmyk_to_rgb(const cv::Mat& cmyk) {
  cv::Mat rgb(cmyk.size(), CV_8UC3);
  for (int y = 0; y < cmyk.rows; ++y) {
    const uint8_t* src = cmyk.ptr<uint8_t>(y);
    uint8_t* dst = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < cmyk.cols; ++x, src += 4, dst += 3) {
      const int nk = src[3];  // 255 - K
      for (int c = 0; c < 3; ++c) {
        const int t = (255 - src[c]) * nk + 128;
        dst[c] = static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
      }
    }
  }
  return rgb;
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  VLM_CHECK(in.good(), "cannot open image '", path, "' (hint: check the path and the ",
            "dataset's image_root)");
  const std::streamoff size = in.tellg();
  if (size < 0) {  // not seekable (a pipe): read it as a stream
    std::ifstream stream(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(stream)),
                               std::istreambuf_iterator<char>());
    VLM_CHECK(!stream.bad(), "error reading image '", path, "'");
    return bytes;
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);  // one read, not a byte iterator
  VLM_CHECK(!in.bad() && in.gcount() == size, "error reading image '", path, "'");
  return bytes;
}

std::optional<ImageInfo> parse_image_header(const std::vector<uint8_t>& bytes) {
  std::optional<ImageInfo> info = parse_png(bytes);
  if (!info) info = parse_jpeg(bytes);
  if (!info) info = parse_webp(bytes);
  if (info && swaps_axes(info->orientation)) std::swap(info->width, info->height);
  return info;
}

int exif_orientation(const std::vector<uint8_t>& bytes) {
  std::optional<ImageInfo> info = parse_png(bytes);
  if (!info) info = parse_jpeg(bytes);
  if (!info) info = parse_webp(bytes);
  return info ? info->orientation : 1;
}

ImageInfo probe_image(const std::string& path) {
  std::vector<uint8_t> bytes = read_file_bytes(path);
  VLM_CHECK(!bytes.empty(), "image '", path, "' is an empty file");
  std::optional<ImageInfo> info = parse_image_header(bytes);
  if (!info) {
    cv::Mat m = decode_image_rgb(bytes, path);
    info = ImageInfo{m.cols, m.rows, 1, "other"};
  }
  VLM_CHECK(info->width > 0 && info->height > 0, "image '", path, "' has zero size (",
            info->width, "x", info->height, ")");
  check_pixel_count(info->width, info->height, path);
  return *info;
}

cv::Mat apply_orientation(const cv::Mat& image, int orientation) {
  cv::Mat out;
  switch (orientation) {
    case 2: cv::flip(image, out, 1); return out;                           // mirror
    case 3: cv::rotate(image, out, cv::ROTATE_180); return out;
    case 4: cv::flip(image, out, 0); return out;                           // flip vertical
    case 5: cv::transpose(image, out); return out;                         // transpose
    case 6: cv::rotate(image, out, cv::ROTATE_90_CLOCKWISE); return out;
    case 7: cv::transpose(image, out); cv::rotate(out, out, cv::ROTATE_180); return out;  // transverse
    case 8: cv::rotate(image, out, cv::ROTATE_90_COUNTERCLOCKWISE); return out;
    default: return image;
  }
}

cv::Mat decode_image_rgb(const std::vector<uint8_t>& bytes, const std::string& what) {
  return decode_image_rgb(bytes, what, 1);
}

cv::Mat decode_image_rgb(const std::vector<uint8_t>& bytes, const std::string& what,
                         int jpeg_scale_denom) {
  VLM_CHECK(jpeg_scale_denom == 1 || jpeg_scale_denom == 2 || jpeg_scale_denom == 4 ||
                jpeg_scale_denom == 8,
            "decode_image_rgb: jpeg_scale_denom must be 1, 2, 4 or 8, got ", jpeg_scale_denom);
  VLM_CHECK(!bytes.empty(), "image '", what, "' is an empty file");
  if (std::optional<ImageInfo> info = parse_image_header(bytes))
    check_pixel_count(info->width, info->height, what);  // before OpenCV allocates anything
  if (bytes.size() > 2 && bytes[0] == 0xFF && bytes[1] == 0xD8) {  // JPEG: colour or CMYK
    cv::Mat m;
    char error[JMSG_LENGTH_MAX] = {0};
    const int r = decode_jpeg_libjpeg(bytes, jpeg_scale_denom, m, error);
    VLM_CHECK(r != -2, "image '", what, "' (JPEG) announces more than ", kMaxImagePixels,
              " pixels (hint: a decompression bomb or a corrupt header)");
    VLM_CHECK(r >= 0, "cannot decode image '", what, "' (JPEG): ", error);
    if (r == 1)
      return apply_orientation(m.channels() == 4 ? inverted_cmyk_to_rgb(m) : m,
                               exif_orientation(bytes));
  }
  cv::Mat raw;
  try {
    raw = cv::imdecode(bytes, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    throw vlm::Error(vlm::str("cannot decode image '", what, "': ", e.what()));
  }
  VLM_CHECK(!raw.empty() && raw.rows > 0 && raw.cols > 0, "cannot decode image '", what,
            "' (", bytes.size(), " bytes; hint: corrupt file or unsupported format; ",
            "supported: JPEG, PNG, WebP, TIFF, BMP)");
  check_pixel_count(raw.cols, raw.rows, what);  // formats without a header parser here
  const cv::Mat m8 = to_8bit(raw, what);
  cv::Mat rgb;
  switch (m8.channels()) {  // OpenCV decodes to BGR / BGRA
    case 1: cv::cvtColor(m8, rgb, cv::COLOR_GRAY2RGB); break;
    case 3: cv::cvtColor(m8, rgb, cv::COLOR_BGR2RGB); break;
    case 2:
    case 4: rgb = composite_over_white(m8); break;
    default:
      throw vlm::Error(vlm::str("image '", what, "' has ", m8.channels(),
                                " channels; expected 1 to 4"));
  }
  return apply_orientation(rgb, exif_orientation(bytes));
}

cv::Mat decode_image_rgb(const std::string& path) {
  return decode_image_rgb(read_file_bytes(path), path);
}

}  // namespace vlm::data

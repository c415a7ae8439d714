#include "data/image_source.h"

#include <array>
#include <fstream>

#include "data/dataset.h"
#include "data/image.h"
#include "vlm/runtime/check.h"

namespace vlm::data {
namespace {

// Max length of a string ms-swift still treats as a path when it is no existing file.
constexpr size_t kMaxPathLikeLength = 200;

bool is_b64_char(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/' || c == '-' || c == '_' || c == '=';
}

bool b64_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::array<int8_t, 256> b64_table() {
  std::array<int8_t, 256> t{};
  t.fill(-1);
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(a[i])] = static_cast<int8_t>(i);
  t['-'] = 62;  // URL-safe alphabet
  t['_'] = 63;
  return t;
}

}  // namespace

ImageSourceKind classify_image_source(const std::string& s) {
  if (s.rfind("data:", 0) == 0) return ImageSourceKind::kDataUri;
  if (s.size() <= kMaxPathLikeLength) return ImageSourceKind::kPath;
  for (unsigned char c : s)
    if (!is_b64_char(c) && !b64_space(c)) return ImageSourceKind::kPath;
  return ImageSourceKind::kBase64;
}

std::string base64_payload(const std::string& s) {
  if (classify_image_source(s) != ImageSourceKind::kDataUri) return s;
  const size_t comma = s.find(',');
  VLM_CHECK(comma != std::string::npos, "data URI without a ',' (expected data:image/...;base64,...)");
  const std::string head = s.substr(0, comma);
  VLM_CHECK(head.size() >= 7 && head.compare(head.size() - 7, 7, ";base64") == 0,
            "data URI '", head.substr(0, 60), "' is not base64 (expected data:image/...;base64,...)");
  return s.substr(comma + 1);
}

std::vector<uint8_t> decode_base64(const char* data, size_t size) {
  static const std::array<int8_t, 256> table = b64_table();
  std::vector<uint8_t> out;
  out.reserve(size / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (size_t i = 0; i < size; ++i) {
    const unsigned char c = static_cast<unsigned char>(data[i]);
    if (b64_space(c)) continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    const int8_t v = table[c];
    VLM_CHECK(v >= 0 && pad == 0, "invalid base64: character ",
              (c >= 32 && c < 127) ? "'" + std::string(1, char(c)) + "'" : str("byte ", int(c)),
              " at position ", i, pad ? " (after '=' padding)" : "");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xFF));
    }
  }
  VLM_CHECK(bits < 6, "invalid base64: truncated (a lone trailing character)");
  VLM_CHECK(pad <= 2, "invalid base64: ", pad, " '=' padding characters");
  return out;
}

std::string encode_base64(const std::vector<uint8_t>& bytes) {
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) n |= uint32_t(bytes[i + 2]);
    out += a[(n >> 18) & 63];
    out += a[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? a[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? a[n & 63] : '=';
  }
  return out;
}

std::vector<uint8_t> read_image_bytes(const ImageRef& ref) {
  if (!ref.embedded) return read_file_bytes(ref.path);
  if (ref.embedded_text) return decode_base64(*ref.embedded_text);
  std::ifstream in(ref.embedded_file, std::ios::binary);
  VLM_CHECK(in.good(), "cannot open dataset file '", ref.embedded_file, "' to read ", ref.path);
  std::string text(static_cast<size_t>(ref.embedded_length), '\0');
  in.seekg(ref.embedded_offset);
  in.read(text.data(), ref.embedded_length);
  VLM_CHECK(in.gcount() == ref.embedded_length, "dataset file '", ref.embedded_file,
            "' is shorter than when it was indexed (reading ", ref.path,
            "; hint: the file changed during the run)");
  return decode_base64(text);
}

}  // namespace vlm::data

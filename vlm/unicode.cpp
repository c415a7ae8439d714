// UTF-8 helpers, NFC through utf8proc, byte-level alphabet.
#include "vlm/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "vlm/check.h"

namespace vlm::unicode {
namespace {

// Length of the valid UTF-8 prefix starting at s[i] (1..4 when a full code point is
// valid; `*complete` tells whether the prefix is a whole code point). Follows the
// Unicode "maximal subpart" rules: the second byte's range depends on the lead byte.
size_t valid_prefix(std::string_view s, size_t i, bool* complete) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;  // invalid lead byte
  }
  size_t n = 1;
  for (; n < need && i + n < s.size(); ++n) {
    const auto b = static_cast<unsigned char>(s[i + n]);
    const unsigned char l = n == 1 ? lo : 0x80, h = n == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  *complete = n == need;
  return n;
}

std::string utf8proc_apply(std::string_view s, int options, const char* what) {
  size_t bad = first_invalid_utf8(s);
  VLM_CHECK(bad == std::string::npos, what, ": expected valid UTF-8 text, found an invalid byte 0x",
            std::hex, static_cast<int>(static_cast<unsigned char>(s[bad])), std::dec,
            " at byte offset ", bad, " (hint: convert the input to UTF-8)");
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
  VLM_CHECK(n >= 0, what, ": utf8proc failed: ", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, void (*)(void*)> hold(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace

size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    bool complete = false;
    size_t n = valid_prefix(s, i, &complete);
    if (!complete) return i;
    i += n;
  }
  return std::string::npos;
}

bool is_valid_utf8(std::string_view s) { return first_invalid_utf8(s) == std::string::npos; }

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string nfc(std::string_view s) {
  if (is_ascii(s)) return std::string(s);
  return utf8proc_apply(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE, "NFC normalisation");
}

std::string nfd(std::string_view s) {
  if (is_ascii(s)) return std::string(s);
  return utf8proc_apply(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, "NFD normalisation");
}

std::string repair_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool complete = false;
    size_t n = valid_prefix(bytes, i, &complete);
    if (complete) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

namespace {
struct ByteTables {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 324> to_byte;  // code points < 0x144 only
  ByteTables() {
    to_byte.fill(-1);
    std::array<char32_t, 256> cp{};
    std::array<bool, 256> direct{};
    for (int b = 0; b < 256; ++b)
      direct[b] = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? static_cast<char32_t>(b) : next++;
    for (int b = 0; b < 256; ++b) {
      append_utf8(to_char[b], cp[b]);
      to_byte[cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables tables;  // immutable after construction (thread-safe init)
  return tables;
}
}  // namespace

const std::array<std::string, 256>& byte_to_char() { return byte_tables().to_char; }

int char_to_byte(char32_t cp) {
  const auto& t = byte_tables().to_byte;
  return cp < t.size() ? t[cp] : -1;
}

}  // namespace vlm::unicode

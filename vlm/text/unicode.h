// UTF-8 helpers for the tokenizers: validation, code point iteration, NFC (utf8proc),
// lossy repair of byte strings, and the GPT-2 byte <-> printable-character table used by
// byte-level BPE (HF `ByteLevel` pre-tokenizer / decoder).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace vlm::unicode {

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool is_valid_utf8(std::string_view s);

// Byte offset of the first invalid sequence in `s`, or std::string::npos if valid.
size_t first_invalid_utf8(std::string_view s);

// Decodes the code point starting at s[i] (which must be valid UTF-8) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);

// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(std::string& out, char32_t cp);

// Canonical composition (NFC) via utf8proc (its Unicode version). ASCII input is returned
// unchanged without a call into utf8proc. Throws vlm::Error on invalid UTF-8 (with the
// byte offset). The OCR metrics normalise with this.
std::string nfc(std::string_view s);
// NFC as HF tokenizers' normaliser computes it, with Unicode 9.0 data: code points
// assigned after 9.0 are passed through and normalisation does not reach across them (see
// unicode.cpp). The tokenizer and the chat template use this, so ids equal HF's.
std::string nfc_hf(std::string_view s);
// Canonical decomposition (NFD); used by tests to build NFC/NFD pairs.
std::string nfd(std::string_view s);

// Decodes bytes as UTF-8, replacing each maximal invalid subpart with U+FFFD (like
// Python's bytes.decode("utf-8", errors="replace"), which HF decoders use).
std::string repair_utf8(std::string_view bytes);

// GPT-2 byte-level alphabet: byte b <-> one printable code point (printable Latin-1
// bytes map to themselves, the other 68 bytes to U+0100..U+0143 in byte order).
// byte_to_char()[b] is the UTF-8 encoding of that code point.
const std::array<std::string, 256>& byte_to_char();
// Inverse: the byte for code point `cp`, or -1 if `cp` is not in the alphabet.
int char_to_byte(char32_t cp);

}  // namespace vlm::unicode

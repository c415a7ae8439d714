#include "data/record_reader.h"

#include "vlm/runtime/check.h"

namespace vlm::data {
namespace {
constexpr size_t kBufferBytes = size_t(1) << 20;
bool reader_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
}  // namespace

RecordReader::RecordReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
  VLM_CHECK(in_.good(), "cannot open dataset file '", path, "' (hint: check the path)");
  buf_.resize(kBufferBytes);
  // UTF-8 byte order mark.
  if (peek() == 0xEF) {
    get();
    if (peek() == 0xBB) get();
    if (peek() == 0xBF) get();
  }
  skip_space();
  if (peek() == '[') {
    array_ = true;
    get();
  }
}

int RecordReader::peek() {
  if (pos_ == len_) {
    if (eof_) return -1;
    in_.read(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    len_ = static_cast<size_t>(in_.gcount());
    pos_ = 0;
    if (len_ == 0) {
      eof_ = true;
      return -1;
    }
  }
  return static_cast<unsigned char>(buf_[pos_]);
}

int RecordReader::get() {
  const int c = peek();
  if (c < 0) return c;
  ++pos_;
  ++offset_;
  if (c == '\n') ++line_;
  return c;
}

void RecordReader::skip_space() {
  while (reader_space(peek())) get();
}

bool RecordReader::next(RawRecord& out) { return array_ ? next_element(out) : next_line(out); }

bool RecordReader::next_line(RawRecord& out) {
  for (;;) {
    if (peek() < 0) return false;
    out = RawRecord{};
    out.offset = offset_;
    out.line = out.number = line_;
    int c;
    while ((c = get()) >= 0 && c != '\n') out.text.push_back(static_cast<char>(c));
    if (!out.text.empty() && out.text.back() == '\r') out.text.pop_back();
    if (out.text.find_first_not_of(" \t") != std::string::npos) return true;
  }
}

bool RecordReader::next_element(RawRecord& out) {
  if (finished_) return false;
  for (;;) {  // separators (a stray extra ',' is tolerated)
    skip_space();
    if (peek() != ',') break;
    get();
  }
  int c = peek();
  out = RawRecord{};
  out.number = number_ + 1;
  out.line = line_;
  out.offset = offset_;
  if (c < 0) {
    finished_ = true;
    out.error = "unexpected end of file: the JSON array is not closed (missing ']')";
    return true;
  }
  if (c == ']') {
    get();
    skip_space();
    finished_ = true;
    if (peek() < 0) return false;
    out.error = "text after the closing ']' of the JSON array";
    return true;
  }
  ++number_;
  if (c == '{' || c == '[' || c == '"') {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (;;) {
      c = get();
      if (c < 0) {
        finished_ = true;
        out.error = "unexpected end of file inside the record (unterminated string or missing '}')";
        return true;
      }
      out.text.push_back(static_cast<char>(c));
      if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') {
          in_string = false;
          if (depth == 0) break;  // a bare string element
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth <= 0) {
        break;
      }
    }
  } else {  // a bare scalar (not a record; the caller reports it)
    while ((c = peek()) >= 0 && c != ',' && c != ']' && !reader_space(c))
      out.text.push_back(static_cast<char>(get()));
  }
  return true;
}

}  // namespace vlm::data

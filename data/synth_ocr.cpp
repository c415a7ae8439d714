#include "data/synth_ocr.h"

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "data/sampler.h"
#include "vlm/runtime/check.h"
#include "vlm/text/sp_tokenizer.h"

namespace vlm::data {
namespace fs = std::filesystem;
namespace {

// Small deterministic RNG on top of the sampler's splitmix64 helpers.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  int64_t below(int64_t n) { return int64_t(uniform_below(uint64_t(n), state)); }
  int64_t range(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }  // inclusive
  double unit() { return double(uniform_below(1ull << 53, state)) / double(1ull << 53); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * unit(); }
  bool chance(double p) { return unit() < p; }
  template <typename T> const T& pick(const std::vector<T>& v) { return v[size_t(below(int64_t(v.size())))]; }
};

const std::vector<std::string>& words() {
  static const std::vector<std::string> w = {
      "total", "invoice", "date", "amount", "paid", "due", "name", "city", "street", "order",
      "price", "number", "page", "item", "tax", "balance", "account", "phone", "email", "box",
      "north", "south", "east", "west", "river", "green", "blue", "red", "black", "white",
      "apple", "bread", "milk", "water", "coffee", "sugar", "rice", "salt", "paper", "glass",
      "house", "road", "park", "hotel", "bank", "store", "market", "school", "office", "room",
      "open", "closed", "exit", "entry", "stop", "slow", "left", "right", "up", "down",
      "first", "second", "third", "last", "next", "new", "old", "big", "small", "long",
      "data", "model", "train", "test", "value", "result", "check", "card", "code", "type",
      "march", "april", "june", "july", "monday", "friday", "week", "year", "hour", "time",
      "light", "power", "gold", "silver", "stone", "tree", "sun", "moon", "star", "sky"};
  return w;
}

std::string digits(Rng& r, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += char('0' + r.below(10));
  return s;
}

std::string pad2(int64_t v) { return (v < 10 ? "0" : "") + std::to_string(v); }

std::string casing(Rng& r, std::string w) {
  const int64_t k = r.below(4);
  if (k == 1) w[0] = char(std::toupper(w[0]));
  if (k == 2) for (char& c : w) c = char(std::toupper(c));
  return w;
}

std::string candidate(Rng& r) {
  switch (r.below(6)) {
    case 0: {  // one to three words
      std::string s = casing(r, r.pick(words()));
      const int64_t extra = r.below(3);
      for (int64_t i = 0; i < extra; ++i) s += " " + casing(r, r.pick(words()));
      return s;
    }
    case 1: {  // numbers
      const int64_t k = r.below(3);
      if (k == 0) return digits(r, r.range(1, 3)) + "," + digits(r, 3);
      if (k == 1) return std::to_string(r.range(1, 99999)) + "." + digits(r, 2);
      return std::to_string(r.range(1000, 99999999));
    }
    case 2: {  // dates
      const int64_t y = r.range(1990, 2030), m = r.range(1, 12), d = r.range(1, 28);
      const int64_t k = r.below(3);
      if (k == 0) return std::to_string(y) + "-" + pad2(m) + "-" + pad2(d);
      if (k == 1) return pad2(d) + "/" + pad2(m) + "/" + std::to_string(y);
      return pad2(d) + "." + pad2(m) + "." + pad2(y % 100);
    }
    case 3: {  // codes
      std::string s;
      for (int64_t i = r.range(2, 3); i > 0; --i) s += char('A' + r.below(26));
      return s + (r.chance(0.5) ? "-" : " ") + digits(r, r.range(3, 5));
    }
    case 4: {  // prices
      const std::string amount = std::to_string(r.range(0, 999)) + "." + digits(r, 2);
      const int64_t k = r.below(3);
      if (k == 0) return "$" + amount;
      if (k == 1) return "EUR " + amount;
      return amount + " USD";
    }
    default: {  // label: value
      return casing(r, r.pick(words())) + ": " + digits(r, r.range(2, 4));
    }
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  VLM_CHECK(out.good(), "cannot write '", path, "' (hint: check --out)");
  out << text;
  VLM_CHECK(out.good(), "error writing '", path, "'");
}

}  // namespace

const std::vector<std::string>& chatml_special_tokens() {
  static const std::vector<std::string> t = {
      "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
      "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"};
  return t;
}

std::string synth_text(uint64_t stream_seed, int64_t min_chars, int64_t max_chars) {
  Rng r(stream_seed);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::string s = candidate(r);
    if (int64_t(s.size()) > max_chars) continue;
    while (int64_t(s.size()) < min_chars) s += " " + candidate(r);
    if (int64_t(s.size()) <= max_chars) return s;
  }
  throw vlm::Error(vlm::str("synth_text: could not make a line of ", min_chars, "..", max_chars,
                            " characters (hint: widen the range)"));
}

namespace {

// Background/foreground colours: dark on light, sometimes light on dark.
void pick_colours(Rng& r, cv::Scalar& bg, cv::Scalar& fg, bool clean) {
  const int bg_level = int(r.range(170, 255)), fg_level = int(r.range(0, 90));
  const int tint = int(r.range(-20, 20));
  bg = cv::Scalar(bg_level, std::clamp(bg_level + tint, 0, 255), std::clamp(bg_level - tint, 0, 255));
  fg = cv::Scalar(fg_level, std::clamp(fg_level - tint, 0, 255), std::clamp(fg_level + tint, 0, 255));
  if (!clean && r.chance(0.15)) std::swap(bg, fg);
}

// Small rotation, sometimes blur, then sensor noise (clean: noise only, and less).
void degrade(cv::Mat& img, Rng& r, uint64_t stream_seed, bool clean) {
  const double angle = clean ? 0.0 : r.uniform(-2.0, 2.0);
  if (std::abs(angle) > 0.2) {
    cv::Mat rot = cv::getRotationMatrix2D(cv::Point2f(img.cols / 2.0f, img.rows / 2.0f), angle, 1.0);
    cv::warpAffine(img, img, rot, img.size(), cv::INTER_LINEAR, cv::BORDER_REPLICATE);
  }
  if (!clean && r.chance(0.3)) {
    const double sigma = r.uniform(0.4, 1.0);
    cv::GaussianBlur(img, img, cv::Size(0, 0), sigma);
  }
  const double noise = r.uniform(0.0, clean ? 4.0 : 8.0);
  if (noise > 1.0) {
    cv::Mat n(img.size(), CV_16SC3);
    cv::RNG cvr(mix_seed(stream_seed, 23));
    cvr.fill(n, cv::RNG::NORMAL, 0.0, noise);
    cv::Mat acc;
    img.convertTo(acc, CV_16SC3);
    acc += n;
    acc.convertTo(img, CV_8UC3);  // saturates
  }
}

// Stroke width in pixels for a Hershey font drawn at `scale`: 2 px, sometimes 3 on large
// glyphs. Never 1: the tiny preset learns nothing from 1-px hairlines (a 4-16 digit probe
// stays at CER 1.0, versus 0.09 at 2 px; docs/notes/tiny_convergence.md).
int stroke_px(double scale, Rng& r) {
  return (scale > 1.2 && r.chance(0.4)) ? 3 : 2;
}

int pick_font(Rng& r, bool clean) {
  static const std::vector<int> fonts = {cv::FONT_HERSHEY_SIMPLEX, cv::FONT_HERSHEY_DUPLEX,
                                         cv::FONT_HERSHEY_COMPLEX, cv::FONT_HERSHEY_TRIPLEX};
  static const std::vector<int> sans = {cv::FONT_HERSHEY_SIMPLEX, cv::FONT_HERSHEY_DUPLEX};
  int font = r.pick(clean ? sans : fonts);
  if (!clean && r.chance(0.15)) font |= cv::FONT_ITALIC;
  return font;
}

}  // namespace

cv::Mat render_text_line(const std::string& text, uint64_t stream_seed, int64_t min_height,
                         int64_t max_height, bool clean) {
  Rng r(mix_seed(stream_seed, 17));
  const int font = pick_font(r, clean);
  const int height = int(r.range(min_height, max_height));
  const double glyph_frac = r.uniform(0.45, 0.65);   // cap height / image height
  int base = 0;
  cv::Size unit = cv::getTextSize(text, font, 1.0, 1, &base);
  double scale = glyph_frac * height / std::max(1, unit.height);
  const int thickness = stroke_px(scale, r);
  cv::Size sz = cv::getTextSize(text, font, scale, thickness, &base);
  const int margin_l = int(r.range(3, 12)), margin_r = int(r.range(3, 12));
  const int width = std::max(sz.width + margin_l + margin_r, 28);
  cv::Scalar bg, fg;
  pick_colours(r, bg, fg, clean);
  cv::Mat img(height, width, CV_8UC3, bg);
  const int baseline_y = (height + sz.height) / 2 - int(r.range(-2, 2));
  cv::putText(img, text, cv::Point(margin_l, baseline_y), font, scale, fg, thickness,
              cv::LINE_AA);
  degrade(img, r, stream_seed, clean);
  return img;
}

cv::Mat render_grid_line(const std::string& text, uint64_t stream_seed, int64_t cell_width,
                         int64_t canvas_cells, int64_t height, bool clean) {
  VLM_CHECK(cell_width >= 8 && height >= 8 && int64_t(text.size()) < canvas_cells,
            "synth-ocr grid: ", text.size(), " characters need a canvas of more than that many ",
            "cells (got ", canvas_cells, ") of at least 8 px (got ", cell_width, ") and height >= 8 (got ",
            height, ")");
  Rng r(mix_seed(stream_seed, 19));
  const int font = pick_font(r, clean);
  const double glyph_frac = r.uniform(0.40, 0.60);   // cap height / image height
  int base = 0;
  // One scale for the whole line: the cap height, shrunk until the widest glyph fits a cell.
  const cv::Size cap = cv::getTextSize("H", font, 1.0, 1, &base);
  int widest = 1;
  for (char c : text) widest = std::max(widest, cv::getTextSize(std::string(1, c), font, 1.0, 1, &base).width);
  double scale = std::min(glyph_frac * double(height) / std::max(1, cap.height),
                          0.92 * double(cell_width) / widest);
  const int thickness = stroke_px(scale, r);
  const int offset = int(r.range(0, std::max<int64_t>(0, cell_width / 8)));  // small whole-line shift
  const int baseline_y = int(height + scale * cap.height) / 2 - int(r.range(-2, 2));
  cv::Scalar bg, fg;
  pick_colours(r, bg, fg, clean);
  cv::Mat img(int(height), int(canvas_cells * cell_width), CV_8UC3, bg);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ' ') continue;
    const std::string g(1, text[i]);
    const cv::Size sz = cv::getTextSize(g, font, scale, thickness, &base);
    const int x = offset + int(i) * int(cell_width) + (int(cell_width) - sz.width) / 2;
    cv::putText(img, g, cv::Point(x, baseline_y), font, scale, fg, thickness, cv::LINE_AA);
  }
  degrade(img, r, stream_seed, clean);
  return img;
}

namespace {

constexpr const char* kGenerator = "vlmtrain synth-ocr";  // synth_ocr.json "generator"

// The options that decide what a set contains, as synth_ocr.json records them (and as
// synth_ocr_refresh_reason() compares them). The grid layout renders every line max_height
// px high.
nlohmann::json render_settings(const SynthOcrOptions& opts) {
  const bool grid = opts.layout == "grid";
  return {{"seed", opts.seed},
          {"train", opts.train},
          {"val", opts.val},
          {"chars", {opts.min_chars, opts.max_chars}},
          {"height", {grid ? opts.max_height : opts.min_height, opts.max_height}},
          {"layout", opts.layout},
          {"style", opts.style},
          {"tokenizer_type", opts.tokenizer_type},
          {"vocab_size", opts.vocab_size}};
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- minimal protobuf wire-format helpers (only what rewriting two strings needs)
uint64_t read_varint(const std::string& b, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    VLM_CHECK(at < b.size(), "synth-ocr: truncated varint in the sentencepiece model");
    const uint8_t c = uint8_t(b[at++]);
    v |= uint64_t(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
  throw vlm::Error("synth-ocr: varint longer than 10 bytes in the sentencepiece model");
}

void write_varint(std::string& out, uint64_t v) {
  do {
    uint8_t c = uint8_t(v & 0x7f);
    v >>= 7;
    if (v) c |= 0x80;
    out.push_back(char(c));
  } while (v);
}

// Calls fn(field, wire_type, raw bytes of the whole field incl. key, payload) per field.
template <typename Fn>
void for_each_field(const std::string& b, Fn fn) {
  size_t at = 0;
  while (at < b.size()) {
    const size_t start = at;
    const uint64_t key = read_varint(b, at);
    const int wt = int(key & 7);
    std::string payload;
    if (wt == 0) {
      read_varint(b, at);
    } else if (wt == 1 || wt == 5) {
      at += wt == 1 ? 8 : 4;
    } else if (wt == 2) {
      const uint64_t len = read_varint(b, at);
      VLM_CHECK(at + len <= b.size(), "synth-ocr: truncated field in the sentencepiece model");
      payload = b.substr(at, size_t(len));
      at += size_t(len);
    } else {
      throw vlm::Error(vlm::str("synth-ocr: unexpected protobuf wire type ", wt,
                                " in the sentencepiece model"));
    }
    VLM_CHECK(at <= b.size(), "synth-ocr: truncated sentencepiece model");
    fn(key >> 3, wt, b.substr(start, at - start), payload);
  }
}

void write_string_field(std::string& out, uint64_t field, const std::string& s) {
  write_varint(out, (field << 3) | 2);
  write_varint(out, s.size());
  out += s;
}

// The model records its trainer's input and model_prefix paths (ModelProto.trainer_spec
// = field 2; TrainerSpec.input = 1, .model_prefix = 2). They are rewritten to the bare
// file names so the model is byte-identical wherever the dataset is written.
std::string with_relative_trainer_paths(const std::string& model, const std::string& input,
                                        const std::string& prefix) {
  std::string out;
  for_each_field(model, [&](uint64_t f, int wt, const std::string& raw, const std::string& p) {
    if (f != 2 || wt != 2) {
      out += raw;
      return;
    }
    std::string spec;
    for_each_field(p, [&](uint64_t g, int wt2, const std::string& raw2, const std::string&) {
      if (wt2 == 2 && g == 1) write_string_field(spec, 1, input);
      else if (wt2 == 2 && g == 2) write_string_field(spec, 2, prefix);
      else spec += raw2;
    });
    write_string_field(out, 2, spec);
  });
  return out;
}

}  // namespace

int64_t train_sentencepiece(const std::string& corpus_file, const std::string& model_prefix,
                            int64_t vocab_size, const std::string& model_type) {
  // sp_trainer_flags(): ChatML specials as user-defined symbols, identity normalisation,
  // no dummy prefix (exact byte offsets for the chat renderer), byte fallback, no
  // BOS/EOS/PAD pieces. One thread and a fixed corpus keep the result deterministic.
  const std::string args = vlm::str(
      "--input=", corpus_file, " --model_prefix=", model_prefix, " --vocab_size=", vocab_size,
      " --model_type=", model_type, " --character_coverage=1.0 --hard_vocab_limit=false"
      " --num_threads=1 ",
      vlm::sp_trainer_flags());
  VLM_CHECK(corpus_file.find(' ') == std::string::npos &&
                model_prefix.find(' ') == std::string::npos,
            "synth-ocr: the output folder must not contain spaces (sentencepiece trainer "
            "arguments are space-separated), got '", model_prefix, "'");
  vlm::train_sentencepiece(args);
  const std::string model_path = model_prefix + ".model";
  const std::string model = read_text(model_path);
  VLM_CHECK(!model.empty(), "synth-ocr: sentencepiece wrote no model to ", model_path);
  const std::string fixed =
      with_relative_trainer_paths(model, fs::path(corpus_file).filename().string(),
                                  fs::path(model_prefix).filename().string());
  {
    std::ofstream out(model_path, std::ios::binary | std::ios::trunc);
    out << fixed;
    VLM_CHECK(out.good(), "synth-ocr: cannot rewrite ", model_path);
  }
  // Piece count = lines of the .vocab file (one piece per line).
  const std::string vocab = read_text(model_prefix + ".vocab");
  const int64_t pieces = std::count(vocab.begin(), vocab.end(), '\n');
  VLM_CHECK(pieces > 0, "synth-ocr: sentencepiece wrote no vocabulary to ", model_prefix, ".vocab");
  return pieces;
}

SynthOcrResult write_synth_ocr(const SynthOcrOptions& opts) {
  VLM_CHECK(!opts.out_dir.empty(), "synth-ocr: --out is required");
  VLM_CHECK(opts.train >= 0 && opts.val >= 0 && opts.train + opts.val > 0,
            "synth-ocr: expected --train/--val >= 0 and not both 0, got ", opts.train, "/", opts.val);
  VLM_CHECK(opts.min_chars >= 1 && opts.min_chars <= opts.max_chars, "synth-ocr: bad length range ",
            opts.min_chars, "..", opts.max_chars);
  VLM_CHECK(opts.min_height >= 8 && opts.min_height <= opts.max_height,
            "synth-ocr: bad height range ", opts.min_height, "..", opts.max_height);
  const bool grid = opts.layout == "grid";
  VLM_CHECK(grid || opts.layout == "proportional", "synth-ocr: layout '", opts.layout,
            "' (expected proportional or grid)");
  const bool clean = opts.style == "clean";
  VLM_CHECK(clean || opts.style == "varied", "synth-ocr: style '", opts.style, "' (expected varied or clean)");
  VLM_CHECK(opts.tokenizer_type == "unigram" || opts.tokenizer_type == "char",
            "synth-ocr: tokenizer type '", opts.tokenizer_type, "' (expected unigram or char)");
  VLM_CHECK(!grid || (opts.cell_width >= 8 && opts.cell_width <= 256),
            "synth-ocr: cell width ", opts.cell_width, " (expected 8..256 px)");
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(fs::path(opts.out_dir) / "images" / "train", ec);
  fs::create_directories(fs::path(opts.out_dir) / "images" / "val", ec);
  VLM_CHECK(!ec, "synth-ocr: cannot create '", opts.out_dir, "': ", ec.message());

  struct Split { std::string name; int64_t count; uint64_t stream; };
  const Split splits[] = {{"train", opts.train, 1}, {"val", opts.val, 2}};
  std::vector<std::string> train_texts;
  for (const Split& sp : splits) {
    std::vector<std::string> texts(size_t(sp.count)), rel(size_t(sp.count));
    std::atomic<int64_t> next{0}, rendered{0};
    std::vector<std::string> errors(size_t(std::max<int64_t>(opts.threads, 1)));
    auto work = [&](size_t tid) {
      try {
        for (int64_t i = next++; i < sp.count; i = next++) {
          const uint64_t s = mix_seed(mix_seed(opts.seed, sp.stream), uint64_t(i));
          texts[size_t(i)] = synth_text(s, opts.min_chars, opts.max_chars);
          cv::Mat img = grid ? render_grid_line(texts[size_t(i)], s, opts.cell_width,
                                                opts.max_chars + 1, opts.max_height, clean)
                             : render_text_line(texts[size_t(i)], s, opts.min_height, opts.max_height, clean);
          char name[32];
          std::snprintf(name, sizeof(name), "%06lld.png", static_cast<long long>(i));
          rel[size_t(i)] = "images/" + sp.name + "/" + name;
          const std::string path = opts.out_dir + "/" + rel[size_t(i)];
          if (!cv::imwrite(path, img, {cv::IMWRITE_PNG_COMPRESSION, 3}))
            throw vlm::Error(vlm::str("cannot write ", path));
          const int64_t done = ++rendered;
          if (tid == 0 && opts.on_progress && done < sp.count) opts.on_progress(sp.name, done, sp.count);  // caller's thread
        }
      } catch (const std::exception& e) {
        errors[tid] = e.what();
        next = sp.count;
      }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < errors.size(); ++t) pool.emplace_back(work, t);
    work(0);
    for (std::thread& t : pool) t.join();
    for (const std::string& e : errors) VLM_CHECK(e.empty(), "synth-ocr: ", e);
    if (opts.on_progress) opts.on_progress(sp.name, sp.count, sp.count);
    std::string jsonl;
    for (int64_t i = 0; i < sp.count; ++i)
      jsonl += nlohmann::json{{"image", rel[size_t(i)]}, {"text", texts[size_t(i)]}}.dump() + "\n";
    write_text(opts.out_dir + "/" + sp.name + ".jsonl", jsonl);
    if (sp.name == "train") train_texts = texts;
  }

  SynthOcrResult res;
  res.train = opts.train;
  res.val = opts.val;
  if (opts.train_tokenizer) {
    // Corpus: the training texts + extra lines from the same generator (never val texts).
    std::string corpus;
    for (const std::string& t : train_texts) corpus += t + "\n";
    for (int64_t i = 0; i < opts.extra_corpus_lines; ++i)
      corpus += synth_text(mix_seed(mix_seed(opts.seed, 3), uint64_t(i)), opts.min_chars,
                           opts.max_chars) + "\n";
    const std::string corpus_path = opts.out_dir + "/tokenizer_corpus.txt";
    write_text(corpus_path, corpus);
    res.vocab_size = train_sentencepiece(corpus_path, opts.out_dir + "/tokenizer", opts.vocab_size,
                                         opts.tokenizer_type);
    res.tokenizer_model = opts.out_dir + "/tokenizer.model";
  }
  nlohmann::json meta = render_settings(opts);
  meta.update({{"generator", kGenerator},
               {"renderer_version", kSynthRendererVersion},
               {"cell_width", grid ? opts.cell_width : 0},
               {"format", "plain"},
               {"tokenizer", opts.train_tokenizer ? "tokenizer.model" : ""},
               {"tokenizer_pieces", res.vocab_size}});
  write_text(opts.out_dir + "/synth_ocr.json", meta.dump(2) + "\n");
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::string synth_ocr_refresh_reason(const SynthOcrOptions& opts) {
  const fs::path dir(opts.out_dir);
  if (!fs::exists(dir / "train.jsonl")) return (dir / "train.jsonl").string() + " is missing";
  const fs::path meta_path = dir / "synth_ocr.json";
  if (!fs::exists(meta_path)) return "";
  const nlohmann::json meta = nlohmann::json::parse(read_text(meta_path.string()), nullptr, false);
  if (meta.is_discarded() || !meta.is_object())
    return meta_path.string() + " is not valid JSON";
  if (meta.value("generator", std::string()) != kGenerator) return "";
  const int version = meta.value("renderer_version", 1);
  if (version != kSynthRendererVersion)
    return vlm::str(meta_path.string(), " was rendered by renderer version ", version, ", this build renders version ",
                    kSynthRendererVersion);
  const nlohmann::json want = render_settings(opts);  // named: items() must not outlive it
  for (const auto& [key, value] : want.items())
    if (!meta.contains(key) || meta[key] != value)
      return vlm::str(meta_path.string(), " has ", key, " = ", meta.contains(key) ? meta[key].dump() : "(none)",
                      ", wanted ", value.dump());
  return "";
}

}  // namespace vlm::data

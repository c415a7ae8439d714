#include "data/dataset.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "data/dataset_info.h"
#include "data/image.h"
#include "data/image_source.h"
#include "data/record_formats.h"
#include "data/record_reader.h"
#include "vlm/runtime/check.h"

namespace vlm::data {
namespace fs = std::filesystem;
namespace {

using json = nlohmann::json;

std::string resolve_path(const std::string& p, const std::string& base) {
  if (p.empty()) throw BadRecordError("invalid field", "empty image path");
  if (p.rfind("http://", 0) == 0 || p.rfind("https://", 0) == 0)
    throw BadRecordError("invalid field", str("image URLs are not supported: ", p,
                                              " (hint: download the images first)"));
  fs::path path(p);
  if (path.is_absolute() || base.empty()) return path.lexically_normal().string();
  return (fs::path(base) / path).lexically_normal().string();
}

int64_t count_markers(const std::string& s) {
  int64_t n = 0;
  const std::string m = kImageMarker;
  for (size_t pos = s.find(m); pos != std::string::npos; pos = s.find(m, pos + m.size())) ++n;
  return n;
}

// The source string of an image content part: "image": src | {"url": src}, or
// "image_url": src | {"url": src} (OpenAI style); "" when the part names none.
std::string image_part_source(const json& part) {
  for (const char* k : {"image", "image_url", "path"}) {
    auto it = part.find(k);
    if (it == part.end()) continue;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("url") && (*it)["url"].is_string()) return (*it)["url"];
  }
  return "";
}

// Message content: a string, or a list of {"type":"text","text":..} / {"type":"image"[,
// "image": src]} / {"type":"image_url","image_url":{"url": src}} parts (image sources
// appended to `inline_images`).
std::string content_text(const json& c, std::vector<std::string>& inline_images) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    throw BadRecordError("invalid field", str("message content must be a string or a list, got ",
                                              c.type_name()));
  std::string out;
  for (const json& part : c) {
    if (!part.is_object()) throw BadRecordError("invalid field", "content part is not an object");
    const std::string& type = record_string(part, "type", "content part");
    if (type == "text") {
      out += record_string(part, "text", "text part");
    } else if (type == "image" || type == "image_url") {
      out += kImageMarker;
      const std::string src = image_part_source(part);
      if (!src.empty()) inline_images.push_back(src);
    } else {
      throw BadRecordError("invalid field", str("unsupported content part type \"", type, "\""));
    }
  }
  return out;
}

std::string normalise_role(const std::string& r) {
  if (r == "user" || r == "human") return "user";
  if (r == "assistant" || r == "gpt" || r == "model") return "assistant";
  if (r == "system") return "system";
  throw BadRecordError("unknown role", str("unknown role \"", r, "\""));
}

void check_markers(const Record& r) {
  const int64_t markers = count_image_markers(r);
  if (markers != int64_t(r.images.size()))
    throw BadRecordError("image count mismatch",
                         str(markers, " ", kImageMarker, " marker(s) but ", r.images.size(),
                             " image(s)"));
}

// ------------------------------------------------------------------ index cache
// <jsonl>.index.json: {"version":1,"jsonl_size":..,"jsonl_mtime":..,"verify_decode":b,
//   "images":{path: {"w":..,"h":..} | {"error":reason,"detail":..}},
//   "text_tokens":{..}}  (owned by data/token_counts.cpp; preserved on rewrite)
struct ImageProbe {
  int64_t width = 0, height = 0;
  std::string error, detail;  // error category when the image is unusable
};

std::string index_path(const std::string& jsonl) { return dataset_index_path(jsonl); }

json file_key(const std::string& jsonl, bool verify) {
  std::error_code ec;
  auto size = fs::file_size(jsonl, ec);
  auto mtime = fs::last_write_time(jsonl, ec).time_since_epoch().count();
  return json{{"version", 1}, {"jsonl_size", int64_t(size)}, {"jsonl_mtime", int64_t(mtime)},
              {"verify_decode", verify}};
}

std::map<std::string, ImageProbe> read_index(const std::string& jsonl, bool verify) {
  std::map<std::string, ImageProbe> out;
  std::ifstream in(index_path(jsonl));
  if (!in) return out;
  try {
    json j = json::parse(in);
    json key = file_key(jsonl, verify);
    for (auto& [k, v] : key.items())
      if (!j.contains(k) || j[k] != v) return out;
    for (auto& [path, v] : j.at("images").items()) {
      ImageProbe p;
      if (v.contains("error")) {
        p.error = v["error"];
        p.detail = v.value("detail", "");
      } else {
        // Sizes must be positive integers (a float such as 1e300 would be an undefined cast).
        const json &w = v.at("w"), &h = v.at("h");
        if (!w.is_number_integer() || !h.is_number_integer()) return {};
        p.width = w.get<int64_t>();
        p.height = h.get<int64_t>();
        if (p.width <= 0 || p.height <= 0 || p.width > (int64_t(1) << 32) || p.height > (int64_t(1) << 32))
          return {};
      }
      out[path] = p;
    }
  } catch (const std::exception&) {
    out.clear();  // stale or damaged cache: rebuild
  }
  return out;
}

bool write_index(const std::string& jsonl, bool verify,
                 const std::map<std::string, ImageProbe>& probes) {
  json j = file_key(jsonl, verify);
  json images = json::object();
  for (const auto& [path, p] : probes) {
    if (!p.error.empty()) images[path] = {{"error", p.error}, {"detail", p.detail}};
    else images[path] = {{"w", p.width}, {"h", p.height}};
  }
  j["images"] = std::move(images);
  {
    // Keep the text token counts (data/token_counts.cpp); they carry their own key.
    std::ifstream old(index_path(jsonl));
    if (old) {
      try {
        json prev = json::parse(old);
        if (prev.is_object() && prev.contains("text_tokens")) j["text_tokens"] = prev["text_tokens"];
      } catch (const std::exception&) {
      }
    }
  }
  const std::string tmp = index_path(jsonl) + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) return false;
    out << j.dump() << "\n";
    if (!out.good()) return false;
  }
  std::error_code ec;
  fs::rename(tmp, index_path(jsonl), ec);
  return !ec;
}

// Size (and, with verify, a full decode) of image bytes; `what` names them in messages.
ImageProbe probe_bytes(const std::vector<uint8_t>& bytes, const std::string& what, bool verify) {
  ImageProbe p;
  try {
    // Header first (cheap); formats without a header parser are decoded once.
    VLM_CHECK(!bytes.empty(), "image '", what, "' is empty");
    std::optional<ImageInfo> info = parse_image_header(bytes);
    if (!info) {
      cv::Mat m = decode_image_rgb(bytes, what);
      info = ImageInfo{m.cols, m.rows, 1, "other"};
    }
    p.width = info->width;
    p.height = info->height;
    if (p.width <= 0 || p.height <= 0) {
      p.error = "zero-size image";
      p.detail = str(what, " is ", p.width, "x", p.height);
      return p;
    }
    if (verify) {
      cv::Mat m = decode_image_rgb(bytes, what);
      if (m.cols != p.width || m.rows != p.height) {
        p.error = "unreadable image";
        p.detail = str("header says ", p.width, "x", p.height, " but decoding gives ", m.cols,
                       "x", m.rows, ": ", what);
      }
    }
  } catch (const std::exception& e) {
    p.error = "unreadable image";
    p.detail = e.what();
  }
  return p;
}

ImageProbe probe(const std::string& path, bool verify) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    ImageProbe p;
    p.error = "missing image";
    p.detail = str("image not found: ", path);
    return p;
  }
  try {
    return probe_bytes(read_file_bytes(path), path, verify);
  } catch (const std::exception& e) {  // unreadable file
    ImageProbe p;
    p.error = "unreadable image";
    p.detail = e.what();
    return p;
  }
}

// Applies a probe to an image of a record (BadRecordError when unusable).
void apply_probe(const ImageProbe& p, ImageRef& im) {
  if (!p.error.empty()) throw BadRecordError(p.error, p.detail);
  const double aspect = double(std::max(p.width, p.height)) / double(std::min(p.width, p.height));
  if (aspect > vlm::kMaxAspectRatio)
    throw BadRecordError("extreme aspect ratio",
                         str(im.path, " is ", p.width, "x", p.height, " (aspect ", aspect, " > ",
                             vlm::kMaxAspectRatio, ")"));
  im.width = p.width;
  im.height = p.height;
}

// An embedded image of a record just parsed from `raw`: label it, check its base64, point
// it at its text in the dataset file when found there verbatim (so the text is not kept),
// and probe it.
void place_embedded_image(ImageRef& im, const Record& r, const RawRecord& raw,
                          const DatasetOptions& opts) {
  im.path = r.location() + " " + im.path;
  im.embedded_file = r.source;
  std::vector<uint8_t> bytes;
  try {
    bytes = decode_base64(*im.embedded_text);
  } catch (const vlm::Error& e) {
    throw BadRecordError("bad base64", str(im.path, ": ", e.what()));
  }
  const size_t pos = raw.text.find(*im.embedded_text);
  if (pos != std::string::npos) {
    im.embedded_offset = raw.offset + int64_t(pos);
    im.embedded_length = int64_t(im.embedded_text->size());
    im.embedded_text.reset();
  }
  if (opts.probe_images) apply_probe(probe_bytes(bytes, im.path, opts.verify_decode), im);
}

}  // namespace

DatasetFormat parse_dataset_format(const std::string& name) {
  if (name == "auto" || name.empty()) return DatasetFormat::kAuto;
  if (name == "messages") return DatasetFormat::kMessages;
  if (name == "llava" || name == "conversations") return DatasetFormat::kLlava;
  if (name == "plain" || name == "ocr" || name == "plain_ocr") return DatasetFormat::kPlainOcr;
  if (name == "sharegpt") return DatasetFormat::kSharegpt;
  if (name == "alpaca") return DatasetFormat::kAlpaca;
  if (name == "swift") return DatasetFormat::kSwift;
  throw vlm::Error(str("unknown dataset format \"", name,
                       "\"; expected one of auto, messages, llava, plain, sharegpt, alpaca, swift"));
}

std::string to_string(DatasetFormat f) {
  switch (f) {
    case DatasetFormat::kAuto: return "auto";
    case DatasetFormat::kMessages: return "messages";
    case DatasetFormat::kLlava: return "llava";
    case DatasetFormat::kPlainOcr: return "plain";
    case DatasetFormat::kSharegpt: return "sharegpt";
    case DatasetFormat::kAlpaca: return "alpaca";
    case DatasetFormat::kSwift: return "swift";
  }
  return "?";
}

DatasetFormat detect_format(const json& j) {
  if (!j.is_object()) return DatasetFormat::kAuto;
  if (j.contains("messages")) return DatasetFormat::kMessages;
  if (j.contains("conversations")) return DatasetFormat::kLlava;
  if (j.contains("instruction") && j.contains("output")) return DatasetFormat::kAlpaca;
  if (j.contains("text") || j.contains("answers")) return DatasetFormat::kPlainOcr;
  return DatasetFormat::kAuto;
}

int64_t count_image_markers(const Record& r) {
  int64_t n = 0;
  for (const Turn& t : r.turns) n += count_markers(t.content);
  return n;
}

Record parse_record(const json& j, DatasetFormat format, const std::string& image_base,
                    const DatasetOptions& opts, const ColumnMap& columns) {
  if (!j.is_object()) throw BadRecordError("invalid json", "the record is not a JSON object");
  if (format == DatasetFormat::kAuto) format = detect_format(j);
  Record r;
  r.format = format;
  std::vector<std::string> paths;
  switch (format) {
    case DatasetFormat::kMessages:
    case DatasetFormat::kSwift: {
      auto it = j.find("messages");
      if (it == j.end()) throw BadRecordError("missing field", "missing \"messages\"");
      if (!it->is_array() || it->empty())
        throw BadRecordError("invalid field", "\"messages\" must be a non-empty list");
      for (const json& m : *it) {
        if (!m.is_object()) throw BadRecordError("invalid field", "message is not an object");
        if (!m.contains("content")) throw BadRecordError("missing field", "message without \"content\"");
        r.turns.push_back({normalise_role(record_string(m, "role", "message")),
                           content_text(m["content"], paths)});
      }
      // Top-level "images" wins over paths given inline in content parts.
      if (j.contains("images")) paths = record_string_list(j["images"], "images");
      break;
    }
    case DatasetFormat::kLlava: {
      auto it = j.find("conversations");
      if (it == j.end()) throw BadRecordError("missing field", "missing \"conversations\"");
      if (!it->is_array() || it->empty())
        throw BadRecordError("invalid field", "\"conversations\" must be a non-empty list");
      for (const json& m : *it) {
        if (!m.is_object()) throw BadRecordError("invalid field", "conversation turn is not an object");
        r.turns.push_back({normalise_role(record_string(m, "from", "conversation turn")),
                           record_string(m, "value", "conversation turn")});
      }
      if (j.contains("image")) paths = record_string_list(j["image"], "image");
      else if (j.contains("images")) paths = record_string_list(j["images"], "images");
      break;
    }
    case DatasetFormat::kPlainOcr: {
      if (j.contains("image")) paths = record_string_list(j["image"], "image");
      else if (j.contains("images")) paths = record_string_list(j["images"], "images");
      if (paths.empty()) throw BadRecordError("missing field", "missing \"image\"");
      if (j.contains("answers")) r.answers = record_string_list(j["answers"], "answers");
      std::string text;
      if (j.contains("text")) text = record_string(j, "text", "record");
      else if (!r.answers.empty()) text = r.answers.front();
      else throw BadRecordError("missing field", "missing \"text\" (or \"answers\")");
      if (j.contains("text")) r.answers.insert(r.answers.begin(), text);
      std::string prompt = opts.ocr_prompt;
      if (count_markers(prompt) == 0) {
        std::string markers;
        for (size_t i = 0; i < paths.size(); ++i) markers += kImageMarker;
        prompt = markers + prompt;
      }
      r.turns.push_back({"user", prompt});
      r.turns.push_back({"assistant", text});
      break;
    }
    case DatasetFormat::kSharegpt:
      parse_sharegpt_record(j, columns, r, paths);
      break;
    case DatasetFormat::kAlpaca:
      parse_alpaca_record(j, columns, r, paths);
      break;
    case DatasetFormat::kAuto:
      throw BadRecordError("missing field",
                           "no \"messages\", \"conversations\", \"instruction\"+\"output\", "
                           "\"text\" or \"answers\" field (hint: set data.format in the recipe)");
  }
  if (r.answers.empty()) {
    for (const Turn& t : r.turns)
      if (t.role == "assistant") r.answers = {t.content};  // last assistant turn
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& p = paths[i];
    if (classify_image_source(p) == ImageSourceKind::kPath) {
      r.images.push_back({resolve_path(p, image_base), 0, 0});
      continue;
    }
    ImageRef im;
    im.embedded = true;
    im.path = str("image ", i, " (base64)");  // load_dataset prefixes the record's location
    try {
      im.embedded_text = std::make_shared<const std::string>(base64_payload(p));
    } catch (const vlm::Error& e) {
      throw BadRecordError("bad base64", str("image ", i, ": ", e.what()));
    }
    r.images.push_back(std::move(im));
  }
  check_markers(r);
  return r;
}

int64_t approx_token_cost(const Record& r, const vlm::PixelLimits& limits, int64_t factor) {
  int64_t cost = 0;
  for (const ImageRef& im : r.images)
    if (im.width > 0 && im.height > 0) cost += vlm::image_tokens(im.height, im.width, limits, factor);
  for (const Turn& t : r.turns) cost += int64_t(t.content.size()) / 4 + 1;
  return cost;
}

std::map<std::string, int64_t> Dataset::bad_by_reason() const {
  std::map<std::string, int64_t> m;
  for (const BadRecord& b : bad) ++m[b.reason];
  return m;
}

std::string Dataset::summary() const {
  std::ostringstream s;
  s << records.size() << " records from " << lines << " lines";
  if (!bad.empty()) {
    s << "; skipped " << bad.size() << " (";
    bool first = true;
    for (const auto& [reason, n] : bad_by_reason()) {
      s << (first ? "" : ", ") << reason << ": " << n;
      first = false;
    }
    s << ")";
  }
  return s.str();
}

Dataset load_dataset(const std::vector<std::string>& entries, const DatasetOptions& opts) {
  VLM_CHECK(!entries.empty(), "load_dataset: no dataset files given (hint: set data.train)");
  auto warn = opts.warn ? opts.warn : [](const std::string& m) { std::cerr << m << "\n"; };
  Dataset ds;
  int64_t printed = 0;
  auto add_bad = [&](const std::string& src, int64_t line, bool in_array, const std::string& reason,
                     const std::string& detail) {
    ds.bad.push_back({src, line, reason, detail, in_array});
    ++ds.files.back().bad;
    if (printed < opts.max_printed_warnings) {
      warn(str("warning: skipping ", ds.bad.back().location(), ": ", reason, ": ", detail));
      if (++printed == opts.max_printed_warnings)
        warn("warning: further bad records are counted but not printed");
    }
  };
  for (const DatasetFile& df : resolve_dataset_files(entries)) {
    const std::string& file = df.path;
    RecordReader reader(file);
    const std::string base = !opts.image_root.empty() ? opts.image_root
                             : !df.image_base.empty() ? df.image_base
                                                      : fs::path(file).parent_path().string();
    DatasetFormat format = df.format != DatasetFormat::kAuto ? df.format : opts.format;
    ds.files.push_back({df.spec, file, reader.container(), format, 0, 0});
    std::map<std::string, ImageProbe> probes;
    bool cache_hit = false;
    if (opts.probe_images && opts.use_index_cache) {
      probes = read_index(file, opts.verify_decode);
      cache_hit = !probes.empty();
    }
    bool cache_dirty = false;
    std::error_code size_ec;
    const int64_t file_bytes = static_cast<int64_t>(fs::file_size(file, size_ec));
    bool reported = false;  // on_index_progress called for this file
    RawRecord raw;
    while (reader.next(raw)) {
      ++ds.lines;
      if (cache_dirty && opts.on_index_progress && !size_ec) {
        opts.on_index_progress(file, std::min(raw.offset, file_bytes - 1), file_bytes);
        reported = true;
      }
      if (!raw.error.empty()) {
        add_bad(file, raw.number, reader.is_array(), "invalid json", raw.error);
        continue;
      }
      json j;
      try {
        j = json::parse(raw.text);
      } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999-style numbers
        add_bad(file, raw.number, reader.is_array(), "invalid json", e.what());
        continue;
      }
      if (format == DatasetFormat::kAuto) {  // first usable record
        format = detect_format(j);
        ds.files.back().format = format;
      }
      try {
        Record r = parse_record(j, format, base, opts, df.columns);
        r.source = file;
        r.line = raw.number;
        r.in_array = reader.is_array();
        for (ImageRef& im : r.images) {
          if (im.embedded) {
            place_embedded_image(im, r, raw, opts);
          } else if (opts.probe_images) {
            auto it = probes.find(im.path);
            if (it == probes.end()) {
              it = probes.emplace(im.path, probe(im.path, opts.verify_decode)).first;
              cache_dirty = true;
            }
            apply_probe(it->second, im);
          }
        }
        ds.records.push_back(std::move(r));
        ++ds.files.back().records;
      } catch (const BadRecordError& e) {
        add_bad(file, raw.number, reader.is_array(), e.reason, e.what());
      } catch (const json::exception& e) {
        add_bad(file, raw.number, reader.is_array(), "invalid field", e.what());
      }
    }
    if (reported) opts.on_index_progress(file, file_bytes, file_bytes);
    if (opts.probe_images && opts.use_index_cache && (cache_dirty || !cache_hit) &&
        !probes.empty()) {
      if (!write_index(file, opts.verify_decode, probes))
        warn(str("warning: could not write the image index ", index_path(file),
                 " (read-only folder?); sizes will be re-read next time"));
    }
  }
  if (!ds.bad.empty()) warn(str("dataset: ", ds.summary()));
  VLM_CHECK(!ds.records.empty(), "dataset has no usable record: ", ds.summary(),
            " (hint: check the format and the image paths; first problem: ",
            ds.bad.empty() ? std::string("no non-empty line")
                           : ds.bad.front().location() + ": " + ds.bad.front().reason + ": " +
                                 ds.bad.front().detail,
            ")");
  const double frac = double(ds.bad.size()) / double(std::max<int64_t>(ds.lines, 1));
  VLM_CHECK(frac <= opts.max_bad_fraction, "too many bad records: ", ds.bad.size(), " of ",
            ds.lines, " (", frac * 100.0, "%) exceed data.max_bad_fraction = ",
            opts.max_bad_fraction, ": ", ds.summary(), "; first: ", ds.bad.front().location(),
            ": ", ds.bad.front().reason, ": ", ds.bad.front().detail,
            " (hint: fix the data or raise data.max_bad_fraction)");
  return ds;
}

}  // namespace vlm::data

#include "data/dataset.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "data/image.h"
#include "vlm/check.h"

namespace vlm::data {
namespace fs = std::filesystem;
namespace {

using json = nlohmann::json;

const std::string& require_string(const json& j, const char* key, const char* what) {
  auto it = j.find(key);
  if (it == j.end()) throw BadRecordError("missing field", str("missing \"", key, "\" in ", what));
  if (!it->is_string())
    throw BadRecordError("invalid field", str("\"", key, "\" in ", what, " must be a string, got ",
                                              it->type_name()));
  return it->get_ref<const std::string&>();
}

std::vector<std::string> string_or_list(const json& v, const char* key) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_string())
        throw BadRecordError("invalid field", str("\"", key, "\" must hold strings, got ",
                                                  e.type_name()));
      out.push_back(e.get<std::string>());
    }
  } else if (!v.is_null()) {
    throw BadRecordError("invalid field", str("\"", key, "\" must be a string or a list, got ",
                                              v.type_name()));
  }
  return out;
}

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

// Message content: a string, or a list of {"type":"text","text":..} / {"type":"image"[,
// "image": path]} parts (inline paths appended to `inline_images`).
std::string content_text(const json& c, std::vector<std::string>& inline_images) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    throw BadRecordError("invalid field", str("message content must be a string or a list, got ",
                                              c.type_name()));
  std::string out;
  for (const json& part : c) {
    if (!part.is_object()) throw BadRecordError("invalid field", "content part is not an object");
    const std::string& type = require_string(part, "type", "content part");
    if (type == "text") {
      out += require_string(part, "text", "text part");
    } else if (type == "image") {
      out += kImageMarker;
      for (const char* k : {"image", "path"})
        if (part.contains(k) && part[k].is_string()) inline_images.push_back(part[k].get<std::string>());
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
  throw BadRecordError("invalid field", str("unknown role \"", r, "\""));
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

ImageProbe probe(const std::string& path, bool verify) {
  ImageProbe p;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    p.error = "missing image";
    p.detail = str("image not found: ", path);
    return p;
  }
  try {
    // Header first (cheap); formats without a header parser are decoded once.
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    VLM_CHECK(!bytes.empty(), "image '", path, "' is an empty file");
    std::optional<ImageInfo> info = parse_image_header(bytes);
    if (!info) {
      cv::Mat m = decode_image_rgb(bytes, path);
      info = ImageInfo{m.cols, m.rows, 1, "other"};
    }
    p.width = info->width;
    p.height = info->height;
    if (p.width <= 0 || p.height <= 0) {
      p.error = "zero-size image";
      p.detail = str(path, " is ", p.width, "x", p.height);
      return p;
    }
    if (verify) {
      cv::Mat m = decode_image_rgb(path);
      if (m.cols != p.width || m.rows != p.height) {
        p.error = "unreadable image";
        p.detail = str("header says ", p.width, "x", p.height, " but decoding gives ", m.cols,
                       "x", m.rows, ": ", path);
      }
    }
  } catch (const std::exception& e) {
    p.error = "unreadable image";
    p.detail = e.what();
  }
  return p;
}

}  // namespace

DatasetFormat parse_dataset_format(const std::string& name) {
  if (name == "auto" || name.empty()) return DatasetFormat::kAuto;
  if (name == "messages") return DatasetFormat::kMessages;
  if (name == "llava" || name == "conversations") return DatasetFormat::kLlava;
  if (name == "plain" || name == "ocr" || name == "plain_ocr") return DatasetFormat::kPlainOcr;
  throw vlm::Error(str("unknown dataset format \"", name,
                       "\"; expected one of auto, messages, llava, plain"));
}

std::string to_string(DatasetFormat f) {
  switch (f) {
    case DatasetFormat::kAuto: return "auto";
    case DatasetFormat::kMessages: return "messages";
    case DatasetFormat::kLlava: return "llava";
    case DatasetFormat::kPlainOcr: return "plain";
  }
  return "?";
}

DatasetFormat detect_format(const json& j) {
  if (!j.is_object()) return DatasetFormat::kAuto;
  if (j.contains("messages")) return DatasetFormat::kMessages;
  if (j.contains("conversations")) return DatasetFormat::kLlava;
  if (j.contains("text") || j.contains("answers")) return DatasetFormat::kPlainOcr;
  return DatasetFormat::kAuto;
}

int64_t count_image_markers(const Record& r) {
  int64_t n = 0;
  for (const Turn& t : r.turns) n += count_markers(t.content);
  return n;
}

Record parse_record(const json& j, DatasetFormat format, const std::string& image_base,
                    const DatasetOptions& opts) {
  if (!j.is_object()) throw BadRecordError("invalid json", "line is not a JSON object");
  if (format == DatasetFormat::kAuto) format = detect_format(j);
  Record r;
  r.format = format;
  std::vector<std::string> paths;
  switch (format) {
    case DatasetFormat::kMessages: {
      auto it = j.find("messages");
      if (it == j.end()) throw BadRecordError("missing field", "missing \"messages\"");
      if (!it->is_array() || it->empty())
        throw BadRecordError("invalid field", "\"messages\" must be a non-empty list");
      for (const json& m : *it) {
        if (!m.is_object()) throw BadRecordError("invalid field", "message is not an object");
        if (!m.contains("content")) throw BadRecordError("missing field", "message without \"content\"");
        r.turns.push_back({normalise_role(require_string(m, "role", "message")),
                           content_text(m["content"], paths)});
      }
      // Top-level "images" wins over paths given inline in content parts.
      if (j.contains("images")) paths = string_or_list(j["images"], "images");
      break;
    }
    case DatasetFormat::kLlava: {
      auto it = j.find("conversations");
      if (it == j.end()) throw BadRecordError("missing field", "missing \"conversations\"");
      if (!it->is_array() || it->empty())
        throw BadRecordError("invalid field", "\"conversations\" must be a non-empty list");
      for (const json& m : *it) {
        if (!m.is_object()) throw BadRecordError("invalid field", "conversation turn is not an object");
        r.turns.push_back({normalise_role(require_string(m, "from", "conversation turn")),
                           require_string(m, "value", "conversation turn")});
      }
      if (j.contains("image")) paths = string_or_list(j["image"], "image");
      else if (j.contains("images")) paths = string_or_list(j["images"], "images");
      break;
    }
    case DatasetFormat::kPlainOcr: {
      if (j.contains("image")) paths = string_or_list(j["image"], "image");
      else if (j.contains("images")) paths = string_or_list(j["images"], "images");
      if (paths.empty()) throw BadRecordError("missing field", "missing \"image\"");
      if (j.contains("answers")) r.answers = string_or_list(j["answers"], "answers");
      std::string text;
      if (j.contains("text")) text = require_string(j, "text", "record");
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
    case DatasetFormat::kAuto:
      throw BadRecordError("missing field",
                           "no \"messages\", \"conversations\", \"text\" or \"answers\" field "
                           "(hint: set the dataset format in the recipe)");
  }
  if (r.answers.empty()) {
    for (const Turn& t : r.turns)
      if (t.role == "assistant") r.answers = {t.content};  // last assistant turn
  }
  for (const std::string& p : paths) r.images.push_back({resolve_path(p, image_base), 0, 0});
  check_markers(r);
  return r;
}

int64_t approx_token_cost(const Record& r, const vlm::PixelLimits& limits) {
  int64_t cost = 0;
  for (const ImageRef& im : r.images)
    if (im.width > 0 && im.height > 0) cost += vlm::image_tokens(im.height, im.width, limits);
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

Dataset load_dataset(const std::vector<std::string>& files, const DatasetOptions& opts) {
  VLM_CHECK(!files.empty(), "load_dataset: no dataset files given (hint: set data.train)");
  auto warn = opts.warn ? opts.warn : [](const std::string& m) { std::cerr << m << "\n"; };
  Dataset ds;
  int64_t printed = 0;
  auto add_bad = [&](const std::string& src, int64_t line, const std::string& reason,
                     const std::string& detail) {
    ds.bad.push_back({src, line, reason, detail});
    if (printed < opts.max_printed_warnings) {
      warn(str("warning: skipping ", src, ":", line, ": ", reason, ": ", detail));
      if (++printed == opts.max_printed_warnings)
        warn("warning: further bad records are counted but not printed");
    }
  };
  for (const std::string& file : files) {
    std::ifstream in(file);
    VLM_CHECK(in.good(), "cannot open dataset file '", file, "' (hint: check the path)");
    const std::string base = !opts.image_root.empty()
                                 ? opts.image_root
                                 : fs::path(file).parent_path().string();
    DatasetFormat format = opts.format;
    std::map<std::string, ImageProbe> probes;
    bool cache_hit = false;
    if (opts.probe_images && opts.use_index_cache) {
      probes = read_index(file, opts.verify_decode);
      cache_hit = !probes.empty();
    }
    bool cache_dirty = false;
    std::string text;
    int64_t line_no = 0;
    while (std::getline(in, text)) {
      ++line_no;
      if (!text.empty() && text.back() == '\r') text.pop_back();
      if (text.find_first_not_of(" \t") == std::string::npos) continue;
      ++ds.lines;
      json j;
      try {
        j = json::parse(text);
      } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999-style numbers
        add_bad(file, line_no, "invalid json", e.what());
        continue;
      }
      if (format == DatasetFormat::kAuto) format = detect_format(j);  // first usable line
      try {
        Record r = parse_record(j, format, base, opts);
        r.source = file;
        r.line = line_no;
        if (opts.probe_images) {
          for (ImageRef& im : r.images) {
            auto it = probes.find(im.path);
            if (it == probes.end()) {
              it = probes.emplace(im.path, probe(im.path, opts.verify_decode)).first;
              cache_dirty = true;
            }
            const ImageProbe& p = it->second;
            if (!p.error.empty()) throw BadRecordError(p.error, p.detail);
            const double aspect = double(std::max(p.width, p.height)) /
                                  double(std::min(p.width, p.height));
            if (aspect > vlm::kMaxAspectRatio)
              throw BadRecordError("extreme aspect ratio",
                                   str(im.path, " is ", p.width, "x", p.height, " (aspect ",
                                       aspect, " > ", vlm::kMaxAspectRatio, ")"));
            im.width = p.width;
            im.height = p.height;
          }
        }
        ds.records.push_back(std::move(r));
      } catch (const BadRecordError& e) {
        add_bad(file, line_no, e.reason, e.what());
      } catch (const json::exception& e) {
        add_bad(file, line_no, "invalid field", e.what());
      }
    }
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

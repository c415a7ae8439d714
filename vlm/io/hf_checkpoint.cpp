#include "vlm/io/hf_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "vlm/runtime/check.h"
#include "vlm/io/staged_dir.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

std::string shape_str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "a", "b", ... (and N more): at most `limit` names.
std::string name_list(const std::vector<std::string>& names, size_t limit = 10) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < limit; ++i) s += (i ? ", " : "") + ("\"" + names[i] + "\"");
  if (names.size() > limit) s += str(" ... and ", names.size() - limit, " more");
  return s;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, path, ": cannot open for reading: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Identity of the memory a tensor views: tensors with equal keys are the same weights
// (tied). Views of one flat buffer at different offsets are different weights.
using TieKey = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>>;
TieKey tie_key(const torch::Tensor& t) {
  if (!t.has_storage()) return {t.unsafeGetTensorImpl(), 0, {}, {}};
  return {t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.sizes().vec(), t.strides().vec()};
}

}  // namespace

// ---------------------------------------------------------------- names

std::string canonical_hf_name(const std::string& name) {
  if (starts_with(name, "model.visual.")) return name.substr(6);                       // "visual...."
  if (starts_with(name, "model.language_model.")) return "model." + name.substr(21);  // "model...."
  return name;
}

std::string styled_hf_name(const std::string& canonical, HfNameStyle style) {
  if (style == HfNameStyle::kLegacy) return canonical;
  if (starts_with(canonical, "visual.")) return "model." + canonical;
  if (starts_with(canonical, "model.")) return "model.language_model." + canonical.substr(6);
  return canonical;
}

// ---------------------------------------------------------------- reading

void HfCheckpoint::add_file(SafetensorsFile file) {
  size_t idx = files_.size();
  for (const auto& t : file.tensors()) {
    std::string canon = canonical_hf_name(t.name);
    auto [it, inserted] = entries_.emplace(canon, Entry{idx, t.name});
    if (!inserted) {
      const Entry& other = it->second;
      const std::string& other_file = other.file == idx ? file.source() : files_[other.file].source();
      throw Error(str(file.source(), ": tensor \"", t.name, "\" and \"", other.stored_name, "\" (in ",
                      other_file, ") both name \"", canon,
                      "\" (hint: the checkpoint mixes the legacy visual./model. and the "
                      "model.visual./model.language_model. prefixes for the same weight)"));
    }
  }
  files_.push_back(std::move(file));
}

HfCheckpoint HfCheckpoint::open(const std::string& dir_or_file) {
  HfCheckpoint ck;
  ck.path_ = dir_or_file;
  std::error_code ec;
  VLM_CHECK(fs::exists(dir_or_file, ec), dir_or_file, ": checkpoint path does not exist");
  if (!fs::is_directory(dir_or_file, ec)) {
    ck.add_file(SafetensorsFile::open(dir_or_file));
    ck.fuse_per_expert_tensors();
    return ck;
  }
  const std::string single = (fs::path(dir_or_file) / kSingleFile).string();
  const std::string index_path = (fs::path(dir_or_file) / kIndexFile).string();
  if (fs::exists(single, ec)) {  // same preference as transformers
    ck.add_file(SafetensorsFile::open(single));
    ck.fuse_per_expert_tensors();
    return ck;
  }
  VLM_CHECK(fs::exists(index_path, ec), dir_or_file, ": no ", kSingleFile, " or ", kIndexFile,
            " in this directory (hint: only safetensors checkpoints are supported; convert "
            "pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))");
  ck.sharded_ = true;

  json index;
  try {
    index = json::parse(read_text(index_path));
  } catch (const json::exception& e) {
    throw Error(str(index_path, ": not valid JSON: ", e.what()));
  }
  VLM_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path,
            ": expected an object with a \"weight_map\" object {name: file}, found ", index.dump().substr(0, 200));
  if (index.contains("metadata") && index["metadata"].is_object() && index["metadata"].contains("total_size")) {
    const json& ts = index["metadata"]["total_size"];
    if (ts.is_number_unsigned()) {
      ck.index_total_size_ = ts.get<uint64_t>();
    } else if (ts.is_number_float()) {  // some writers emit 1234.0
      const double d = ts.get<double>();
      VLM_CHECK(d >= 0 && d < 18446744073709551616.0, index_path, ": metadata.total_size ", ts.dump(),
                " is not a byte count: expected an integer in [0, 2^64)");
      ck.index_total_size_ = uint64_t(d);
    }
  }

  // weight_map: file -> names the index puts there, in file-name order.
  std::map<std::string, std::vector<std::string>> by_file;
  std::map<std::string, std::string> file_of_name;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    VLM_CHECK(it.value().is_string(), index_path, ": weight_map[\"", it.key(), "\"] must be a file name, found ",
              it.value().dump());
    std::string file = it.value().get<std::string>();
    fs::path fp(file);
    bool sane = !file.empty() && fp.is_relative();
    for (const auto& part : fp) sane = sane && part != "..";
    VLM_CHECK(sane, index_path, ": weight_map[\"", it.key(), "\"] = \"", file,
              "\" must be a relative file name inside the checkpoint directory");
    by_file[file].push_back(it.key());
    file_of_name[it.key()] = file;
  }
  VLM_CHECK(!by_file.empty(), index_path, ": weight_map is empty");

  // Open every shard, then check the index's claims both ways.
  std::map<std::string, SafetensorsFile> opened;
  for (const auto& [file, names] : by_file) {
    const std::string fpath = (fs::path(dir_or_file) / file).string();
    VLM_CHECK(fs::exists(fpath, ec), index_path, ": the index maps ", names.size(), " tensors (e.g. \"",
              names.front(), "\") to ", file, ", but ", fpath, " does not exist (hint: incomplete download?)");
    opened.emplace(file, SafetensorsFile::open(fpath));
  }
  for (const auto& [file, names] : by_file) {
    const SafetensorsFile& sf = opened.at(file);
    for (const auto& name : names) {
      if (sf.contains(name)) continue;
      std::string found_in;
      for (const auto& [other, osf] : opened)
        if (other != file && osf.contains(name)) found_in = str(" (it is in ", other, ")");
      throw Error(str(index_path, ": the index says tensor \"", name, "\" is in ", file, ", but ", sf.source(),
                      " does not hold it", found_in, " (hint: the index and the shards do not match)"));
    }
  }
  for (auto& [file, sf] : opened) {
    for (const auto& t : sf.tensors()) {
      auto it = file_of_name.find(t.name);
      VLM_CHECK(it != file_of_name.end(), sf.source(), ": holds tensor \"", t.name, "\" that ", kIndexFile,
                " does not list (hint: the index and the shards do not match)");
      VLM_CHECK(it->second == file, sf.source(), ": holds tensor \"", t.name, "\" but ", kIndexFile, " maps it to ",
                it->second, " (hint: the index and the shards do not match)");
    }
    ck.add_file(std::move(sf));
  }
  ck.fuse_per_expert_tensors();
  return ck;
}

void HfCheckpoint::fuse_per_expert_tensors() {
  static const std::regex kPart(R"(^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$)");
  std::map<std::string, std::map<int64_t, std::map<std::string, std::string>>> groups;  // prefix -> e -> proj
  for (const auto& [name, _] : entries_) {
    std::smatch m;
    if (std::regex_match(name, m, kPart)) groups[m[1]][std::stoll(m[2])][m[3]] = name;
  }
  for (const auto& [prefix, experts] : groups) {
    const int64_t n = static_cast<int64_t>(experts.size());
    VLM_CHECK(experts.rbegin()->first == n - 1, path_, ": ", prefix, " has per-expert tensors for ", n,
              " experts but the largest index is ", experts.rbegin()->first, " (hint: a shard is missing?)");
    Fused gate_up, down;
    for (const auto& [e, projs] : experts) {
      for (const char* p : {"gate_proj", "up_proj", "down_proj"})
        VLM_CHECK(projs.count(p), path_, ": expert ", e, " of ", prefix, " has no ", p, ".weight");
      for (const char* p : {"gate_proj", "up_proj"}) gate_up.parts.push_back(entries_.at(projs.at(p)));
      down.parts.push_back(entries_.at(projs.at("down_proj")));
    }
    const StTensorInfo& g0 = info(experts.begin()->second.at("gate_proj"));
    const StTensorInfo& d0 = info(experts.begin()->second.at("down_proj"));
    VLM_CHECK(g0.shape.size() == 2 && d0.shape == std::vector<int64_t>({g0.shape[1], g0.shape[0]}), path_, ": ",
              prefix, ".0: gate_proj ", c10::IntArrayRef(g0.shape), " and down_proj ", c10::IntArrayRef(d0.shape), " are not [I, d] and [d, I]");
    auto finish = [&](Fused& f, const std::string& name, std::vector<int64_t> shape, int64_t part_rows) {
      f.info.name = name;
      f.info.dtype = g0.dtype;
      f.info.shape = std::move(shape);
      for (const Entry& part : f.parts) {
        const StTensorInfo& pi = files_[part.file].info(part.stored_name);
        VLM_CHECK(pi.dtype == g0.dtype && pi.shape.size() == 2 && pi.shape[0] == part_rows &&
                      pi.numel() == g0.shape[0] * g0.shape[1],
                  path_, ": ", part.stored_name, " has shape ", c10::IntArrayRef(pi.shape), " and dtype ", pi.dtype,
                  ", expected the shape and dtype of every other expert's");
        f.numel.push_back(pi.numel());
      }
      f.info.end = static_cast<uint64_t>(f.info.numel()) * c10::elementSize(g0.dtype);
      fused_[name] = std::move(f);
    };
    finish(gate_up, prefix + ".gate_up_proj", {n, 2 * g0.shape[0], g0.shape[1]}, g0.shape[0]);
    finish(down, prefix + ".down_proj", {n, d0.shape[0], d0.shape[1]}, d0.shape[0]);
    for (const auto& [e, projs] : experts)
      for (const auto& [p, name] : projs) entries_.erase(name);
  }
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size() + fused_.size());
  for (const auto& [name, _] : entries_) out.push_back(name);
  for (const auto& [name, _] : fused_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

const HfCheckpoint::Entry& HfCheckpoint::entry(const std::string& canonical) const {
  if (auto f = fused_.find(canonical); f != fused_.end()) return f->second.parts.front();  // (messages)
  auto it = entries_.find(canonical);
  VLM_CHECK(it != entries_.end(), path_, ": checkpoint has no tensor \"", canonical, "\" (", entries_.size(),
            " tensors; names are matched after mapping model.visual.* -> visual.* and "
            "model.language_model.* -> model.*)");
  return it->second;
}

const StTensorInfo& HfCheckpoint::info(const std::string& canonical) const {
  if (auto f = fused_.find(canonical); f != fused_.end()) return f->second.info;
  const Entry& e = entry(canonical);
  return files_[e.file].info(e.stored_name);
}

const std::string& HfCheckpoint::stored_name(const std::string& canonical) const {
  return entry(canonical).stored_name;
}

const std::string& HfCheckpoint::file_of(const std::string& canonical) const {
  return files_[entry(canonical).file].source();
}

torch::Tensor HfCheckpoint::get(const std::string& canonical) const {
  if (auto f = fused_.find(canonical); f != fused_.end())
    return get_range(canonical, 0, f->second.info.numel()).view(f->second.info.shape);
  const Entry& e = entry(canonical);
  return files_[e.file].get(e.stored_name);
}

torch::Tensor HfCheckpoint::get_range(const std::string& canonical, int64_t lo, int64_t hi) const {
  if (auto f = fused_.find(canonical); f != fused_.end()) {  // the parts overlapping [lo, hi)
    const Fused& fu = f->second;
    VLM_CHECK(0 <= lo && lo <= hi && hi <= fu.info.numel(), path_, ": range [", lo, ", ", hi, ") of ", canonical,
              " outside its ", fu.info.numel(), " elements");
    std::vector<torch::Tensor> pieces;
    int64_t at = 0;
    for (size_t i = 0; i < fu.parts.size() && at < hi; at += fu.numel[i], ++i) {
      const int64_t a = std::max(lo, at), b = std::min(hi, at + fu.numel[i]);
      if (a < b) pieces.push_back(files_[fu.parts[i].file].get_range(fu.parts[i].stored_name, a - at, b - at));
    }
    if (pieces.empty()) return torch::empty({0}, torch::TensorOptions().dtype(fu.info.dtype));
    return pieces.size() == 1 ? pieces[0] : torch::cat(pieces);
  }
  const Entry& e = entry(canonical);
  return files_[e.file].get_range(e.stored_name, lo, hi);
}

// ---------------------------------------------------------------- loading

NamedTensors module_state(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

LoadPlan plan_module_load(const torch::nn::Module& module, const HfCheckpoint& ckpt, const LoadOptions& opts,
                          bool allow_meta) {
  LoadPlan plan;
  LoadReport& report = plan.report;
  std::set<TieKey> seen;
  std::set<std::string> module_names;
  std::vector<std::string> missing, bad_shape, meta;

  const size_t n_params = module.named_parameters(true).size();
  NamedTensors state = module_state(module);
  for (size_t i = 0; i < state.size(); ++i) {
    const std::string own = opts.prefix + state[i].first;
    auto alias = opts.read_from.find(own);
    const std::string name = alias == opts.read_from.end() ? own : alias->second;
    const torch::Tensor& dst = state[i].second;
    const bool is_param = i < n_params;
    module_names.insert(name);
    if (dst.is_meta()) meta.push_back(name);
    TieKey key = tie_key(dst);
    if (seen.count(key)) {
      ++report.tied_skipped;
      continue;
    }
    seen.insert(key);
    if (!ckpt.contains(name)) {
      if (is_param || opts.require_buffers) missing.push_back(name);
      else ++report.buffers_kept;
      continue;
    }
    const StTensorInfo& info = ckpt.info(name);
    if (!dst.sizes().equals(info.shape)) {
      bad_shape.push_back(str("\"", name, "\": checkpoint ", shape_str(info.shape), " vs module ",
                              shape_str(dst.sizes()), " (", ckpt.file_of(name), ")"));
      continue;
    }
    plan.todo.push_back({state[i].first, name, dst, is_param});
  }
  VLM_CHECK(allow_meta || meta.empty(), "load_module_weights: ", meta.size(),
            " tensors of the module are on the meta device: ", name_list(meta),
            " (hint: materialise the module on a real device first; LibTorch cannot "
            "swap a meta tensor's storage in place)");
  VLM_CHECK(missing.empty(), ckpt.path(), ": ", missing.size(), " tensors of the module are missing from the checkpoint: ",
            name_list(missing), " (hint: wrong checkpoint for this model config, or a partial download)");
  if (!bad_shape.empty()) {
    std::string list;
    for (size_t i = 0; i < bad_shape.size() && i < 10; ++i) list += (i ? "; " : "") + bad_shape[i];
    if (bad_shape.size() > 10) list += str(" ... and ", bad_shape.size() - 10, " more");
    throw Error(str(ckpt.path(), ": shape mismatch for ", bad_shape.size(), " tensors: ", list,
                    " (hint: config.json does not match these weights)"));
  }
  for (const auto& name : ckpt.names())
    if (starts_with(name, opts.prefix) && !module_names.count(name) && !opts.ignore.count(name))
      report.unexpected.push_back(name);
  VLM_CHECK(report.unexpected.empty() || opts.allow_unexpected, ckpt.path(), ": ", report.unexpected.size(),
            " checkpoint tensors have no parameter or buffer in the module: ", name_list(report.unexpected),
            " (hint: wrong model config, or pass allow_unexpected to ignore them)");
  return plan;
}

LoadReport load_module_weights(torch::nn::Module& module, const HfCheckpoint& ckpt, const LoadOptions& opts) {
  // Plan and check everything first, so a failed load leaves the module untouched.
  LoadPlan plan = plan_module_load(module, ckpt, opts, /*allow_meta=*/false);
  LoadReport report = std::move(plan.report);
  torch::NoGradGuard no_grad;
  for (auto& e : plan.todo) {
    torch::Tensor src = ckpt.get(e.name);
    if (src.scalar_type() != e.dst.scalar_type()) ++report.converted;
    report.bytes_read += ckpt.info(e.name).nbytes();
    e.dst.copy_(src);
    ++report.loaded;
  }
  return report;
}

LoadReport load_module_weights(torch::nn::Module& module, const std::string& dir_or_file, const LoadOptions& opts) {
  return load_module_weights(module, HfCheckpoint::open(dir_or_file), opts);
}

TiedHead resolve_tied_head(VlmConfig& cfg, const HfCheckpoint& ckpt, LoadOptions base) {
  TiedHead out{std::move(base), ""};
  const std::string head = out.load.prefix + "lm_head.weight";
  const std::string embed = out.load.prefix + "model.embed_tokens.weight";
  if (!cfg.tie_word_embeddings || !ckpt.contains(head)) return out;
  if (!ckpt.contains(embed)) {
    out.load.read_from[embed] = head;
    out.note = str(ckpt.path(), ": tie_word_embeddings is true and the checkpoint holds ",
                   "lm_head.weight but no model.embed_tokens.weight: the tied embedding is read ",
                   "from lm_head.weight (as transformers does)");
    return out;
  }
  torch::Tensor h = ckpt.get(head), e = ckpt.get(embed);
  bool equal = h.sizes() == e.sizes();
  if (equal) {
    if (h.scalar_type() != e.scalar_type()) {
      h = h.to(torch::kFloat64);
      e = e.to(torch::kFloat64);
    }
    equal = torch::equal(h, e);
  }
  if (equal) {
    out.load.ignore.insert(head);
    out.note = str(ckpt.path(), ": tie_word_embeddings is true and the checkpoint also holds ",
                   "lm_head.weight, equal to model.embed_tokens.weight: ignored, the head stays tied");
  } else {
    cfg.tie_word_embeddings = false;
    out.note = str(ckpt.path(), ": tie_word_embeddings is true but the checkpoint's lm_head.weight ",
                   "differs from model.embed_tokens.weight: NOT tied, both are loaded (as transformers ",
                   "does; hint: set tie_word_embeddings false in config.json to say so)");
  }
  return out;
}

// ---------------------------------------------------------------- writing

SaveHfReport save_hf_checkpoint(const std::string& dir, const NamedTensors& tensors, const SaveHfOptions& opts) {
  VLM_CHECK(!dir.empty(), "save_hf_checkpoint: empty directory path");
  VLM_CHECK(opts.max_shard_bytes > 0, "save_hf_checkpoint: max_shard_bytes must be > 0");
  if (opts.dtype)
    VLM_CHECK(at::isFloatingType(*opts.dtype), "save_hf_checkpoint: dtype must be floating (bf16 or fp32), got ",
              c10::toString(*opts.dtype));
  std::error_code ec;
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
  const bool existed = fs::exists(target, ec);
  VLM_CHECK(!existed || opts.overwrite, dir, ": already exists (hint: choose a new directory, or overwrite)");

  // Drop tied repeats, apply the naming style, assign shards.
  SaveHfReport report;
  NamedTensors unique;
  std::set<TieKey> seen;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    VLM_CHECK(t.defined(), "save_hf_checkpoint: tensor \"", name, "\" is undefined");
    VLM_CHECK(!t.is_meta(), "save_hf_checkpoint: tensor \"", name, "\" is on the meta device (no data to write)");
    if (!seen.insert(tie_key(t)).second) {
      ++report.tied_skipped;
      continue;
    }
    std::string styled = styled_hf_name(name, opts.style);
    VLM_CHECK(names.insert(styled).second, "save_hf_checkpoint: duplicate tensor name \"", styled, "\"");
    unique.emplace_back(styled, t);
  }
  std::vector<NamedTensors> shards(1);
  uint64_t shard_bytes = 0;
  for (const auto& [name, t] : unique) {
    torch::ScalarType dt = t.scalar_type();
    if (opts.dtype && at::isFloatingType(dt)) dt = *opts.dtype;
    uint64_t nbytes = uint64_t(t.numel()) * st_dtype_size(dt);
    if (!shards.back().empty() && shard_bytes + nbytes > opts.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, t);
    shard_bytes += nbytes;
    report.total_size += nbytes;
  }
  report.tensors_written = int64_t(unique.size());

  std::set<std::string> model_files{kSingleFile, kIndexFile};
  std::vector<std::string> shard_names;
  if (shards.size() == 1) {
    shard_names.push_back(kSingleFile);
  } else {
    for (size_t i = 0; i < shards.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      shard_names.push_back(buf);
      model_files.insert(buf);
    }
  }
  for (const auto& [fname, _] : opts.extra_files) {
    VLM_CHECK(!fname.empty() && fname.find('/') == std::string::npos && fname != "." && fname != "..",
              "save_hf_checkpoint: extra file name \"", fname, "\" must be a plain file name");
    VLM_CHECK(!model_files.count(fname), "save_hf_checkpoint: extra file \"", fname,
              "\" would replace a weights file");
  }

  StagedDir out(dir);
  const fs::path& tmp = out.tmp();
  {
    SafetensorsWriteOptions wopts;
    wopts.float_dtype = opts.dtype;
    wopts.metadata = opts.metadata;
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      save_safetensors((tmp / shard_names[i]).string(), shards[i], wopts);
      report.files.push_back(shard_names[i]);
      for (const auto& [name, _] : shards[i]) weight_map[name] = shard_names[i];
    }
    if (shards.size() > 1) {
      json index = {{"metadata", {{"total_size", report.total_size}}}, {"weight_map", weight_map}};
      write_file_synced((tmp / kIndexFile).string(), index.dump(2) + "\n");
      report.files.push_back(kIndexFile);
    }
    for (const auto& [fname, text] : opts.extra_files) {
      write_file_synced((tmp / fname).string(), text);
      report.files.push_back(fname);
    }
    out.commit();
  }
  return report;
}

}  // namespace vlm

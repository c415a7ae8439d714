// Training checkpoints (see checkpoint.h).
#include "app/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "vlm/model/config.h"
#include "vlm/model/tensor_parallel.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/runtime_info.h"

namespace fs = std::filesystem;

namespace vlm::app {
namespace {

constexpr int kFormatVersion = 1;

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return;  // best effort for directories on filesystems that refuse it
  ::fsync(fd);
  ::close(fd);
}

// Writes `text` to `path`: temp file, fsync, rename.
void write_durable(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    VLM_CHECK(out.good(), "checkpoint: cannot write ", tmp, " (hint: permissions or a full disk)");
    out << text;
    out.flush();
    VLM_CHECK(out.good(), "checkpoint: writing ", tmp, " failed (disk full?)");
  }
  fsync_path(tmp, false);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  VLM_CHECK(!ec, "checkpoint: cannot rename ", tmp, " to ", path, ": ", ec.message());
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in.good(), "checkpoint: cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string rank_file(int64_t rank, int64_t world) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "state-rank%05lld-of-%05lld.safetensors", static_cast<long long>(rank),
                static_cast<long long>(world));
  return buf;
}

// The step of a "step-<digits>" directory name, or -1.
int64_t step_of(const std::string& name) {
  static const std::regex re("step-([0-9]+)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  return std::stoll(m[1].str());
}

nlohmann::json unit_layout(const std::vector<vlm::sharding::UnitPlan>& units, bool stores_frozen) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& u : units) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : u.params)
      params.push_back({{"name", p.name}, {"shape", p.param.sizes().vec()},
                        {"dtype", vlm::st_dtype_name(p.param.scalar_type())}});
    out.push_back({{"path", u.path},
                   {"trainable", u.trainable()},
                   {"stored", u.trainable() || stores_frozen},
                   {"sharding", vlm::sharding::sharding_name(u.sharding)},
                   {"numel", u.numel},
                   {"params", params}});
  }
  return out;
}

// "STEP[:RANK]" -> does it name (step, rank)? RANK 0 when absent.
bool names_step_and_rank(const std::string& spec, int64_t step, int64_t rank) {
  const size_t colon = spec.find(':');
  if (std::stoll(spec.substr(0, colon)) != step) return false;
  return (colon == std::string::npos ? 0 : std::stoll(spec.substr(colon + 1))) == rank;
}

// Test hook: VLMTRAIN_FAULT_EXIT_IN_SAVE="STEP[:RANK]" kills RANK (default 0) with _exit(3)
// right after it wrote its state file for step STEP (the checkpoint is then incomplete; with
// checkpoint.async the kill comes from the writing thread while training goes on).
void maybe_exit_in_save(int64_t step, int64_t rank) {
  const char* env = std::getenv("VLMTRAIN_FAULT_EXIT_IN_SAVE");
  if (env == nullptr || *env == '\0' || !names_step_and_rank(env, step, rank)) return;
  std::fprintf(stderr, "VLMTRAIN_FAULT_EXIT_IN_SAVE: rank %lld exits while saving step %lld\n",
               static_cast<long long>(rank), static_cast<long long>(step));
  std::fflush(stderr);
  ::_exit(3);
}

// Test hook: VLMTRAIN_FAULT_SLOW_SAVE="MS[:RANK]" makes RANK's (default 0) every state-file
// write take MS milliseconds longer (a sleep before it writes): a slow filesystem, so that an
// asynchronous write is still in flight at later step boundaries.
void maybe_slow_save(int64_t rank) {
  const char* env = std::getenv("VLMTRAIN_FAULT_SLOW_SAVE");
  if (env == nullptr || *env == '\0') return;
  const std::string s = env;
  const size_t colon = s.find(':');
  if ((colon == std::string::npos ? 0 : std::stoll(s.substr(colon + 1))) != rank) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(std::stoll(s.substr(0, colon))));
}

// Every rank: 1 if `fn` succeeded; throws the same error everywhere when any rank failed.
void all_ok(vlm::sharding::Comm& comm, const std::function<void()>& fn, const std::string& what) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
  }
  torch::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kFloat64);
  comm.all_reduce(failed, vlm::sharding::ReduceOp::kSum, "checkpoint: " + what);
  if (!error.empty()) throw vlm::Error(error);
  VLM_CHECK(failed.item<double>() == 0, "checkpoint: ", what, " failed on ", failed.item<double>(),
            " other rank(s) (their logs name the reason); the previous checkpoint is untouched");
}

}  // namespace

nlohmann::json TrainerState::to_json() const {
  return {{"step", step},
          {"optimizer_steps", optimizer_steps},
          {"cursor", {{"epoch", cursor.epoch}, {"offset", cursor.offset}}},
          {"bad_steps", bad_steps},
          {"consecutive_bad", consecutive_bad},
          {"tokens_seen", tokens_seen},
          {"samples_seen", samples_seen},
          {"images_seen", images_seen},
          {"train_seconds", train_seconds}};
}

TrainerState TrainerState::from_json(const nlohmann::json& j, const std::string& source) {
  try {
    TrainerState s;
    s.step = j.at("step").get<int64_t>();
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    s.cursor.epoch = j.at("cursor").at("epoch").get<int64_t>();
    s.cursor.offset = j.at("cursor").at("offset").get<int64_t>();
    s.bad_steps = j.at("bad_steps").get<int64_t>();
    s.consecutive_bad = j.at("consecutive_bad").get<int64_t>();
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    s.samples_seen = j.at("samples_seen").get<int64_t>();
    s.images_seen = j.at("images_seen").get<int64_t>();
    s.train_seconds = j.at("train_seconds").get<double>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw vlm::Error(vlm::str(source, ": trainer state is malformed: ", e.what()));
  }
}

std::string checkpoint_dir(const std::string& output_dir, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return (fs::path(output_dir) / buf).string();
}

CheckpointWrite::CheckpointWrite(const std::string& output_dir, const TrainerState& state,
                                 const vlm::sharding::ShardedModel& model, vlm::sharding::Comm& comm,
                                 const torch::Device& rng_device)
    : output_dir_(output_dir),
      final_dir_(checkpoint_dir(output_dir, state.step)),
      state_(state),
      rank_(comm.rank()),
      world_(comm.world_size()) {
  tmp_dir_ = (fs::path(output_dir) / ("." + fs::path(final_dir_).filename().string() + ".tmp")).string();
  all_ok(comm, [&] {
    if (rank_ != 0) return;
    std::error_code ec;
    fs::remove_all(tmp_dir_, ec);
    fs::create_directories(tmp_dir_, ec);
    VLM_CHECK(!ec, "checkpoint: cannot create ", tmp_dir_, ": ", ec.message(), " (hint: check run.output_dir)");
  }, "create " + tmp_dir_);
  try {
    if (rank_ == 0) units_ = unit_layout(model.layout_table(), model.stores_frozen());
    tp_ = model.tp();
    nlohmann::json meta = nlohmann::json::object();
    for (auto& sl : model.state_slices()) {  // host copies (StateSlice::data)
      meta[sl.key] = {sl.lo, sl.hi, sl.numel};
      tensors_.emplace_back(sl.key, std::move(sl.data));
    }
    for (auto& r : capture_rng_states(rng_device)) tensors_.push_back(std::move(r));
    metadata_ = {{"slices", meta.dump()}, {"rank", std::to_string(rank_)}, {"world_size", std::to_string(world_)}};
  } catch (const std::exception& e) {
    error_ = vlm::str("checkpoint: copying rank ", rank_, "'s state for step ", state.step, " failed: ", e.what());
  }
}

int64_t CheckpointWrite::snapshot_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

void CheckpointWrite::write() noexcept {
  if (!error_.empty()) return;
  try {
    maybe_slow_save(rank_);
    vlm::SafetensorsWriteOptions so;
    so.metadata = metadata_;
    vlm::save_safetensors((fs::path(tmp_dir_) / rank_file(rank_, world_)).string(), tensors_, so);
    maybe_exit_in_save(state_.step, rank_);
  } catch (const std::exception& e) {
    error_ = e.what();
  }
}

std::string CheckpointWrite::commit(vlm::sharding::Comm& comm, const CheckpointFiles& files, int64_t keep_last) {
  all_ok(comm, [&] {
    if (!error_.empty()) throw vlm::Error(error_);
  }, "write rank state");
  all_ok(comm, [&] {
    if (rank_ != 0) return;
    nlohmann::json j = {{"format_version", kFormatVersion},
                        {"state", state_.to_json()},
                        {"world_size", world_},
                        {"tensor_parallel", tp_},
                        {"files", nlohmann::json::array()},
                        {"units", units_},
                        {"recipe_hash", files.recipe_hash},
                        {"tokenizer", files.tokenizer_path},
                        {"versions", {{"vlmtrain", VLMTRAIN_VERSION}, {"libtorch", vlm::torch_version()}}}};
    for (int64_t r = 0; r < world_; ++r) j["files"].push_back(rank_file(r, world_));
    write_durable((fs::path(tmp_dir_) / "trainer.json").string(), j.dump(2) + "\n");
    write_durable((fs::path(tmp_dir_) / "recipe.toml").string(), files.recipe_toml);
    write_durable((fs::path(tmp_dir_) / "config.json").string(), files.config_json);
    fsync_path(tmp_dir_, true);
    std::error_code ec;
    fs::remove_all(final_dir_, ec);  // an incomplete leftover of the same step
    fs::rename(tmp_dir_, final_dir_, ec);
    VLM_CHECK(!ec, "checkpoint: cannot rename ", tmp_dir_, " to ", final_dir_, ": ", ec.message());
    fsync_path(output_dir_, true);
    write_durable((fs::path(final_dir_) / "COMPLETE").string(), "step " + std::to_string(state_.step) + "\n");
    fsync_path(final_dir_, true);
    if (keep_last > 0) {
      std::vector<std::string> all = complete_checkpoints(output_dir_);
      for (size_t k = 0; k + static_cast<size_t>(keep_last) < all.size(); ++k) fs::remove_all(all[k], ec);
    }
  }, "finish " + final_dir_);
  return final_dir_;
}

std::string save_checkpoint(const std::string& output_dir, const TrainerState& state,
                            const vlm::sharding::ShardedModel& model, vlm::sharding::Comm& comm,
                            const CheckpointFiles& files, int64_t keep_last, const torch::Device& rng_device) {
  CheckpointWrite w(output_dir, state, model, comm, rng_device);
  w.write();
  return w.commit(comm, files, keep_last);
}

std::vector<std::string> complete_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const int64_t step = step_of(e.path().filename().string());
    if (step >= 0 && e.is_directory() && fs::exists(e.path() / "COMPLETE")) found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::optional<std::string> resolve_resume(const std::string& resume, const std::string& output_dir) {
  if (resume == "none") return std::nullopt;
  if (resume == "auto") {
    std::vector<std::string> all = complete_checkpoints(output_dir);
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  VLM_CHECK(fs::is_directory(resume), "checkpoint.resume: ", resume,
            " is not a directory (expected auto | none | a step-<N> checkpoint directory)");
  VLM_CHECK(fs::exists(fs::path(resume) / "COMPLETE"), "checkpoint.resume: ", resume,
            " has no COMPLETE marker: it is an incomplete checkpoint (a save that was interrupted); "
            "hint: resume from an earlier step-<N> directory");
  return resume;
}

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  VLM_CHECK(fs::is_directory(dir), "checkpoint ", dir, ": not a directory");
  VLM_CHECK(fs::exists(fs::path(dir) / "COMPLETE"), "checkpoint ", dir,
            ": no COMPLETE marker (an interrupted save); hint: use an earlier step-<N> directory");
  const std::string tj = (fs::path(dir) / "trainer.json").string();
  try {
    meta_ = nlohmann::json::parse(read_text(tj));
  } catch (const nlohmann::json::exception& e) {
    throw vlm::Error(vlm::str(tj, ": not valid JSON: ", e.what()));
  }
  VLM_CHECK(meta_.value("format_version", 0) == kFormatVersion, tj, ": format_version ",
            meta_.value("format_version", 0), ", expected ", kFormatVersion);
  VLM_CHECK(meta_.contains("files") && meta_["files"].is_array(), tj, ": missing the \"files\" list");
  if (tensor_parallel() > 1) tp_cfg_ = vlm::load_hf_config((fs::path(dir) / "config.json").string());
  for (const auto& f : meta_["files"]) {
    const std::string path = (fs::path(dir) / f.get<std::string>()).string();
    VLM_CHECK(fs::exists(path), "checkpoint ", dir, ": rank file ", f.get<std::string>(),
              " listed in trainer.json is missing");
    files_.push_back(vlm::SafetensorsFile::open(path));
    const size_t fi = files_.size() - 1;
    const auto& md = files_.back().metadata();
    auto it = md.find("slices");
    VLM_CHECK(it != md.end(), path, ": no \"slices\" metadata (not a vlmtrain state file)");
    nlohmann::json slices = nlohmann::json::parse(it->second);
    for (const auto& [key, v] : slices.items()) {
      const int64_t lo = v.at(0), hi = v.at(1), numel = v.at(2);
      VLM_CHECK(files_.back().contains(key) && files_.back().info(key).numel() == hi - lo, path, ": slice ", key,
                " [", lo, ", ", hi, ") does not match its tensor");
      pieces_[key].push_back({fi, lo, hi});
      numel_[key] = numel;
    }
  }
  for (auto& [key, ps] : pieces_)
    std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.lo < b.lo; });
  // Each parameter's place, from the unit layout.
  for (const auto& u : meta_.value("units", nlohmann::json::array())) {
    int64_t off = 0, index = 0;
    for (const auto& p : u.at("params")) {
      int64_t n = 1;
      for (int64_t d : p.at("shape").get<std::vector<int64_t>>()) n *= d;
      const std::string name = p.at("name");
      params_[name] = {u.at("path").get<std::string>(), off, n, index++, pieces_.count(name + "/master") > 0,
                       p.at("shape").get<std::vector<int64_t>>()};
      off += n;
    }
  }
}

TrainerState CheckpointReader::state() const {
  return TrainerState::from_json(meta_.at("state"), dir_ + "/trainer.json");
}
int64_t CheckpointReader::world_size() const { return meta_.at("world_size").get<int64_t>(); }
int64_t CheckpointReader::tensor_parallel() const { return meta_.value("tensor_parallel", int64_t{1}); }
std::string CheckpointReader::recipe_hash() const { return meta_.value("recipe_hash", ""); }
std::string CheckpointReader::config_json() const { return read_text((fs::path(dir_) / "config.json").string()); }
std::string CheckpointReader::tokenizer_path() const { return meta_.value("tokenizer", ""); }

std::pair<std::string, int64_t> CheckpointReader::resolve(const std::string& key) const {
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos) return {"", 0};
  auto it = params_.find(key.substr(0, slash));
  if (it == params_.end()) return {"", 0};
  const ParamAt& at = it->second;
  const std::string kind = key.substr(slash + 1);
  if (kind == "step") return {at.row + "/step", at.index};
  if (at.own_keys || (kind != "master" && kind != "exp_avg" && kind != "exp_avg_sq" && kind != "param")) return {"", 0};
  return {at.row + "/" + kind, at.offset};
}

bool CheckpointReader::tp_param_key(const std::string& key, std::string* param, std::string* kind) const {
  if (tensor_parallel() <= 1) return false;
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos || !params_.count(key.substr(0, slash))) return false;
  *param = key.substr(0, slash);
  *kind = key.substr(slash + 1);
  return true;
}

int64_t CheckpointReader::tp_numel(const std::string& param) const {
  const ParamAt& at = params_.at(param);
  const vlm::TpSplit split = vlm::tensor_parallel_split(tp_cfg_, param, tensor_parallel());
  return split.split() ? at.numel * split.parts : at.numel;
}

torch::Tensor CheckpointReader::tp_full(const std::string& param, const std::string& kind) const {
  const std::string key = param + "/" + kind;
  if (key == tp_cache_key_) return tp_cache_;
  const ParamAt& at = params_.at(param);
  const int64_t tp = tensor_parallel();
  const vlm::TpSplit split = vlm::tensor_parallel_split(tp_cfg_, param, tp);
  std::vector<torch::Tensor> parts;
  for (int64_t t = 0; t < (split.split() ? tp : 1); ++t)
    parts.push_back(read(vlm::str("tp", t, "of", tp, "/", at.row, "/", kind), at.offset, at.offset + at.numel)
                        .view(at.shape));
  tp_cache_ = split.split() ? vlm::tp_unslice(parts, split) : parts.front();
  tp_cache_key_ = key;
  return tp_cache_;
}

int64_t CheckpointReader::numel(const std::string& key) const {
  if (auto it = numel_.find(key); it != numel_.end()) return it->second;
  std::string param, kind;
  if (tp_param_key(key, &param, &kind)) return kind == "step" ? 1 : tp_numel(param);
  const auto [stored, offset] = resolve(key);
  if (stored.empty() || !numel_.count(stored)) return -1;
  return key.compare(key.size() - 5, 5, "/step") == 0 ? 1 : params_.at(key.substr(0, key.rfind('/'))).numel;
}

torch::Tensor CheckpointReader::read(const std::string& key, int64_t lo, int64_t hi) const {
  std::string param, kind;
  if (!pieces_.count(key) && tp_param_key(key, &param, &kind)) {  // the tp ranks' slices put together
    const ParamAt& at = params_.at(param);
    if (kind == "step")
      return read(vlm::str("tp0of", tensor_parallel(), "/", at.row, "/step"), at.index + lo, at.index + hi);
    const int64_t n = tp_numel(param);
    VLM_CHECK(0 <= lo && lo <= hi && hi <= n, "checkpoint ", dir_, ": range [", lo, ", ", hi, ") of ", key,
              " is outside its ", n, " elements (hint: a different model shape)");
    return tp_full(param, kind).reshape({-1}).narrow(0, lo, hi - lo).clone();
  }
  if (!pieces_.count(key)) {  // a parameter's part of its unit's vector
    const auto [stored, offset] = resolve(key);
    const int64_t n = numel(key);
    if (n >= 0) {
      VLM_CHECK(0 <= lo && lo <= hi && hi <= n, "checkpoint ", dir_, ": range [", lo, ", ", hi, ") of ", key,
                " is outside its ", n, " elements (hint: a different model shape)");
      return read(stored, offset + lo, offset + hi);
    }
  }
  auto it = pieces_.find(key);
  VLM_CHECK(it != pieces_.end(), "checkpoint ", dir_, ": no state named ", key,
            " (hint: the model's units or policies differ from the run that wrote it)");
  VLM_CHECK(0 <= lo && lo <= hi && hi <= numel_.at(key), "checkpoint ", dir_, ": range [", lo, ", ", hi, ") of ",
            key, " is outside its ", numel_.at(key), " elements (hint: a different model shape)");
  torch::Tensor out;
  int64_t covered = 0;
  for (const Piece& p : it->second) {
    const int64_t a = std::max(lo, p.lo), b = std::min(hi, p.hi);
    if (a >= b) continue;
    torch::Tensor t = files_[p.file].get(key).view({-1});
    if (!out.defined()) out = torch::empty({hi - lo}, t.options());
    out.narrow(0, a - lo, b - a).copy_(t.narrow(0, a - p.lo, b - a));
    covered += b - a;
  }
  if (!out.defined()) out = torch::empty({0}, torch::kFloat32);
  VLM_CHECK(covered == hi - lo, "checkpoint ", dir_, ": ", key, " [", lo, ", ", hi, ") is covered only for ",
            covered, " elements (hint: a rank file is missing or from another run)");
  return out;
}

vlm::sharding::StateReader CheckpointReader::reader() const {
  return {[this](const std::string& key, int64_t lo, int64_t hi) { return read(key, lo, hi); },
          [this](const std::string& key) { return numel(key); }};
}

torch::Tensor CheckpointReader::rng_state(int64_t rank, const std::string& key) const {
  VLM_CHECK(key == kRngCpuKey || key == kRngCudaKey, "checkpoint ", dir_, ": no RNG state kind ", key,
            " (expected ", kRngCpuKey, " or ", kRngCudaKey, ")");
  if (rank < 0 || rank >= static_cast<int64_t>(files_.size()) || !files_[rank].contains(key)) return {};
  return files_[rank].get(key).clone();
}

std::vector<std::string> CheckpointReader::rng_keys(int64_t rank) const {
  std::vector<std::string> out;
  if (rank < 0 || rank >= static_cast<int64_t>(files_.size())) return out;
  for (const auto& name : files_[rank].names())
    if (name.rfind("rng/", 0) == 0) out.push_back(name);
  return out;
}

vlm::NamedTensors CheckpointReader::consolidated() const {
  if (tensor_parallel() > 1) return consolidated_tp();
  vlm::NamedTensors out;
  for (const auto& u : meta_.at("units")) {
    const std::string path = u.at("path");
    const int64_t numel = u.at("numel");
    if (!u.value("stored", true)) continue;  // LoRA checkpoint: the frozen base is not in it
    const char* kind = u.at("trainable").get<bool>() ? "/master" : "/param";
    torch::Tensor flat;
    int64_t off = 0;
    for (const auto& p : u.at("params")) {
      const std::string name = p.at("name");
      std::vector<int64_t> shape = p.at("shape");
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      if (params_.at(name).own_keys) {  // expert parallel: all E experts, the row's shape has the rank's
        const int64_t all = numel_.at(name + "/master"), per_expert = n / std::max<int64_t>(1, shape.at(0));
        shape[0] = all / per_expert;
        out.emplace_back(name, read(name + "/master", 0, all).view(shape));
        continue;
      }
      if (!flat.defined()) flat = read(path + kind, 0, numel);
      out.emplace_back(name, flat.narrow(0, off, n).view(shape));
      off += n;
    }
  }
  return out;
}

// Tensor parallelism: each parameter from its tp ranks' slices (tp_full).
vlm::NamedTensors CheckpointReader::consolidated_tp() const {
  vlm::NamedTensors out;
  for (const auto& u : meta_.at("units")) {
    if (!u.value("stored", true)) continue;
    const char* kind = u.at("trainable").get<bool>() ? "master" : "param";
    for (const auto& p : u.at("params")) {
      const std::string name = p.at("name");
      out.emplace_back(name, tp_full(name, kind).clone());
    }
  }
  return out;
}

}  // namespace vlm::app

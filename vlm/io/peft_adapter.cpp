// PEFT LoRA adapter directories (see peft_adapter.h).
#include "vlm/io/peft_adapter.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "vlm/runtime/check.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/lora.h"
#include "vlm/io/safetensors.h"
#include "vlm/io/staged_dir.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;  // keeps file order: rank_pattern keys are tried in it

const char kPeftConfigFile[] = "adapter_config.json";
const char kPeftWeightsFile[] = "adapter_model.safetensors";
const char kPeftPickleFile[] = "adapter_model.bin";

// ---------------------------------------------------------------- config fields

// The value of `key`, or nullptr when absent or null.
const ojson* peft_field(const ojson& cfg, const char* key) {
  auto it = cfg.find(key);
  return it == cfg.end() || it->is_null() ? nullptr : &*it;
}

// A setting that is "on": not null, not false, not 0, not an empty string or list; any object.
bool peft_is_set(const ojson* v) {
  if (v == nullptr) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number()) return v->get<double>() != 0;
  if (v->is_string()) return !v->get<std::string>().empty();
  if (v->is_array()) return !v->empty();
  return true;
}

double peft_number(const ojson& cfg, const char* key, double dflt, const std::string& file) {
  const ojson* v = peft_field(cfg, key);
  if (v == nullptr) return dflt;
  VLM_CHECK(v->is_number(), file, ": \"", key, "\" must be a number, got ", v->dump());
  return v->get<double>();
}

int64_t peft_rank(const ojson& v, const std::string& file, const std::string& what) {
  VLM_CHECK(v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())),
            file, ": ", what, " must be a positive integer, got ", v.dump());
  const int64_t r = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  VLM_CHECK(r >= 1, file, ": ", what, " must be a positive integer, got ", v.dump());
  return r;
}

LoraInit peft_init(const ojson* v, const std::string& file) {
  if (v == nullptr || v->is_boolean()) return LoraInit::kaiming;  // true: kaiming; false: values come from the file
  VLM_CHECK(v->is_string(), file, ": \"init_lora_weights\" must be true, false or a string, got ", v->dump());
  const std::string s = v->get<std::string>();
  if (s == "gaussian") return LoraInit::gaussian;
  // These only draw A and B, which the file's values then replace.
  if (s == "eva" || s == "orthogonal" || s == "mica") return LoraInit::kaiming;
  for (const char* p : {"pissa", "corda", "olora", "loftq", "lora_ga"}) {
    VLM_CHECK(s.rfind(p, 0) != 0, file, ": init_lora_weights \"", s,
              "\" is not supported: PEFT rewrites the base weights when it creates such an adapter, so the "
              "adapter alone does not describe the model (hint: convert it to a plain LoRA adapter with "
              "save_pretrained(..., path_initial_model_for_weight_conversion=...))");
  }
  throw Error(str(file, ": unknown init_lora_weights \"", s,
                  "\" (expected true, false, \"gaussian\", \"eva\", \"orthogonal\" or \"mica\")"));
}

// ---------------------------------------------------------------- rank_pattern / alpha_pattern

struct PeftPattern {
  std::string key;
  std::regex re;  // (.*\.)?(key), matched against the whole module name
};

std::vector<PeftPattern> peft_compile(const std::vector<std::string>& keys, const std::string& file,
                                      const char* field) {
  std::vector<PeftPattern> out;
  for (const auto& k : keys) {
    try {
      out.push_back({k, std::regex("(.*\\.)?(" + k + ")", std::regex::ECMAScript)});
    } catch (const std::regex_error& e) {
      throw Error(str(file, ": ", field, " key \"", k, "\" is not a regex vlmtrain can read (", e.what(),
                      "; hint: use plain module names or suffixes such as \"layers.0.self_attn.q_proj\")"));
    }
  }
  return out;
}

// get_pattern_key: index of the first pattern matching one of `names`, or -1.
int peft_match(const std::vector<PeftPattern>& patterns, const std::vector<std::string>& names) {
  for (size_t i = 0; i < patterns.size(); ++i)
    for (const auto& n : names)
      if (std::regex_match(n, patterns[i].re)) return static_cast<int>(i);
  return -1;
}

// re.escape for module names, anchored: PEFT's (.*\.)?(^...)$ then matches only that name.
std::string peft_exact_key(const std::string& module) {
  std::string k = "^";
  for (char c : module) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') k += '\\';
    k += c;
  }
  return k;
}

std::string peft_slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  VLM_CHECK(f, path, ": cannot read: ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------- writing helpers

// The value most modules share (ties: the first seen in module order).
template <typename T>
T peft_most_common(const std::vector<T>& values) {
  std::map<T, int> count;
  for (const auto& v : values) ++count[v];
  T best = values.front();
  for (const auto& v : values)
    if (count[v] > count[best]) best = v;
  return best;
}

// alpha as JSON: an integer when it is one (as PEFT configs usually hold it).
ojson peft_alpha_json(double a) {
  if (a == std::floor(a) && std::abs(a) < 1e15) return static_cast<int64_t>(a);
  return a;
}

}  // namespace

// ---------------------------------------------------------------- read

// The canonical parameter name of a modules_to_save tensor ("base_model.model.<module>.<p>"),
// which must lie under one of the config's modules_to_save entries (PEFT's matching: the
// module name is the entry or ends with "." + entry).
std::string peft_saved_canonical(const std::string& name, const std::vector<std::string>& saved,
                                 const std::string& st_path, const std::string& cfg_path) {
  const std::string prefix = "base_model.model.";
  VLM_CHECK(name.rfind(prefix, 0) == 0, st_path, ": tensor '", name, "' does not start with '", prefix,
            "' (hint: a PEFT adapter saved by save_pretrained)");
  const std::string stored = name.substr(prefix.size());
  for (const std::string& e : saved) {
    const size_t at = stored.rfind(e + ".");
    if (at != std::string::npos && (at == 0 || stored[at - 1] == '.')) return canonical_hf_name(stored);
  }
  throw Error(str(st_path, ": tensor '", name, "' is neither a LoRA tensor (<module>.lora_A/lora_B.weight) nor under ",
                  "a module of modules_to_save in ", cfg_path, " (hint: only LoRA adapters, optionally with ",
                  "modules_to_save, are supported: no DoRA magnitudes or lora biases)"));
}

PeftAdapter read_peft_adapter(const std::string& dir) {
  std::error_code ec;
  VLM_CHECK(fs::is_directory(dir, ec), dir, ": not a directory (hint: a PEFT adapter directory holds ",
            kPeftConfigFile, " and ", kPeftWeightsFile, ", as save_pretrained writes them)");
  const std::string cfg_path = (fs::path(dir) / kPeftConfigFile).string();
  const std::string st_path = (fs::path(dir) / kPeftWeightsFile).string();
  VLM_CHECK(fs::exists(cfg_path, ec), cfg_path, ": missing (hint: a PEFT adapter directory holds ", kPeftConfigFile,
            " and ", kPeftWeightsFile, ")");
  if (!fs::exists(st_path, ec)) {
    const std::string bin = (fs::path(dir) / kPeftPickleFile).string();
    VLM_CHECK(!fs::exists(bin, ec), st_path, ": missing; ", bin,
              " is a pickle, which vlmtrain does not read (hint: convert it: torch.load, then "
              "safetensors.torch.save_file)");
    throw Error(str(st_path, ": missing (hint: PEFT writes it with save_pretrained(safe_serialization=True), "
                             "the default)"));
  }

  // --- adapter_config.json
  ojson cfg;
  try {
    cfg = ojson::parse(peft_slurp(cfg_path));
  } catch (const ojson::exception& e) {
    throw Error(str(cfg_path, ": not valid JSON (", e.what(), ")"));
  }
  VLM_CHECK(cfg.is_object(), cfg_path, ": expected a JSON object, got ", cfg.type_name());
  const ojson* type = peft_field(cfg, "peft_type");
  VLM_CHECK(type && type->is_string() && type->get<std::string>() == "LORA", cfg_path, ": peft_type is ",
            type ? type->dump() : "missing", ", expected \"LORA\" (only LoRA adapters are supported)");
  const ojson* bias = peft_field(cfg, "bias");
  VLM_CHECK(!bias || (bias->is_string() && bias->get<std::string>() == "none"), cfg_path, ": bias is ", bias->dump(),
            ", expected \"none\" (trained base biases are not part of a LoRA adapter vlmtrain reads)");
  struct Unsupported {
    const char* key;
    const char* why;
  };
  for (const Unsupported& u : {
           Unsupported{"use_dora", "DoRA adds a magnitude vector and normalises the weight"},
           Unsupported{"fan_in_fan_out", "transposed (Conv1D-style) base weights are not used by Qwen2-VL"},
           Unsupported{"lora_bias", "lora_B with a bias is not supported"},
           Unsupported{"layer_replication", "replicated layers change the model"},
           Unsupported{"target_parameters", "LoRA on bare parameters is not supported"},
           Unsupported{"trainable_token_indices", "trainable tokens are not read"},
           Unsupported{"alora_invocation_tokens", "activated LoRA changes the forward"},
           Unsupported{"arrow_config", "Arrow routing changes the forward"},
           Unsupported{"kasa_config", "KaSA changes the base weights"},
           Unsupported{"monteclora_config", "MonteCLoRA changes the forward"},
           Unsupported{"use_bdlora", "block-diagonal LoRA changes the adapter shapes"},
           Unsupported{"use_qalora", "QA-LoRA pools the adapter's input"},
       }) {
    const ojson* v = peft_field(cfg, u.key);
    VLM_CHECK(!peft_is_set(v), cfg_path, ": ", u.key, " is ", v ? v->dump() : "", ", which vlmtrain does not support (",
              u.why, "; hint: only plain LoRA adapters, optionally rslora, rank_pattern and alpha_pattern)");
  }

  PeftAdapter a;
  a.dir = dir;
  if (const ojson* b = peft_field(cfg, "base_model_name_or_path"))
    a.base_model_name_or_path = b->is_string() ? b->get<std::string>() : b->dump();
  if (const ojson* t = peft_field(cfg, "target_modules")) {
    if (t->is_string()) {
      a.target_modules.push_back(t->get<std::string>());
    } else {
      VLM_CHECK(t->is_array(), cfg_path, ": target_modules must be a list or a string, got ", t->dump());
      for (const auto& e : *t) {
        VLM_CHECK(e.is_string(), cfg_path, ": target_modules entries must be strings, got ", e.dump());
        a.target_modules.push_back(e.get<std::string>());
      }
    }
  }
  if (const ojson* m = peft_field(cfg, "modules_to_save"); peft_is_set(m)) {
    VLM_CHECK(m->is_array(), cfg_path, ": modules_to_save must be a list of module names, got ", m->dump());
    for (const auto& e : *m) {
      VLM_CHECK(e.is_string() && !e.get<std::string>().empty(), cfg_path,
                ": modules_to_save entries must be module names, got ", e.dump());
      a.modules_to_save.push_back(e.get<std::string>());
    }
  }
  a.defaults.r = peft_field(cfg, "r") ? peft_rank(cfg["r"], cfg_path, "\"r\"") : 8;  // PEFT's defaults
  a.defaults.alpha = peft_number(cfg, "lora_alpha", 8, cfg_path);
  a.defaults.dropout = peft_number(cfg, "lora_dropout", 0, cfg_path);
  if (const ojson* v = peft_field(cfg, "use_rslora")) {
    VLM_CHECK(v->is_boolean(), cfg_path, ": use_rslora must be true or false, got ", v->dump());
    a.defaults.rslora = v->get<bool>();
  }
  a.defaults.init = peft_init(peft_field(cfg, "init_lora_weights"), cfg_path);
  a.defaults.validate(cfg_path);
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    const ojson* p = peft_field(cfg, key);
    if (p == nullptr) continue;
    VLM_CHECK(p->is_object(), cfg_path, ": ", key, " must be an object {pattern: value}, got ", p->dump());
    for (const auto& [k, v] : p->items()) {
      if (key[0] == 'r') {
        a.rank_pattern.emplace_back(k, peft_rank(v, cfg_path, str("rank_pattern[\"", k, "\"]")));
      } else {
        VLM_CHECK(v.is_number() && v.get<double>() > 0, cfg_path, ": alpha_pattern[\"", k,
                  "\"] must be a number > 0, got ", v.dump());
        a.alpha_pattern.emplace_back(k, v.get<double>());
      }
    }
  }
  std::vector<std::string> rkeys, akeys;
  for (const auto& [k, _] : a.rank_pattern) rkeys.push_back(k);
  for (const auto& [k, _] : a.alpha_pattern) akeys.push_back(k);
  const auto rpat = peft_compile(rkeys, cfg_path, "rank_pattern");
  const auto apat = peft_compile(akeys, cfg_path, "alpha_pattern");

  // --- adapter_model.safetensors
  const SafetensorsFile st = SafetensorsFile::open(st_path);
  struct Pair {
    std::string peft_module;
    std::string a_name, b_name;  // as stored
  };
  std::map<std::string, Pair> by_module;  // canonical module -> its tensors
  for (const std::string& name : st.names()) {
    if (name.find(".lora_A.") == std::string::npos && name.find(".lora_B.") == std::string::npos) {
      a.saved_tensors.emplace_back(peft_saved_canonical(name, a.modules_to_save, st_path, cfg_path), st.get(name));
      continue;
    }
    std::string canonical;
    try {
      canonical = canonical_from_peft(name);
    } catch (const Error& e) {
      throw Error(str(st_path, ": ", e.what()));
    }
    const bool is_a = canonical.size() > 14 && canonical.compare(canonical.size() - 14, 14, ".lora_A.weight") == 0;
    const std::string module = canonical.substr(0, canonical.size() - 14);
    // the module as stored: the name up to ".lora_A" / ".lora_B", without "base_model.model."
    const std::string stored = name.substr(17, name.rfind(is_a ? ".lora_A." : ".lora_B.") - 17);
    Pair& p = by_module[module];
    std::string& slot = is_a ? p.a_name : p.b_name;
    VLM_CHECK(slot.empty(), st_path, ": two tensors for ", module, is_a ? ".lora_A" : ".lora_B", ": '", slot,
              "' and '", name, "' (hint: an adapter file holds one adapter)");
    slot = name;
    p.peft_module = stored;
  }
  VLM_CHECK(!by_module.empty(), st_path, ": holds no LoRA tensors");
  VLM_CHECK(a.modules_to_save.empty() || !a.saved_tensors.empty(), st_path, ": ", cfg_path,
            " lists modules_to_save but the file holds none of their tensors");
  for (const auto& [module, p] : by_module) {
    VLM_CHECK(!p.a_name.empty() && !p.b_name.empty(), st_path, ": ", module, " has ",
              p.a_name.empty() ? "lora_B but no lora_A" : "lora_A but no lora_B", " (",
              p.a_name.empty() ? p.b_name : p.a_name, ")");
    PeftModuleAdapter m;
    m.module = module;
    m.peft_module = p.peft_module;
    m.lora_A = st.get(p.a_name);
    m.lora_B = st.get(p.b_name);
    for (const auto* t : {&m.lora_A, &m.lora_B}) {
      const std::string& n = t == &m.lora_A ? p.a_name : p.b_name;
      VLM_CHECK(t->dim() == 2 && at::isFloatingType(t->scalar_type()), st_path, ": ", n,
                " must be a 2-D floating tensor, got ", t->sizes(), " ", t->scalar_type());
    }
    // r and alpha as PEFT resolves them for this module (nested name, then the stored one).
    std::vector<std::string> names{styled_hf_name(module, HfNameStyle::kNested)};
    if (p.peft_module != names[0]) names.push_back(p.peft_module);
    m.options = a.defaults;
    const int ri = peft_match(rpat, names), ai = peft_match(apat, names);
    if (ri >= 0) m.options.r = a.rank_pattern[ri].second;
    if (ai >= 0) m.options.alpha = a.alpha_pattern[ai].second;
    const int64_t r = m.options.r;
    const std::string rsrc = ri >= 0 ? str("rank_pattern[\"", rkeys[ri], "\"] = ", r) : str("r = ", r);
    VLM_CHECK(m.lora_A.size(0) == r && m.lora_B.size(1) == r, st_path, ": ", module, ": lora_A ",
              m.lora_A.sizes(), " and lora_B ", m.lora_B.sizes(), " disagree with ", rsrc, " in ", cfg_path,
              " (expected lora_A [", r, ", in], lora_B [out, ", r, "])");
    m.options.validate(str(cfg_path, " (", module, ")"));
    a.modules.push_back(std::move(m));
  }
  return a;
}

// ---------------------------------------------------------------- apply

void apply_peft_adapter(torch::nn::Module& model, const PeftAdapter& adapter) {
  std::map<std::string, LinearImpl*> linears;
  for (auto& [path, lin] : linear_modules(model)) linears[path] = lin;
  const std::string where = "PEFT adapter " + adapter.dir;
  for (const auto& m : adapter.modules) {
    auto it = linears.find(m.module);
    VLM_CHECK(it != linears.end(), where, ": module ", m.module, " (", m.peft_module,
              ") is not a Linear of the model (hint: an adapter for another architecture or size?)");
    const LinearImpl& lin = *it->second;
    VLM_CHECK(!has_lora(lin), where, ": ", m.module, " already has an adapter");
    VLM_CHECK(!lin.weight.is_meta(), where, ": ", m.module, " is on the meta device (hint: materialise and load "
              "the base weights first)");
    const int64_t out = lin.weight.size(0), in = lin.weight.size(1);
    VLM_CHECK(m.lora_A.size(1) == in && m.lora_B.size(0) == out, where, ": ", m.module, ": lora_A ", m.lora_A.sizes(),
              " and lora_B ", m.lora_B.sizes(), " do not fit the base weight [", out, ", ", in, "] (expected lora_A [r, ",
              in, "], lora_B [", out, ", r]; hint: an adapter for another model size?)");
  }
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  for (const auto& [name, t] : adapter.saved_tensors) {
    auto it = params.find(name);
    VLM_CHECK(it != params.end(), where, ": modules_to_save tensor ", name, " is not a parameter of the model");
    VLM_CHECK(it->second.sizes() == t.sizes(), where, ": modules_to_save tensor ", name, " is ", t.sizes(),
              " but the model's parameter is ", it->second.sizes(), " (hint: an adapter for another model size?)");
    VLM_CHECK(!it->second.is_meta(), where, ": ", name, " is on the meta device (hint: materialise the base first)");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : adapter.saved_tensors)
    params.at(name).copy_(t.to(params.at(name).device(), params.at(name).scalar_type()));
  for (const auto& m : adapter.modules) {
    LinearImpl& lin = *linears.at(m.module);
    add_lora(lin, m.options, /*seed=*/0, m.module);
    lin.lora_A->weight.copy_(m.lora_A.to(lin.weight.device(), lin.weight.scalar_type()));
    lin.lora_B->weight.copy_(m.lora_B.to(lin.weight.device(), lin.weight.scalar_type()));
  }
}

// ---------------------------------------------------------------- write

void write_peft_adapter(torch::nn::Module& model, const std::string& dir,
                        const std::string& base_model_name_or_path,
                        const std::vector<std::string>& modules_to_save) {
  VLM_CHECK(!dir.empty(), "write_peft_adapter: empty directory path");
  const auto mods = lora_modules(model);
  VLM_CHECK(!mods.empty(), "write_peft_adapter ", dir, ": the model has no LoRA adapter (hint: add_lora first)");

  // Tensors, and the per-module settings the config has to reproduce.
  NamedTensors tensors;
  std::vector<int64_t> ranks;
  std::vector<bool> rslora;
  std::vector<double> dropout;
  std::vector<int> init;
  for (const auto& [path, lin] : mods) {
    for (const auto* sub : {&lin->lora_A, &lin->lora_B}) {
      const torch::Tensor& w = (*sub)->weight;
      const std::string name = path + (sub == &lin->lora_A ? ".lora_A.weight" : ".lora_B.weight");
      VLM_CHECK(!w.is_meta(), "write_peft_adapter ", dir, ": ", name, " is on the meta device (no data to write)");
      tensors.emplace_back(peft_tensor_name(name), w.detach());
    }
    VLM_CHECK(lin->lora_options.r == lin->lora_A->weight.size(0), "write_peft_adapter: ", path,
              ": lora_options.r ", lin->lora_options.r, " disagrees with lora_A ", lin->lora_A->weight.sizes());
    ranks.push_back(lin->lora_options.r);
    rslora.push_back(lin->lora_options.rslora);
    dropout.push_back(lin->lora_options.dropout);
    init.push_back(static_cast<int>(lin->lora_options.init));
  }
  ojson saved = ojson::array();
  for (const std::string& module : modules_to_save) {
    int64_t n = 0;
    for (const auto& p : model.named_parameters()) {
      if (p.key().rfind(module + ".", 0) != 0 || is_lora_param(p.key())) continue;
      VLM_CHECK(!p.value().is_meta(), "write_peft_adapter ", dir, ": ", p.key(), " is on the meta device");
      tensors.emplace_back("base_model.model." + styled_hf_name(p.key(), HfNameStyle::kNested), p.value().detach());
      ++n;
    }
    VLM_CHECK(n > 0, "write_peft_adapter ", dir, ": modules_to_save entry ", module, " has no parameters");
    saved.push_back(styled_hf_name(module, HfNameStyle::kNested));
  }
  const int64_t r0 = peft_most_common(ranks);
  const bool rs0 = peft_most_common(rslora);
  // The alpha each module needs under the file's use_rslora to keep its scaling.
  std::vector<double> alphas;
  for (const auto& [path, lin] : mods) {
    const LoraOptions& o = lin->lora_options;
    const double sr = std::sqrt(static_cast<double>(o.r));
    alphas.push_back(o.rslora == rs0 ? o.alpha : rs0 ? o.alpha / sr : o.alpha * sr);
  }
  const double a0 = peft_most_common(alphas);

  ojson targets = ojson::array(), rank_pattern = ojson::object(), alpha_pattern = ojson::object();
  for (size_t i = 0; i < mods.size(); ++i) {
    const std::string nested = styled_hf_name(mods[i].first, HfNameStyle::kNested);
    targets.push_back(nested);
    if (ranks[i] != r0) rank_pattern[peft_exact_key(nested)] = ranks[i];
    if (alphas[i] != a0) alpha_pattern[peft_exact_key(nested)] = peft_alpha_json(alphas[i]);
  }
  ojson cfg;
  cfg["peft_type"] = "LORA";
  cfg["task_type"] = "CAUSAL_LM";
  cfg["base_model_name_or_path"] = base_model_name_or_path.empty() ? ojson() : ojson(base_model_name_or_path);
  cfg["r"] = r0;
  cfg["lora_alpha"] = peft_alpha_json(a0);
  cfg["lora_dropout"] = peft_most_common(dropout);
  cfg["use_rslora"] = rs0;
  cfg["target_modules"] = targets;
  cfg["rank_pattern"] = rank_pattern;
  cfg["alpha_pattern"] = alpha_pattern;
  const LoraInit i0 = static_cast<LoraInit>(peft_most_common(init));
  cfg["init_lora_weights"] = i0 == LoraInit::gaussian ? ojson("gaussian") : ojson(true);
  cfg["bias"] = "none";
  cfg["use_dora"] = false;
  cfg["lora_bias"] = false;
  cfg["fan_in_fan_out"] = false;
  cfg["modules_to_save"] = saved.empty() ? ojson() : saved;
  cfg["layers_to_transform"] = nullptr;
  cfg["layers_pattern"] = nullptr;
  cfg["inference_mode"] = true;

  // Temp directory beside the target, then one swap (staged_dir.h).
  StagedDir out(dir);
  std::error_code ec;
  if (out.target_existed()) {  // keep the directory's other files (README.md, ...): hard links, copies where links fail
    for (const auto& e : fs::directory_iterator(out.target())) {
      const std::string fname = e.path().filename().string();
      if (fname == kPeftConfigFile || fname == kPeftWeightsFile) continue;
      fs::copy(e.path(), out.tmp() / fname, fs::copy_options::recursive | fs::copy_options::create_hard_links, ec);
      if (ec) fs::copy(e.path(), out.tmp() / fname, fs::copy_options::recursive, ec);
      VLM_CHECK(!ec, dir, ": cannot carry ", e.path().string(), " over: ", ec.message());
    }
  }
  save_safetensors((out.tmp() / kPeftWeightsFile).string(), tensors, {std::nullopt, {{"format", "pt"}}});
  write_file_synced((out.tmp() / kPeftConfigFile).string(), cfg.dump(2) + "\n");
  out.commit();
}

}  // namespace vlm

#include "vlm/io/param_source.h"

#include "vlm/runtime/check.h"
#include "vlm/model/layers.h"
#include "vlm/model/lora.h"

namespace vlm {
namespace {

// "a.b.c.weight" -> {"a.b.c", "weight"}; a top-level name has an empty module path.
std::pair<std::string, std::string> split_param_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

// The modules under a root by path, indexed once and again when a path is not found (the
// tree may have grown: LoRA adapters are attached after a source is made).
class ModuleIndex {
 public:
  explicit ModuleIndex(torch::nn::Module& root) : root_(root) {}
  torch::nn::Module* at(const std::string& path) {
    if (path.empty()) return &root_;
    auto it = by_path_.find(path);
    if (it == by_path_.end()) {
      by_path_.clear();
      for (const auto& item : root_.named_modules("", /*include_self=*/false))
        by_path_.emplace(item.key(), item.value().get());
      it = by_path_.find(path);
    }
    return it == by_path_.end() ? nullptr : it->second;
  }

 private:
  torch::nn::Module& root_;
  std::map<std::string, torch::nn::Module*> by_path_;
};

// A LoRA adapter parameter's initial value, flat fp32 on the CPU.
torch::Tensor lora_value(ModuleIndex& modules, const std::string& name) {
  // "<linear>.lora_A.weight": the Linear is two levels up.
  const auto [adapter_path, key] = split_param_name(name);
  const auto [linear_path, adapter] = split_param_name(adapter_path);
  auto* linear = dynamic_cast<LinearImpl*>(modules.at(linear_path));
  VLM_CHECK(linear != nullptr && has_lora(*linear), "parameter source: ", name,
            " is not a LoRA adapter parameter of this model");
  return lora_init_value(*linear, adapter + "." + key, linear_path).reshape({-1});
}

void check_range(const std::string& name, int64_t numel, int64_t lo, int64_t hi, const torch::Tensor& out) {
  VLM_CHECK(0 <= lo && lo <= hi && hi <= numel && out.numel() == hi - lo, "parameter source: ", name,
            ": range [", lo, ", ", hi, ") into ", out.numel(), " elements, but the parameter has ", numel);
}

class CheckpointSource : public ParamSource {
 public:
  CheckpointSource(torch::nn::Module& module, const HfCheckpoint& ckpt, const LoadOptions& opts)
      : modules_(module), ckpt_(ckpt) {
    LoadPlan plan = plan_module_load(module, ckpt, opts, /*allow_meta=*/true);
    for (const auto& e : plan.todo) {
      VLM_CHECK(e.is_param, ckpt.path(), ": holds buffer ", e.name, ", which a parameter source does not load "
                "(hint: load this model whole, load_module_weights)");
      read_from_.emplace(e.own, e.name);
    }
  }
  void fill(const std::string& name, int64_t lo, int64_t hi, torch::Tensor out) override {
    torch::NoGradGuard no_grad;
    auto it = read_from_.find(name);
    if (it == read_from_.end() && is_lora_param(name)) {
      torch::Tensor v = lora_value(modules_, name);
      check_range(name, v.numel(), lo, hi, out);
      out.copy_(v.narrow(0, lo, hi - lo));
      return;
    }
    VLM_CHECK(it != read_from_.end(), ckpt_.path(), ": the parameter source has no tensor for ", name,
              " (hint: it was not a parameter of the model the source was made for)");
    check_range(name, ckpt_.info(it->second).numel(), lo, hi, out);
    torch::Tensor src = ckpt_.get_range(it->second, lo, hi);
    bytes_read_ += static_cast<uint64_t>(src.numel()) * static_cast<uint64_t>(src.element_size());
    out.copy_(src);
  }
  std::string describe() const override { return str("HF ", ckpt_.path()); }
  void drop_resident_pages() override {
    for (const auto& f : ckpt_.files()) f.drop_resident_pages();
  }

 private:
  ModuleIndex modules_;
  HfCheckpoint ckpt_;
  std::map<std::string, std::string> read_from_;  // module name -> checkpoint name
};

class InitSource : public ParamSource {
 public:
  InitSource(torch::nn::Module& module, const MaterializeOptions& opts) : modules_(module), opts_(opts) {
    opts_.device = torch::kCPU;
    opts_.init = true;
  }
  void fill(const std::string& name, int64_t lo, int64_t hi, torch::Tensor out) override {
    torch::NoGradGuard no_grad;
    torch::Tensor v;
    if (is_lora_param(name)) {
      v = lora_value(modules_, name);
    } else {
      const auto [path, key] = split_param_name(name);
      auto* layer = dynamic_cast<LayerBase*>(modules_.at(path));
      VLM_CHECK(layer != nullptr, "parameter source: ", name, " is not a parameter of a vlm::LayerBase in this model");
      v = initial_value(*layer, key, name, opts_).reshape({-1});
    }
    check_range(name, v.numel(), lo, hi, out);
    out.copy_(v.narrow(0, lo, hi - lo));
  }
  std::string describe() const override { return str("random init (seed ", opts_.seed, ")"); }

 private:
  ModuleIndex modules_;
  MaterializeOptions opts_;
};

}  // namespace

std::unique_ptr<ParamSource> checkpoint_param_source(torch::nn::Module& module, const HfCheckpoint& ckpt,
                                                     const LoadOptions& opts) {
  return std::make_unique<CheckpointSource>(module, ckpt, opts);
}

std::unique_ptr<ParamSource> init_param_source(torch::nn::Module& module, const MaterializeOptions& opts) {
  return std::make_unique<InitSource>(module, opts);
}

ParamReplacer::ParamReplacer(torch::nn::Module& root) {
  for (const auto& item : root.named_modules("", /*include_self=*/true))
    if (auto* layer = dynamic_cast<LayerBase*>(item.value().get()))
      for (const auto& p : layer->named_parameters(/*recurse=*/false))
        owners_[item.key().empty() ? p.key() : item.key() + "." + p.key()] = {layer, p.key()};
}

void ParamReplacer::replace(const std::string& name, torch::Tensor value) {
  auto it = owners_.find(name);
  VLM_CHECK(it != owners_.end(), "replace parameter: no vlm::LayerBase owns a parameter named ", name);
  torch::NoGradGuard no_grad;
  it->second.first->replace_parameter(it->second.second, std::move(value));
}

}  // namespace vlm

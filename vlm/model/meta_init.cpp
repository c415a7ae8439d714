#include "vlm/model/meta_init.h"

#include <ATen/CPUGeneratorImpl.h>

#include <unordered_set>

#include "vlm/runtime/check.h"
#include "vlm/model/layers.h"

namespace vlm {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return splitmix64(seed ^ splitmix64(h));
}

void materialize_layer(LayerBase& layer, const std::string& prefix, const MaterializeOptions& o) {
  const auto topts = torch::TensorOptions().device(o.device).dtype(o.dtype);
  for (const auto& item : layer.named_parameters(/*recurse=*/false)) {
    const torch::Tensor& p = item.value();
    const std::string full = prefix.empty() ? item.key() : prefix + "." + item.key();
    torch::Tensor value;
    if (!o.init) {
      // Meta: allocate only. Real: keep the values, move to the target device/dtype.
      value = p.is_meta() ? torch::empty(p.sizes(), topts) : p.detach().to(topts);
    } else {
      value = initial_value(layer, item.key(), full, o);
    }
    layer.replace_parameter(item.key(), value);
  }
}

}  // namespace

torch::Tensor initial_value(LayerBase& layer, const std::string& key, const std::string& full,
                            const MaterializeOptions& o) {
  const auto topts = torch::TensorOptions().device(o.device).dtype(o.dtype);
  const auto params = layer.named_parameters(/*recurse=*/false);
  const torch::Tensor* p = params.find(key);
  VLM_CHECK(p != nullptr, "initial_value: ", full, " is not a parameter of its layer");
  switch (layer.init_rule(key)) {
    case ParamInit::zeros: return torch::zeros(p->sizes(), topts);
    case ParamInit::ones: return torch::ones(p->sizes(), topts);
    case ParamInit::normal: break;
  }
  // Drawn on CPU in fp32 so every device/dtype gets the same values.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(name_seed(o.seed, full));
  return torch::empty(p->sizes(), torch::kFloat32).normal_(0.0, o.init_std, gen).to(topts);
}

void materialize(torch::nn::Module& root, const MaterializeOptions& opts) {
  torch::NoGradGuard no_grad;
  if (auto* layer = dynamic_cast<LayerBase*>(&root)) materialize_layer(*layer, "", opts);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (auto* layer = dynamic_cast<LayerBase*>(item.value().get())) {
      materialize_layer(*layer, item.key(), opts);
    }
  }
  for (const auto& item : root.named_parameters()) {
    VLM_CHECK(!item.value().is_meta(), "materialize: parameter '", item.key(),
              "' is still on the meta device (hint: only vlm::LayerBase layers can be "
              "materialised; build the module from vlm/model/layers.h)");
  }
}

bool has_meta_parameters(const torch::nn::Module& root) {
  for (const auto& p : root.parameters()) {
    if (p.is_meta()) return true;
  }
  return false;
}

int64_t count_parameters(const torch::nn::Module& root) {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : root.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

std::vector<std::pair<std::string, int64_t>> parameter_table(const torch::nn::Module& root) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    int64_t n = 0;
    for (const auto& p : item.value()->parameters(/*recurse=*/false)) n += p.numel();
    if (n > 0) out.emplace_back(item.key(), n);
  }
  return out;
}

}  // namespace vlm

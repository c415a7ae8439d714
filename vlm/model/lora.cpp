// LoRA adapters on vlm::Linear (see lora.h).
#include "vlm/model/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/io/hf_checkpoint.h"

namespace vlm {
namespace {

bool lora_ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool lora_starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Same stream derivation as meta_init.cpp: FNV-1a of the name, mixed with the seed.
uint64_t lora_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  uint64_t x = seed ^ (h + 0x9e3779b97f4a7c15ULL);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

const char kPeftPrefix[] = "base_model.model.";

}  // namespace

const char* lora_init_name(LoraInit i) { return i == LoraInit::gaussian ? "gaussian" : "kaiming"; }

LoraInit parse_lora_init(const std::string& s) {
  if (s == "kaiming" || s == "default") return LoraInit::kaiming;
  if (s == "gaussian") return LoraInit::gaussian;
  throw Error(str("lora init: expected \"kaiming\" (PEFT's default) or \"gaussian\", got '", s, "'"));
}

double LoraOptions::scaling() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

void LoraOptions::validate(const std::string& where) const {
  VLM_CHECK(r >= 1, where, ": r must be >= 1, got ", r, " (hint: typical ranks are 8 to 64)");
  VLM_CHECK(std::isfinite(alpha) && alpha > 0, where, ": alpha must be > 0, got ", alpha,
            " (hint: PEFT's default is 8; alpha = 2 r is common)");
  VLM_CHECK(dropout >= 0 && dropout < 1, where, ": dropout must be in [0, 1), got ", dropout);
}

void add_lora(LinearImpl& linear, const LoraOptions& o, uint64_t seed, const std::string& name) {
  o.validate("lora on " + name);
  VLM_CHECK(!linear.lora_A, "lora: ", name, " already has an adapter (hint: two lora rules match it)");
  const torch::Tensor& w = linear.weight;  // [out, in]
  const int64_t out = w.size(0), in = w.size(1);
  const auto opts = w.options();
  auto a = std::make_shared<LinearImpl>(in, o.r, /*bias=*/false, opts);
  auto b = std::make_shared<LinearImpl>(o.r, out, /*bias=*/false, opts);
  linear.lora_A = linear.register_module("lora_A", a);
  linear.lora_B = linear.register_module("lora_B", b);
  linear.lora_options = o;
  linear.lora_scaling = o.scaling();
  linear.lora_dropout = o.dropout;
  linear.lora_seed = seed;
  if (!w.is_meta()) {
    torch::NoGradGuard no_grad;
    a->replace_parameter("weight", lora_init_value(linear, "lora_A.weight", name).to(opts));
    b->replace_parameter("weight", lora_init_value(linear, "lora_B.weight", name).to(opts));
  }
}

torch::Tensor lora_init_value(const LinearImpl& linear, const std::string& which, const std::string& name) {
  VLM_CHECK(linear.lora_A, "lora: ", name, " has no adapter");
  const LoraOptions& o = linear.lora_options;
  const int64_t out = linear.weight.size(0), in = linear.weight.size(1);
  if (which == "lora_B.weight") return torch::zeros({out, o.r}, torch::kFloat32);
  VLM_CHECK(which == "lora_A.weight", "lora: ", name, ": no adapter parameter '", which, "'");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(lora_seed(linear.lora_seed, name + ".lora_A.weight"));
  torch::Tensor av = torch::empty({o.r, in}, torch::kFloat32);
  if (o.init == LoraInit::gaussian) {
    av.normal_(0.0, 1.0 / static_cast<double>(o.r), gen);
  } else {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    av.uniform_(-bound, bound, gen);
  }
  return av;
}

bool has_lora(const LinearImpl& linear) { return static_cast<bool>(linear.lora_A); }

void merge_lora(LinearImpl& linear) {
  VLM_CHECK(linear.lora_A, "merge_lora: the module has no adapter");
  torch::NoGradGuard no_grad;
  torch::Tensor w = linear.weight;
  const torch::Tensor delta =
      torch::matmul(linear.lora_B->weight.to(torch::kFloat32), linear.lora_A->weight.to(torch::kFloat32)) *
      linear.lora_scaling;  // [out, in]
  w.copy_((w.to(torch::kFloat32) + delta).to(w.scalar_type()));
  linear.unregister_module("lora_A");
  linear.unregister_module("lora_B");
  linear.lora_A.reset();
  linear.lora_B.reset();
  linear.lora_options = LoraOptions{};
  linear.lora_scaling = 0;
  linear.lora_dropout = 0;
}

std::vector<std::pair<std::string, LinearImpl*>> linear_modules(torch::nn::Module& root) {
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    auto* lin = dynamic_cast<LinearImpl*>(item.value().get());
    if (lin == nullptr) continue;
    const std::string& path = item.key();
    if (lora_ends_with(path, ".lora_A") || lora_ends_with(path, ".lora_B")) continue;
    out.emplace_back(path, lin);
  }
  return out;
}

std::vector<std::pair<std::string, LinearImpl*>> lora_modules(torch::nn::Module& root) {
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (auto& [path, lin] : linear_modules(root))
    if (has_lora(*lin)) out.emplace_back(path, lin);
  return out;
}

int64_t merge_all_lora(torch::nn::Module& root) {
  int64_t n = 0;
  for (auto& [path, lin] : lora_modules(root)) {
    merge_lora(*lin);
    ++n;
  }
  return n;
}

bool is_lora_param(const std::string& name) {
  return lora_ends_with(name, ".lora_A.weight") || lora_ends_with(name, ".lora_B.weight");
}

std::string peft_tensor_name(const std::string& canonical) {
  VLM_CHECK(is_lora_param(canonical), "peft_tensor_name: '", canonical, "' is not a LoRA parameter");
  return kPeftPrefix + styled_hf_name(canonical, HfNameStyle::kNested);
}

std::string canonical_from_peft(const std::string& peft_name) {
  std::string n = peft_name;
  VLM_CHECK(lora_starts_with(n, kPeftPrefix), "PEFT adapter tensor '", peft_name, "': expected a name starting with '",
            kPeftPrefix, "' (hint: a PEFT LoRA adapter saved by save_pretrained)");
  n = n.substr(sizeof(kPeftPrefix) - 1);
  // ".lora_A.<adapter>.weight" -> ".lora_A.weight"
  for (const char* ab : {".lora_A.", ".lora_B."}) {
    const size_t at = n.rfind(ab);
    if (at == std::string::npos) continue;
    const size_t rest = at + std::string(ab).size();
    if (n.compare(rest, std::string::npos, "weight") != 0 && lora_ends_with(n, ".weight"))
      n = n.substr(0, rest) + "weight";
  }
  VLM_CHECK(is_lora_param(n), "PEFT adapter tensor '", peft_name,
            "': expected <module>.lora_A.weight or <module>.lora_B.weight (hint: only LoRA adapters are "
            "supported: no DoRA magnitudes, lora biases or modules_to_save)");
  return canonical_hf_name(n);
}

}  // namespace vlm

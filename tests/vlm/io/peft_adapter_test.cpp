// vlm/io/peft_adapter.h on hand-written adapter directories: every adapter_config.json setting
// vlmtrain refuses is an error naming the file and the setting, malformed tensors are errors
// naming the tensor, apply_peft_adapter checks everything before changing the model, and
// rank_pattern / alpha_pattern resolve as PEFT's own get_pattern_key does (asked at test
// time through the build's Python environment: a missing peft fails the test).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/lora.h"
#include "vlm/model/meta_init.h"
#include "vlm/io/peft_adapter.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/io/safetensors.h"

namespace {

using ojson = nlohmann::ordered_json;

const char kPatQ0[] = "base_model.model.model.language_model.layers.0.self_attn.q_proj";

ojson pat_config() {
  return ojson{{"peft_type", "LORA"}, {"r", 2}, {"lora_alpha", 4}, {"target_modules", {"q_proj"}}, {"bias", "none"}};
}

// A + B for the module `module` (PEFT name without ".lora_A.weight"), rank r, in 8, out 6.
vlm::NamedTensors pat_pair(const std::string& module, int64_t r, int64_t in = 8, int64_t out = 6) {
  return {{module + ".lora_A.weight", torch::randn({r, in})}, {module + ".lora_B.weight", torch::randn({out, r})}};
}

void pat_write(const std::string& dir, const ojson& cfg, const vlm::NamedTensors& tensors) {
  std::filesystem::create_directories(dir);
  vlm::test::write_file(dir + "/adapter_config.json", cfg.dump(2));
  vlm::save_safetensors(dir + "/adapter_model.safetensors", tensors);
}

std::string pat_error(const std::string& dir) {
  try {
    vlm::read_peft_adapter(dir);
  } catch (const vlm::Error& e) {
    return e.what();
  }
  return "";
}

TEST(PeftAdapterConfig, RefusedSettingsNameTheFileAndTheSetting) {
  vlm::test::TempDir dir("peft_cfg");
  struct Case {
    const char* key;
    ojson value;
  };
  const std::vector<Case> cases = {
      {"peft_type", "IA3"},           {"use_dora", true},           {"bias", "all"},
      {"bias", "lora_only"},          {"modules_to_save", {"lm_head"}}, {"fan_in_fan_out", true},
      {"lora_bias", true},            {"init_lora_weights", "pissa"}, {"init_lora_weights", "pissa_niter_4"},
      {"init_lora_weights", "olora"}, {"init_lora_weights", "loftq"}, {"init_lora_weights", "bogus"},
      {"layer_replication", {{0, 2}}}, {"target_parameters", {"mlp.experts.gate_up_proj"}},
      {"use_qalora", true},           {"alora_invocation_tokens", {1, 2}}, {"use_rslora", "yes"},
      {"r", 0},                       {"r", 2.5},                   {"lora_alpha", "eight"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string d = dir / std::to_string(i);
    ojson cfg = pat_config();
    cfg[cases[i].key] = cases[i].value;
    pat_write(d, cfg, pat_pair(kPatQ0, 2));
    const std::string err = pat_error(d);
    EXPECT_NE(err.find(d + "/adapter_config.json"), std::string::npos) << cases[i].key << ": " << err;
    EXPECT_NE(err.find(cases[i].key), std::string::npos) << cases[i].key << ": " << err;
  }
  // Settings that are off, or inits that only draw A and B, are fine.
  const std::vector<Case> fine = {{"modules_to_save", nullptr}, {"modules_to_save", ojson::array()},
                                  {"use_dora", false},          {"init_lora_weights", false},
                                  {"init_lora_weights", "gaussian"}, {"init_lora_weights", "eva"},
                                  {"target_modules", ".*q_proj"}, {"loftq_config", ojson::object()},
                                  {"megatron_core", "megatron.core"}};
  for (size_t i = 0; i < fine.size(); ++i) {
    const std::string d = dir / ("fine" + std::to_string(i));
    ojson cfg = pat_config();
    cfg[fine[i].key] = fine[i].value;
    pat_write(d, cfg, pat_pair(kPatQ0, 2));
    EXPECT_EQ(pat_error(d), "") << fine[i].key << " = " << fine[i].value.dump();
  }
  const std::string d = dir / "fine0";
  const auto a = vlm::read_peft_adapter(d);
  EXPECT_EQ(a.target_modules, std::vector<std::string>{"q_proj"});
  EXPECT_EQ(a.defaults.r, 2);
  EXPECT_EQ(a.defaults.alpha, 4);
  ASSERT_EQ(a.modules.size(), 1u);
  EXPECT_EQ(a.modules[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(a.modules[0].options.scaling(), 2.0);
}

TEST(PeftAdapterConfig, MalformedTensorsNameTheTensor) {
  vlm::test::TempDir dir("peft_tensors");
  const std::string q1 = "base_model.model.model.language_model.layers.1.self_attn.q_proj";
  struct Case {
    const char* what;
    vlm::NamedTensors tensors;
    std::string expect;  // in the message
  };
  auto with = [](vlm::NamedTensors t, const std::string& name, torch::Tensor v) {
    t.emplace_back(name, v);
    return t;
  };
  const std::vector<Case> cases = {
      {"not LoRA", with(pat_pair(kPatQ0, 2), "base_model.model.model.language_model.embed_tokens.weight",
                        torch::zeros({4, 4})), "embed_tokens"},
      {"embedding LoRA", with(pat_pair(kPatQ0, 2), "base_model.model.model.language_model.embed_tokens.lora_embedding_A",
                              torch::zeros({2, 4})), "lora_embedding_A"},
      {"DoRA magnitude", with(pat_pair(kPatQ0, 2), std::string(kPatQ0) + ".lora_magnitude_vector", torch::zeros({6})),
       "lora_magnitude_vector"},
      {"A without B", with(pat_pair(kPatQ0, 2), q1 + ".lora_A.weight", torch::zeros({2, 8})), "lora_A but no lora_B"},
      {"B without A", with(pat_pair(kPatQ0, 2), q1 + ".lora_B.weight", torch::zeros({6, 2})), "lora_B but no lora_A"},
      {"rank 3 vs r 2", pat_pair(kPatQ0, 3), "disagree with r = 2"},
      {"B rank", {{std::string(kPatQ0) + ".lora_A.weight", torch::zeros({2, 8})},
                  {std::string(kPatQ0) + ".lora_B.weight", torch::zeros({6, 3})}}, "disagree"},
      {"1-D", {{std::string(kPatQ0) + ".lora_A.weight", torch::zeros({16})},
               {std::string(kPatQ0) + ".lora_B.weight", torch::zeros({6, 2})}}, "2-D floating"},
      {"integer", {{std::string(kPatQ0) + ".lora_A.weight", torch::zeros({2, 8}, torch::kInt32)},
                   {std::string(kPatQ0) + ".lora_B.weight", torch::zeros({6, 2})}}, "2-D floating"},
      {"two A", with(pat_pair(kPatQ0, 2), std::string(kPatQ0) + ".lora_A.default.weight", torch::zeros({2, 8})),
       "two tensors"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string d = dir / std::to_string(i);
    pat_write(d, pat_config(), cases[i].tensors);
    const std::string err = pat_error(d);
    EXPECT_NE(err.find(d + "/adapter_model.safetensors"), std::string::npos) << cases[i].what << ": " << err;
    EXPECT_NE(err.find(cases[i].expect), std::string::npos) << cases[i].what << ": " << err;
  }
  // A rank from rank_pattern is checked the same way.
  const std::string d = dir / "pattern";
  ojson cfg = pat_config();
  cfg["rank_pattern"] = {{"layers.0.self_attn.q_proj", 5}};
  pat_write(d, cfg, pat_pair(kPatQ0, 2));
  const std::string err = pat_error(d);
  EXPECT_NE(err.find("rank_pattern[\"layers.0.self_attn.q_proj\"] = 5"), std::string::npos) << err;
}

// rank_pattern / alpha_pattern against PEFT's get_pattern_key, asked at test time: module names
// with near-miss suffixes (layers.1 vs layers.11, proj vs q_proj), keys that are suffixes,
// regexes, anchored, and two keys matching one module (the first in file order wins).
TEST(PeftAdapterConfig, PatternsResolveAsPeftGetPatternKey) {
  const std::vector<std::string> modules = {
      "model.language_model.layers.0.self_attn.q_proj",  "model.language_model.layers.1.self_attn.q_proj",
      "model.language_model.layers.11.self_attn.q_proj", "model.language_model.layers.1.self_attn.k_proj",
      "model.language_model.layers.1.mlp.up_proj",       "model.visual.blocks.0.attn.qkv",
      "model.visual.blocks.10.attn.qkv",                 "model.visual.merger.mlp.0",
  };
  ojson rank_pattern = {{"layers.1.self_attn.q_proj", 3},
                        {"q_proj", 5},  // matches layers.1's q_proj too, but comes second
                        {"^model\\.visual\\.blocks\\.1.\\.attn\\.qkv", 6},
                        {"proj", 7},    // no module is named exactly "proj"
                        {"mlp\\.(up|down)_proj", 9}};
  ojson alpha_pattern = {{"blocks.0.attn.qkv", 11}, {".*merger.*", 13}, {"k_proj", 17}, {"model.language_model.layers.1.*", 19}};
  // PEFT's answer.
  const std::string python = vlm::test::python_tool("python");
  const std::string script =
      "import json, sys\n"
      "from peft.utils.other import get_pattern_key\n"
      "mods, rp, ap = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])\n"
      "print(json.dumps({m: [rp.get(get_pattern_key(rp.keys(), m), 2), ap.get(get_pattern_key(ap.keys(), m), 4)]"
      " for m in mods}))\n";
  auto run = vlm::test::run({python, "-c", script, ojson(modules).dump(), rank_pattern.dump(), alpha_pattern.dump()},
                          std::chrono::seconds(120));
  ASSERT_EQ(run.exit_code, 0) << run.output << "\n(hint: the build's Python environment needs peft)";
  const auto peft = vlm::test::last_json_line(run.output);

  // An adapter whose tensors have PEFT's ranks: reading it fails unless vlmtrain resolves the
  // same ranks; the alphas are compared directly.
  vlm::test::TempDir dir("peft_patterns");
  ojson cfg = pat_config();
  cfg["rank_pattern"] = rank_pattern;
  cfg["alpha_pattern"] = alpha_pattern;
  vlm::NamedTensors tensors;
  for (const auto& m : modules)
    for (auto& t : pat_pair("base_model.model." + m, peft.at(m).at(0).get<int64_t>())) tensors.push_back(t);
  pat_write(dir.path(), cfg, tensors);
  const auto a = vlm::read_peft_adapter(dir.path());
  ASSERT_EQ(a.modules.size(), modules.size());
  std::set<int64_t> ranks;
  for (const auto& m : a.modules) {
    const auto& want = peft.at(m.peft_module);
    EXPECT_EQ(m.options.r, want.at(0).get<int64_t>()) << m.peft_module;
    EXPECT_EQ(m.options.alpha, want.at(1).get<double>()) << m.peft_module;
    ranks.insert(m.options.r);
  }
  EXPECT_GE(ranks.size(), 4u) << "the patterns should give several different ranks";
}

// ---------------------------------------------------------------- apply

vlm::VisionLanguageModel pat_tiny_model() {
  vlm::VisionLanguageModel m(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 5});
  return m;
}

TEST(PeftAdapterApply, ChecksEveryModuleBeforeChangingTheModel) {
  auto m = pat_tiny_model();
  vlm::LinearImpl* q0 = nullptr;
  for (auto& [path, lin] : vlm::linear_modules(*m))
    if (path == "model.layers.0.self_attn.q_proj") q0 = lin;
  ASSERT_NE(q0, nullptr);
  const int64_t out = q0->weight.size(0), in = q0->weight.size(1);
  vlm::test::TempDir dir("peft_apply");
  struct Case {
    const char* what;
    vlm::NamedTensors second;  // beside a good adapter for layers.0 q_proj
    std::string expect;
  };
  const std::string q1 = "base_model.model.model.language_model.layers.1.self_attn.q_proj";
  const std::vector<Case> cases = {
      {"absent module", pat_pair("base_model.model.model.language_model.layers.99.self_attn.q_proj", 2, in, out),
       "model.layers.99.self_attn.q_proj"},
      {"not a Linear", pat_pair("base_model.model.model.language_model.norm", 2, in, out), "model.norm"},
      {"wrong in", pat_pair(q1, 2, in + 1, out), "do not fit"},
      {"wrong out", pat_pair(q1, 2, in, out + 2), "do not fit"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string d = dir / std::to_string(i);
    vlm::NamedTensors t = pat_pair(kPatQ0, 2, in, out);
    for (auto& x : cases[i].second) t.push_back(x);
    pat_write(d, pat_config(), t);
    const auto a = vlm::read_peft_adapter(d);
    try {
      vlm::apply_peft_adapter(*m, a);
      ADD_FAILURE() << cases[i].what << ": no error";
    } catch (const vlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(cases[i].expect), std::string::npos) << cases[i].what << ": " << e.what();
    }
    EXPECT_TRUE(vlm::lora_modules(*m).empty()) << cases[i].what << ": the model changed before the error";
  }
  // A good one applies, casts to the base dtype, and refuses to apply twice.
  const std::string d = dir / "good";
  vlm::NamedTensors t = pat_pair(kPatQ0, 2, in, out);
  t[0].second = t[0].second.to(torch::kBFloat16);
  pat_write(d, pat_config(), t);
  const auto a = vlm::read_peft_adapter(d);
  vlm::apply_peft_adapter(*m, a);
  ASSERT_TRUE(vlm::has_lora(*q0));
  EXPECT_EQ(q0->lora_A->weight.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(q0->lora_A->weight, t[0].second.to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(q0->lora_B->weight, t[1].second));
  EXPECT_EQ(q0->lora_scaling, 2.0);
  EXPECT_THROW(vlm::apply_peft_adapter(*m, a), vlm::Error);
}

TEST(PeftAdapterApply, WriteNeedsAnAdapter) {
  auto m = pat_tiny_model();
  vlm::test::TempDir dir("peft_write");
  EXPECT_THROW(vlm::write_peft_adapter(*m, dir / "a", ""), vlm::Error);
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));
}

}  // namespace

// modules_to_save: tensors under a listed module (PEFT's matching: the module name is the
// entry or ends with "." + entry) are read whole under canonical names; any other non-LoRA
// tensor is an error naming it.
TEST(PeftAdapterConfig, ModulesToSaveTensorsAreReadAndOthersRefused) {
  vlm::test::TempDir dir("peft_mts");
  ojson cfg = pat_config();
  cfg["modules_to_save"] = {"visual.merger"};  // a suffix of model.visual.merger
  vlm::NamedTensors t = pat_pair(kPatQ0, 2);
  const torch::Tensor w = torch::randn({6, 8});
  t.emplace_back("base_model.model.model.visual.merger.mlp.0.weight", w);
  pat_write(dir / "ok", cfg, t);
  const auto a = vlm::read_peft_adapter(dir / "ok");
  EXPECT_EQ(a.modules_to_save, std::vector<std::string>{"visual.merger"});
  ASSERT_EQ(a.saved_tensors.size(), 1u);
  EXPECT_EQ(a.saved_tensors[0].first, "visual.merger.mlp.0.weight");
  EXPECT_TRUE(torch::equal(a.saved_tensors[0].second, w));

  t.emplace_back("base_model.model.model.language_model.norm.weight", torch::randn({6}));
  pat_write(dir / "bad", cfg, t);
  const std::string err = pat_error(dir / "bad");
  EXPECT_NE(err.find("base_model.model.model.language_model.norm.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("modules_to_save"), std::string::npos) << err;
}

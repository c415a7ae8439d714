// HF checkpoint directories: save/load of a tiny module with HF-like names in both prefix
// styles, single file and sharded; tied weights; error messages for missing / wrong-shape /
// unexpected tensors and for corrupt indexes; atomic directory replacement.
#include "vlm/io/hf_checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using torch::nn::Embedding;
using torch::nn::LayerNorm;
using torch::nn::Linear;
using torch::nn::ModuleList;

constexpr int64_t kD = 8, kVocab = 16;

// ---------------------------------------------------------------- a tiny HF-shaped module
struct AttnImpl : torch::nn::Module {
  Linear qkv{nullptr}, proj{nullptr};
  AttnImpl() {
    qkv = register_module("qkv", Linear(kD, 3 * kD));
    proj = register_module("proj", Linear(kD, kD));
  }
};
TORCH_MODULE(Attn);

struct VisionBlockImpl : torch::nn::Module {
  LayerNorm norm1{nullptr};
  Attn attn{nullptr};
  VisionBlockImpl() {
    norm1 = register_module("norm1", LayerNorm(torch::nn::LayerNormOptions({kD})));
    attn = register_module("attn", Attn());
  }
};
TORCH_MODULE(VisionBlock);

struct VisualImpl : torch::nn::Module {
  ModuleList blocks{nullptr};
  VisualImpl() {
    blocks = register_module("blocks", ModuleList());
    for (int i = 0; i < 2; ++i) blocks->push_back(VisionBlock());
  }
};
TORCH_MODULE(Visual);

struct MlpImpl : torch::nn::Module {
  Linear gate_proj{nullptr}, down_proj{nullptr};
  MlpImpl() {
    gate_proj = register_module("gate_proj", Linear(torch::nn::LinearOptions(kD, 2 * kD).bias(false)));
    down_proj = register_module("down_proj", Linear(torch::nn::LinearOptions(2 * kD, kD).bias(false)));
  }
};
TORCH_MODULE(Mlp);

struct DecoderLayerImpl : torch::nn::Module {
  Mlp mlp{nullptr};
  DecoderLayerImpl() { mlp = register_module("mlp", Mlp()); }
};
TORCH_MODULE(DecoderLayer);

struct RotaryImpl : torch::nn::Module {
  torch::Tensor inv_freq;
  RotaryImpl() { inv_freq = register_buffer("inv_freq", torch::arange(4, torch::kFloat)); }
};
TORCH_MODULE(Rotary);

struct TextImpl : torch::nn::Module {
  Embedding embed_tokens{nullptr};
  ModuleList layers{nullptr};
  Rotary rotary_emb{nullptr};
  TextImpl() {
    embed_tokens = register_module("embed_tokens", Embedding(kVocab, kD));
    layers = register_module("layers", ModuleList());
    for (int i = 0; i < 2; ++i) layers->push_back(DecoderLayer());
    rotary_emb = register_module("rotary_emb", Rotary());
  }
};
TORCH_MODULE(Text);

// lm_head: its own weight, or the embedding's (tied, as tie_word_embeddings does).
struct HeadImpl : torch::nn::Module {
  torch::Tensor weight;
  explicit HeadImpl(torch::Tensor tied) {
    weight = register_parameter("weight", tied.defined() ? tied : torch::randn({kVocab, kD}));
  }
};
TORCH_MODULE(Head);

struct TinyVlmImpl : torch::nn::Module {
  Visual visual{nullptr};
  Text model{nullptr};
  Head lm_head{nullptr};
  TinyVlmImpl(bool tied, int64_t seed) {
    torch::manual_seed(seed);
    visual = register_module("visual", Visual());
    model = register_module("model", Text());
    lm_head = register_module("lm_head", Head(tied ? model->embed_tokens->weight : torch::Tensor()));
  }
};
TORCH_MODULE(TinyVlm);

// ---------------------------------------------------------------- helpers
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": expected vlm::Error, nothing thrown";
  } catch (const vlm::Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << what << ": message \"" << e.what() << "\" lacks \"" << n << "\"";
  }
}

// Parameters + buffers of two modules equal by name (values, not identity).
void expect_same_state(TinyVlm& a, TinyVlm& b, torch::ScalarType via = torch::kFloat) {
  auto sa = vlm::module_state(*a), sb = vlm::module_state(*b);
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].first, sb[i].first);
    torch::Tensor want = sa[i].second.to(via).to(sb[i].second.scalar_type());
    EXPECT_TRUE(torch::equal(want, sb[i].second)) << sa[i].first;
  }
}

vlm::NamedTensors without(const vlm::NamedTensors& ts, const std::string& name) {
  vlm::NamedTensors out;
  for (const auto& p : ts)
    if (p.first != name) out.push_back(p);
  return out;
}

vlm::SaveHfOptions fp32() {
  vlm::SaveHfOptions o;
  o.dtype = torch::kFloat;
  return o;
}

std::string shard_name(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k, n);
  return buf;
}

int64_t count_entries(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------- tests
TEST(HfNames, CanonicalAndStyled) {
  EXPECT_EQ(vlm::canonical_hf_name("model.visual.blocks.0.attn.qkv.weight"), "visual.blocks.0.attn.qkv.weight");
  EXPECT_EQ(vlm::canonical_hf_name("model.language_model.layers.3.mlp.up_proj.weight"), "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(vlm::canonical_hf_name("visual.merger.ln_q.weight"), "visual.merger.ln_q.weight");
  EXPECT_EQ(vlm::canonical_hf_name("model.embed_tokens.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(vlm::canonical_hf_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(vlm::canonical_hf_name("model.visualizer.x"), "model.visualizer.x") << "prefix must end at a dot";
  for (const std::string n : {"visual.blocks.1.norm1.bias", "model.norm.weight", "lm_head.weight"}) {
    EXPECT_EQ(vlm::styled_hf_name(n, vlm::HfNameStyle::kLegacy), n);
    EXPECT_EQ(vlm::canonical_hf_name(vlm::styled_hf_name(n, vlm::HfNameStyle::kNested)), n);
  }
  EXPECT_EQ(vlm::styled_hf_name("model.norm.weight", vlm::HfNameStyle::kNested), "model.language_model.norm.weight");
  EXPECT_EQ(vlm::styled_hf_name("visual.x", vlm::HfNameStyle::kNested), "model.visual.x");
  EXPECT_EQ(vlm::styled_hf_name("lm_head.weight", vlm::HfNameStyle::kNested), "lm_head.weight");
}

TEST(HfCheckpoint, ModuleNamesAreHfNames) {
  TinyVlm m(true, 0);
  std::vector<std::string> names;
  for (const auto& p : vlm::module_state(*m)) names.push_back(p.first);
  for (const std::string n : {"visual.blocks.0.attn.qkv.weight", "visual.blocks.1.norm1.bias",
                              "model.embed_tokens.weight", "model.layers.0.mlp.gate_proj.weight", "lm_head.weight",
                              "model.rotary_emb.inv_freq"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

// Single file and sharded, in both prefix styles: tied lm_head written once, loads equal.
TEST(HfCheckpoint, RoundTripAllLayoutsAndStyles) {
  TinyVlm src(true, 1);
  const auto state = vlm::module_state(*src);
  // Independent count of the unique data bytes (fp32) and tensors: every state entry but lm_head.
  uint64_t unique_bytes = 0;
  int64_t unique_count = 0;
  for (const auto& [name, t] : state)
    if (name != "lm_head.weight") unique_bytes += uint64_t(t.numel()) * 4, ++unique_count;

  for (auto style : {vlm::HfNameStyle::kLegacy, vlm::HfNameStyle::kNested}) {
    for (uint64_t max_shard : {uint64_t(5'000'000'000ULL), uint64_t(1200)}) {
      const std::string what = vlm::str(style == vlm::HfNameStyle::kLegacy ? "legacy" : "nested", " max_shard ", max_shard);
      vlm::test::TempDir tmp("hf");
      const std::string dir = tmp / "ckpt";
      auto opts = fp32();
      opts.style = style;
      opts.max_shard_bytes = max_shard;
      opts.extra_files = {{"config.json", R"({"model_type": "tiny"})"}};
      auto rep = vlm::save_hf_checkpoint(dir, state, opts);
      EXPECT_EQ(rep.tied_skipped, 1) << what;
      EXPECT_EQ(rep.tensors_written, unique_count) << what;
      EXPECT_EQ(rep.total_size, unique_bytes) << what;
      EXPECT_EQ(vlm::test::read_file(dir + "/config.json"), R"({"model_type": "tiny"})");
      EXPECT_EQ(count_entries(tmp.path()), 1) << what << ": no temp directory left behind";

      const bool sharded = max_shard < unique_bytes;
      EXPECT_EQ(vlm::test::file_exists(dir + "/model.safetensors"), !sharded) << what;
      EXPECT_EQ(vlm::test::file_exists(dir + "/model.safetensors.index.json"), sharded) << what;
      std::set<std::string> stored;
      if (sharded) {
        json index = json::parse(vlm::test::read_file(dir + "/model.safetensors.index.json"));
        EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), unique_bytes);
        std::set<std::string> files;
        for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) files.insert(it.value().get<std::string>());
        EXPECT_GT(files.size(), 2u) << what;
        size_t k = 1;
        for (const auto& f : files) {  // names follow HF's model-0000K-of-0000N pattern, data within the limit
          EXPECT_EQ(f, shard_name(k++, files.size()));
          auto sf = vlm::SafetensorsFile::open(dir + "/" + f);
          EXPECT_EQ(sf.metadata().at("format"), "pt");
          if (sf.tensors().size() > 1) {
            EXPECT_LE(sf.header().data_len, max_shard) << f;
          }
          for (const auto& n : sf.names()) stored.insert(n);
        }
        EXPECT_EQ(stored.size(), index["weight_map"].size());
      } else {
        for (const auto& n : vlm::SafetensorsFile::open(dir + "/model.safetensors").names()) stored.insert(n);
      }
      EXPECT_EQ(int64_t(stored.size()), unique_count) << what;
      EXPECT_FALSE(stored.count("lm_head.weight")) << what << ": tied weight written once";
      const std::string probe = style == vlm::HfNameStyle::kLegacy ? "visual.blocks.0.attn.qkv.weight"
                                                                     : "model.visual.blocks.0.attn.qkv.weight";
      const std::string probe2 = style == vlm::HfNameStyle::kLegacy ? "model.layers.1.mlp.gate_proj.weight"
                                                                      : "model.language_model.layers.1.mlp.gate_proj.weight";
      EXPECT_TRUE(stored.count(probe)) << what;
      EXPECT_TRUE(stored.count(probe2)) << what;

      TinyVlm dst(true, 2);
      ASSERT_FALSE(torch::equal(dst->model->embed_tokens->weight, src->model->embed_tokens->weight));
      auto lr = vlm::load_module_weights(*dst, dir);
      EXPECT_EQ(lr.loaded, unique_count) << what;
      EXPECT_EQ(lr.tied_skipped, 1) << what;
      EXPECT_EQ(lr.converted, 0) << what;
      EXPECT_EQ(lr.bytes_read, unique_bytes) << what;
      expect_same_state(src, dst);
      EXPECT_EQ(dst->lm_head->weight.data_ptr(), dst->model->embed_tokens->weight.data_ptr()) << "still tied";
    }
  }
}

TEST(HfCheckpoint, Bf16SaveAndDtypeConversionOnLoad) {
  TinyVlm src(true, 3);
  vlm::test::TempDir tmp("hfbf");
  vlm::save_hf_checkpoint(tmp / "c", vlm::module_state(*src));  // default dtype: bf16
  auto ck = vlm::HfCheckpoint::open(tmp / "c");
  EXPECT_EQ(ck.info("model.embed_tokens.weight").dtype, torch::kBFloat16);
  TinyVlm dst(true, 4);
  auto lr = vlm::load_module_weights(*dst, ck);
  EXPECT_EQ(lr.converted, lr.loaded);
  expect_same_state(src, dst, torch::kBFloat16);  // fp32 -> bf16 -> fp32
}

TEST(HfCheckpoint, LazyViewOfShardedDirectory) {
  TinyVlm src(false, 5);
  vlm::test::TempDir tmp("hflazy");
  auto opts = fp32();
  opts.max_shard_bytes = 1000;
  opts.style = vlm::HfNameStyle::kNested;
  vlm::save_hf_checkpoint(tmp / "c", vlm::module_state(*src), opts);
  auto ck = vlm::HfCheckpoint::open(tmp / "c");
  EXPECT_TRUE(ck.sharded());
  EXPECT_GT(ck.files().size(), 2u);
  const std::string n = "model.layers.1.mlp.down_proj.weight";
  EXPECT_EQ(ck.stored_name(n), "model.language_model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(ck.info(n).shape, (std::vector<int64_t>{kD, 2 * kD}));
  EXPECT_NE(ck.file_of(n).find("model-000"), std::string::npos);
  torch::Tensor t = ck.get(n);
  EXPECT_TRUE(torch::equal(t, src->model->layers[1]->as<DecoderLayer>()->mlp->down_proj->weight));
  bool in_some_file = false;
  for (const auto& f : ck.files()) in_some_file |= f.owns_pointer(t.data_ptr());
  EXPECT_TRUE(in_some_file) << "zero-copy view into its shard";
  EXPECT_TRUE(ck.contains("lm_head.weight"));  // untied: written
  uint64_t data_bytes = 0;
  for (const auto& f : ck.files()) data_bytes += f.header().data_len;
  ASSERT_TRUE(ck.index_total_size().has_value());
  EXPECT_EQ(*ck.index_total_size(), data_bytes);
  expect_error([&] { ck.get("model.nope"); }, {"no tensor \"model.nope\""}, "absent");
  // A single shard file opened directly.
  auto one = vlm::HfCheckpoint::open(ck.file_of(n));
  EXPECT_FALSE(one.sharded());
  EXPECT_TRUE(torch::equal(one.get(n), t));
}

TEST(HfCheckpoint, MissingTensorNamesItAndCount) {
  TinyVlm src(true, 6);
  vlm::test::TempDir tmp("hfmiss");
  auto state = without(vlm::module_state(*src), "model.layers.0.mlp.gate_proj.weight");
  vlm::save_hf_checkpoint(tmp / "c", state, fp32());
  TinyVlm dst(true, 7);
  torch::Tensor before = dst->visual->blocks[0]->as<VisionBlock>()->attn->qkv->weight.clone();
  expect_error([&] { vlm::load_module_weights(*dst, tmp / "c"); },
               {"1 tensors of the module are missing", "\"model.layers.0.mlp.gate_proj.weight\"", tmp / "c"}, "missing");
  EXPECT_TRUE(torch::equal(before, dst->visual->blocks[0]->as<VisionBlock>()->attn->qkv->weight))
      << "a failed load leaves the module untouched";

  // Untied module, checkpoint from a tied one: lm_head.weight is genuinely missing.
  vlm::save_hf_checkpoint(tmp / "tied", vlm::module_state(*src), fp32());
  TinyVlm untied(false, 8);
  expect_error([&] { vlm::load_module_weights(*untied, tmp / "tied"); }, {"\"lm_head.weight\""}, "untied");
}

TEST(HfCheckpoint, WrongShapeNamesTensorAndShapes) {
  TinyVlm src(true, 9);
  vlm::test::TempDir tmp("hfshape");
  auto state = without(vlm::module_state(*src), "visual.blocks.1.attn.proj.weight");
  state.emplace_back("visual.blocks.1.attn.proj.weight", torch::zeros({12, 4}));
  vlm::save_hf_checkpoint(tmp / "c", state, fp32());
  TinyVlm dst(true, 10);
  expect_error([&] { vlm::load_module_weights(*dst, tmp / "c"); },
               {"shape mismatch", "\"visual.blocks.1.attn.proj.weight\"", "checkpoint [12, 4]", "module [8, 8]",
                "model.safetensors"},
               "wrong shape");
}

TEST(HfCheckpoint, UnexpectedTensorsErrorOrIgnored) {
  TinyVlm src(true, 11);
  vlm::test::TempDir tmp("hfunexp");
  auto state = vlm::module_state(*src);
  state.emplace_back("visual.merger.extra.weight", torch::ones({3}));
  vlm::save_hf_checkpoint(tmp / "c", state, fp32());
  TinyVlm dst(true, 12);
  expect_error([&] { vlm::load_module_weights(*dst, tmp / "c"); },
               {"1 checkpoint tensors have no parameter", "\"visual.merger.extra.weight\""}, "unexpected");
  vlm::LoadOptions lo;
  lo.allow_unexpected = true;
  auto lr = vlm::load_module_weights(*dst, tmp / "c", lo);
  EXPECT_EQ(lr.unexpected, std::vector<std::string>{"visual.merger.extra.weight"});
  expect_same_state(src, dst);
}

// A submodule loaded alone with a name prefix; the rest of the checkpoint is not "unexpected".
TEST(HfCheckpoint, LoadSubmoduleWithPrefix) {
  TinyVlm src(true, 23);
  vlm::test::TempDir tmp("hfprefix");
  auto opts = fp32();
  opts.style = vlm::HfNameStyle::kNested;
  vlm::save_hf_checkpoint(tmp / "c/", vlm::module_state(*src), opts);  // trailing slash accepted
  EXPECT_EQ(count_entries(tmp.path()), 1);
  Visual vis;
  auto lr = vlm::load_module_weights(*vis, tmp / "c", {false, false, "visual."});
  EXPECT_EQ(lr.loaded, int64_t(vis->named_parameters().size()));
  EXPECT_TRUE(lr.unexpected.empty());
  auto a = vis->named_parameters();
  auto b = src->visual->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key();
  expect_error([&] { vlm::load_module_weights(*vis, tmp / "c", {false, false, "vision."}); },
               {"\"vision.blocks.0.attn.qkv.weight\"", "missing"}, "wrong prefix");
}

// A tied module accepts a checkpoint that stores lm_head (it is skipped, not unexpected);
// buffers absent from the checkpoint keep their value unless required.
TEST(HfCheckpoint, TiedWithLmHeadPresentAndBuffers) {
  TinyVlm untied_src(false, 13);
  vlm::test::TempDir tmp("hftie");
  vlm::NamedTensors params;
  for (const auto& item : untied_src->named_parameters()) params.emplace_back(item.key(), item.value());
  vlm::save_hf_checkpoint(tmp / "c", params, fp32());
  TinyVlm dst(true, 14);
  dst->model->rotary_emb->inv_freq.fill_(7);
  auto lr = vlm::load_module_weights(*dst, tmp / "c");
  EXPECT_EQ(lr.tied_skipped, 1);
  EXPECT_EQ(lr.buffers_kept, 1);
  EXPECT_TRUE(torch::equal(dst->model->embed_tokens->weight, untied_src->model->embed_tokens->weight));
  EXPECT_TRUE(torch::equal(dst->model->rotary_emb->inv_freq, torch::full({4}, 7.0f)));
  vlm::LoadOptions lo;
  lo.require_buffers = true;
  expect_error([&] { vlm::load_module_weights(*dst, tmp / "c", lo); }, {"\"model.rotary_emb.inv_freq\""},
               "required buffer");
}

TEST(HfCheckpoint, LoadsIntoBf16AndGarbageModulesRejectsMeta) {
  TinyVlm src(true, 15);
  vlm::test::TempDir tmp("hfmeta");
  vlm::save_hf_checkpoint(tmp / "c", vlm::module_state(*src), fp32());

  TinyVlm half(true, 16);
  half->to(torch::kBFloat16);
  auto lr = vlm::load_module_weights(*half, tmp / "c");
  EXPECT_EQ(lr.converted, lr.loaded);
  expect_same_state(src, half, torch::kBFloat16);

  // A module whose memory holds garbage (as after materialising from the meta device):
  // every element is overwritten.
  TinyVlm garbage(true, 17);
  {
    torch::NoGradGuard ng;
    for (auto& [name, t] : vlm::module_state(*garbage)) t.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  vlm::load_module_weights(*garbage, tmp / "c");
  expect_same_state(src, garbage);
  EXPECT_EQ(garbage->lm_head->weight.data_ptr(), garbage->model->embed_tokens->weight.data_ptr()) << "tie kept";

  // Still on the meta device: a clear error, not a silent no-op copy.
  struct MetaHolder : torch::nn::Module {
    MetaHolder() { register_parameter("weight", torch::empty({kD}, torch::Device(torch::kMeta))); }
  } meta;
  expect_error([&] { vlm::load_module_weights(meta, tmp / "c"); },
               {"1 tensors of the module are on the meta device", "\"weight\""}, "meta");
}

// Index corruption: a missing shard, a name in the wrong shard, a shard holding names the
// index does not list, bad JSON; a checkpoint mixing both prefix styles for one weight.
TEST(HfCheckpoint, CorruptIndexErrorsNameTheFile) {
  TinyVlm src(true, 18);
  vlm::test::TempDir tmp("hfidx");
  auto opts = fp32();
  opts.max_shard_bytes = 1000;
  const std::string dir = tmp / "c";
  vlm::save_hf_checkpoint(dir, vlm::module_state(*src), opts);
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string good_index = vlm::test::read_file(index_path);
  json index = json::parse(good_index);
  auto& wm = index["weight_map"];
  ASSERT_TRUE(vlm::HfCheckpoint::open(dir).sharded());

  // 1. A shard file is missing.
  const size_t n_shards = vlm::HfCheckpoint::open(dir).files().size();
  const std::string shard2 = shard_name(2, n_shards);
  fs::rename(dir + "/" + shard2, dir + "/moved.bin");
  expect_error([&] { vlm::HfCheckpoint::open(dir); }, {index_path, shard2, "does not exist"}, "missing shard");
  fs::rename(dir + "/moved.bin", dir + "/" + shard2);

  // 2. The index puts a name in the wrong file.
  std::string name_in_1;
  for (auto it = wm.begin(); it != wm.end(); ++it)
    if (it.value() == shard_name(1, n_shards)) {
      name_in_1 = it.key();
      break;
    }
  ASSERT_FALSE(name_in_1.empty());
  const std::string shard1 = wm[name_in_1];
  json wrong = index;
  wrong["weight_map"][name_in_1] = shard2;
  vlm::test::write_file(index_path, wrong.dump());
  expect_error([&] { vlm::HfCheckpoint::open(dir); },
               {"\"" + name_in_1 + "\" is in " + shard2, "does not hold it", "(it is in " + shard1 + ")"}, "wrong file");

  // 3. A shard holds a name the index does not list.
  json dropped = index;
  dropped["weight_map"].erase(name_in_1);
  vlm::test::write_file(index_path, dropped.dump());
  expect_error([&] { vlm::HfCheckpoint::open(dir); }, {shard1, "\"" + name_in_1 + "\"", "does not list"}, "unlisted");

  // 4. Not JSON / no weight_map / an escaping path.
  vlm::test::write_file(index_path, "{\"weight_map\": ");
  expect_error([&] { vlm::HfCheckpoint::open(dir); }, {index_path, "not valid JSON"}, "bad json");
  vlm::test::write_file(index_path, "{\"metadata\": {}}");
  expect_error([&] { vlm::HfCheckpoint::open(dir); }, {index_path, "weight_map"}, "no weight_map");
  json escape = index;
  escape["weight_map"][name_in_1] = "../other.safetensors";
  vlm::test::write_file(index_path, escape.dump());
  expect_error([&] { vlm::HfCheckpoint::open(dir); }, {"must be a relative file name"}, "escape");

  // Restored index loads again.
  vlm::test::write_file(index_path, good_index);
  TinyVlm dst(true, 19);
  vlm::load_module_weights(*dst, dir);
  expect_same_state(src, dst);

  // Both prefix styles for one weight.
  vlm::save_safetensors(tmp / "mixed.safetensors",
                        {{"visual.blocks.0.norm1.weight", torch::ones({kD})},
                         {"model.visual.blocks.0.norm1.weight", torch::ones({kD})}});
  expect_error([&] { vlm::HfCheckpoint::open(tmp / "mixed.safetensors"); },
               {"both name \"visual.blocks.0.norm1.weight\""}, "mixed prefixes");
  // Empty directory.
  fs::create_directory(tmp / "empty");
  expect_error([&] { vlm::HfCheckpoint::open(tmp / "empty"); }, {"no model.safetensors"}, "empty dir");
  expect_error([&] { vlm::HfCheckpoint::open(tmp / "absent"); }, {"does not exist"}, "absent dir");
}

// Regression test from tests/fuzz/hf_index_fuzz.cpp: "total_size": 1e300 was cast to uint64
// (undefined behaviour, UBSan float-cast-overflow); now a clear error naming the index.
TEST(HfCheckpoint, IndexTotalSizeOutOfRangeIsAnError) {
  vlm::test::TempDir tmp("hfidx_total");
  auto opts = fp32();
  opts.max_shard_bytes = 64;
  const std::string dir = tmp / "c";
  vlm::save_hf_checkpoint(dir, {{"a", torch::ones({16})}, {"b", torch::ones({16})}}, opts);
  const std::string index_path = dir + "/model.safetensors.index.json";
  json index = json::parse(vlm::test::read_file(index_path));
  for (double bad : {1e300, -5.0, 18446744073709551616.0}) {
    index["metadata"]["total_size"] = bad;
    vlm::test::write_file(index_path, index.dump());
    expect_error([&] { vlm::HfCheckpoint::open(dir); }, {index_path, "metadata.total_size"},
                 "total_size " + std::to_string(bad));
  }
  index["metadata"]["total_size"] = 128.0;  // an integral float is still a byte count
  vlm::test::write_file(index_path, index.dump());
  EXPECT_EQ(vlm::HfCheckpoint::open(dir).index_total_size(), uint64_t(128));
}

TEST(HfCheckpoint, SaveIsAtomicAndDoesNotClobber) {
  TinyVlm a(true, 20), b(true, 21);
  vlm::test::TempDir tmp("hfatomic");
  const std::string dir = tmp / "out";
  vlm::save_hf_checkpoint(dir, vlm::module_state(*a), fp32());
  const std::string before = vlm::test::read_file(dir + "/model.safetensors");

  // Existing directory without overwrite: refused, untouched.
  expect_error([&] { vlm::save_hf_checkpoint(dir, vlm::module_state(*b), fp32()); }, {dir, "already exists"}, "exists");
  // A save that fails half-way (the last shard's header cannot be encoded: a name that is
  // not UTF-8, after several shards were written): old dir intact, no temp directory left.
  auto bad = vlm::module_state(*b);
  bad.emplace_back("visual.bad\xff", torch::zeros({2}));
  auto o = fp32();
  o.overwrite = true;
  o.max_shard_bytes = 500;
  EXPECT_THROW(vlm::save_hf_checkpoint(dir, bad, o), vlm::Error);
  EXPECT_EQ(vlm::test::read_file(dir + "/model.safetensors"), before);
  EXPECT_EQ(count_entries(tmp.path()), 1);
  EXPECT_EQ(count_entries(dir), 1);

  // Overwrite succeeds and replaces the whole directory (the old single file is gone).
  auto rep = vlm::save_hf_checkpoint(dir, vlm::module_state(*b), o);
  EXPECT_GT(rep.files.size(), 2u);
  EXPECT_FALSE(vlm::test::file_exists(dir + "/model.safetensors"));
  EXPECT_EQ(count_entries(tmp.path()), 1);
  TinyVlm c(true, 22);
  vlm::load_module_weights(*c, dir);
  expect_same_state(b, c);

  expect_error([&] {
    auto o2 = fp32();
    o2.extra_files = {{"model.safetensors", "x"}};
    vlm::save_hf_checkpoint(tmp / "o2", vlm::module_state(*a), o2);
  }, {"would replace a weights file"}, "extra file clash");
}

}  // namespace

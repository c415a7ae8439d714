// `vlmtrain plan`: build the model on the meta device (no weights, no memory) and print
// every unit with its parameter count, plus totals. First version: presets only; the
// recipe (policy table, world size, bytes per rank) is wired in by the recipe loader.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "vlm/check.h"
#include "vlm/config.h"
#include "vlm/meta_init.h"
#include "vlm/qwen2_vl.h"

namespace vlmtrain {

const char* help_plan() {
  return R"(usage: vlmtrain plan RECIPE [--preset NAME] [--world-size N] [--json] [--set KEY=VALUE]...
       vlmtrain plan --preset NAME [--json] [--leaves]

Builds the model on the meta device and prints every module with its parameter count,
policy and bytes per rank, plus totals.

  --preset NAME   model preset: tiny, tiny-qwen2.5, qwen2-vl-2b, qwen2-vl-7b,
                  qwen2.5-vl-3b, qwen2.5-vl-7b
  --json          one JSON object: preset, total_params, vision_params (incl. merger),
                  merger_params, llm_params, modules [{path, params}]
  --leaves        list every parameter-owning layer instead of the sharding units
(RECIPE is not supported yet in this version.)
)";
}

namespace {

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace

int cmd_plan(Args& args) {
  const auto preset_name = args.value("preset");
  const bool as_json = args.flag("json");
  const bool leaves = args.flag("leaves");
  args.finish();
  VLM_CHECK(args.positionals().empty(), "vlmtrain plan: planning from a RECIPE ('", 
            args.positionals().empty() ? "" : args.positionals()[0],
            "') is not wired yet (hint: use `vlmtrain plan --preset NAME`)");
  VLM_CHECK(preset_name.has_value(), "vlmtrain plan: give --preset NAME (see `vlmtrain plan --help`)");

  const vlm::VlmConfig cfg = vlm::preset(*preset_name);
  vlm::Qwen2VL model(cfg, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));

  std::vector<std::pair<std::string, int64_t>> rows;
  if (leaves) {
    rows = vlm::parameter_table(*model);
  } else {
    for (const auto& u : model->units()) {
      rows.emplace_back(u.path, u.shares_params_with.empty() ? vlm::count_parameters(*u.module) : 0);
    }
  }
  const int64_t total = vlm::count_parameters(*model);
  const int64_t vision = vlm::count_parameters(*model->visual);
  const int64_t merger = vlm::count_parameters(*model->visual->merger);
  const int64_t llm = total - vision;

  if (as_json) {
    nlohmann::json j;
    j["preset"] = *preset_name;
    j["family"] = vlm::family_name(cfg.family);
    j["total_params"] = total;
    j["vision_params"] = vision;
    j["merger_params"] = merger;
    j["llm_params"] = llm;
    j["tie_word_embeddings"] = cfg.tie_word_embeddings;
    auto& mods = j["modules"] = nlohmann::json::array();
    for (const auto& [path, n] : rows) mods.push_back({{"path", path}, {"params", n}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  size_t width = 10;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  std::printf("model %s (%s), built on the meta device\n\n", preset_name->c_str(),
              vlm::family_name(cfg.family).c_str());
  std::printf("%-*s %16s\n", static_cast<int>(width), leaves ? "layer" : "unit", "params");
  for (const auto& [path, n] : rows) {
    std::string note = (!leaves && path == "lm_head" && cfg.tie_word_embeddings) ? "  (tied to model.embed_tokens)" : "";
    std::printf("%-*s %16s%s\n", static_cast<int>(width), path.c_str(), with_commas(n).c_str(), note.c_str());
  }
  std::printf("\n%-24s %16s\n", "vision (incl. merger)", with_commas(vision).c_str());
  std::printf("%-24s %16s\n", "merger", with_commas(merger).c_str());
  std::printf("%-24s %16s\n", "llm", with_commas(llm).c_str());
  std::printf("%-24s %16s\n", "total", with_commas(total).c_str());
  return 0;
}

}  // namespace vlmtrain

// `vlmtrain inspect`: inspect a dataset or an image as the pipeline sees it.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "app/cli/commands.h"
#include "app/config/collate_options.h"
#include "app/config/data_options.h"
#include "app/plan/padding_estimate.h"
#include "app/report/progress.h"
#include "data/data_stats.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/pixel_pipeline.h"
#include "data/processor_config.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/image_geometry.h"
#include "vlm/io/safetensors.h"
#include "vlm/text/tokenizer.h"

namespace vlm::app {

namespace {

struct ImageArgs {
  std::string file;                                           // FILE
  std::optional<std::string> preset, model;                   // whose processor (default Qwen2-VL)
  std::optional<long long> min_pixels, max_pixels, max_image_tokens;
  std::optional<std::string> pixels;                          // --pixels OUT.safetensors
  bool json = false;
};

struct DataArgs {
  RecipeArgs recipe;
  long long world_size = 1;  // for the padding estimate (the step plan balances ranks)
  bool json = false;
};

std::string fmt_percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * f);
  return buf;
}

// The padding estimate of one split: JSON and a text line. counts: per record.
void padding_report(const Recipe& recipe, const vlm::data::PixelConfig& pixels, const vlm::data::Dataset& ds,
                    const std::vector<vlm::data::TextTokenCounts>& counts, int64_t world, nlohmann::json* j,
                    std::string* text) {
  std::vector<vlm::collate::SampleCost> costs(ds.records.size());
  for (size_t i = 0; i < ds.records.size(); ++i) {
    costs[i].index = static_cast<int64_t>(i);
    costs[i].text_tokens = counts[i].text_tokens;
    for (const auto& im : ds.records[i].images) costs[i].images.push_back({im.height, im.width});
  }
  const PaddingEstimate e = estimate_padding(costs, recipe, collate_budgets(recipe, pixels), world);
  (*j)["padding"] = {{"world_size", world},
                     {"steps", e.steps},
                     {"packing", recipe.batch.packing},
                     {"padded_fraction", e.padded.fraction()},
                     {"padded_tokens", e.padded.tokens},
                     {"padded_micro_batches", e.micro_batches_padded},
                     {"packed_fraction", e.packed.fraction()},
                     {"packed_tokens", e.packed.tokens},
                     {"packed_micro_batches", e.micro_batches_packed}};
  *text += vlm::str("  padding (step plans of one epoch, ", e.steps, " steps, world size ", world,
                    ", batch.max_tokens ", recipe.batch.max_tokens, "):\n",
                    "    padded rows (batch.packing = false): ", fmt_percent(e.padded.fraction()),
                    " of ", e.padded.tokens, " micro-batch tokens, ", e.micro_batches_padded,
                    " micro-batches per rank in the epoch\n",
                    "    packed rows (batch.packing = true):  ", fmt_percent(e.packed.fraction()),
                    " of ", e.packed.tokens, " micro-batch tokens, ", e.micro_batches_packed,
                    " micro-batches per rank in the epoch\n");
}

// The processor of --preset / --model (HF directory: config.json + preprocessor_config.json),
// else Qwen2-VL's defaults.
vlm::data::PixelConfig inspect_processor(const ImageArgs& a, std::string* which) {
  VLM_CHECK(!(a.preset && a.model), "vlmtrain inspect image: give --preset or --model, not both");
  if (a.preset) {
    *which = "preset " + *a.preset;
    return vlm::data::family_pixel_config(vlm::preset(*a.preset));
  }
  if (a.model) {
    *which = "model " + *a.model;
    return vlm::data::model_pixel_config(vlm::load_hf_config(*a.model), *a.model);
  }
  *which = "Qwen2-VL defaults";
  return vlm::data::PixelConfig{};
}

int inspect_image(const ImageArgs& a) {
  const bool as_json = a.json;
  std::string processor;
  vlm::data::PixelConfig cfg = inspect_processor(a, &processor);
  if (a.min_pixels) cfg.limits.min_pixels = *a.min_pixels;
  const auto& max_pixels = a.max_pixels;
  const auto& max_tokens = a.max_image_tokens;
  VLM_CHECK(!(max_pixels && max_tokens), "vlmtrain inspect image: give --max-pixels or ",
            "--max-image-tokens, not both (a token cap N is max_pixels = N x factor^2)");
  if (max_pixels) cfg.limits.max_pixels = *max_pixels;
  if (max_tokens) {
    VLM_CHECK(*max_tokens > 0, "vlmtrain inspect image: --max-image-tokens must be > 0, got ",
              *max_tokens);
    cfg.max_image_tokens = *max_tokens;
  }
  const std::optional<std::string>& pixels_out = a.pixels;
  const std::string& file = a.file;

  const vlm::data::PixelImage img = vlm::data::process_image_file(file, cfg);
  const auto& g = img.grid_thw;
  if (pixels_out) {
    const torch::Tensor thw = torch::tensor({g[0], g[1], g[2]}, torch::kInt64).view({1, 3});
    vlm::save_safetensors(*pixels_out, {{"pixel_values", img.pixel_values}, {"image_grid_thw", thw}},
                          {std::nullopt, {{"source", file}, {"format", "pt"}}});
  }
  if (as_json) {
    nlohmann::json j = {{"file", file},
                        {"original_height", img.source_height},
                        {"original_width", img.source_width},
                        {"resized_height", img.resized_height},
                        {"resized_width", img.resized_width},
                        {"grid_thw", {g[0], g[1], g[2]}},
                        {"tokens", img.merged_tokens()},
                        {"patches", img.pixel_values.size(0)},
                        {"patch_size", cfg.geometry.patch_size},
                        {"factor", cfg.geometry.factor()}};
    if (pixels_out) j["pixels"] = *pixels_out;
    std::printf("%s\n", j.dump().c_str());
  } else {
    const vlm::PixelLimits lim = cfg.effective_limits();
    std::printf("file:           %s\n", file.c_str());
    std::printf("processor:      %s: patch %lld, merge %lld (factor %lld), mean [%g, %g, %g], "
                "std [%g, %g, %g]\n", processor.c_str(),
                static_cast<long long>(cfg.geometry.patch_size),
                static_cast<long long>(cfg.geometry.merge_size),
                static_cast<long long>(cfg.geometry.factor()), cfg.mean[0], cfg.mean[1],
                cfg.mean[2], cfg.std[0], cfg.std[1], cfg.std[2]);
    std::printf("original:       %lld x %lld (h x w, after EXIF orientation)\n",
                static_cast<long long>(img.source_height), static_cast<long long>(img.source_width));
    std::printf("pixel limits:   min %lld, max %lld\n", static_cast<long long>(lim.min_pixels),
                static_cast<long long>(lim.max_pixels));
    std::printf("resized:        %lld x %lld\n", static_cast<long long>(img.resized_height),
                static_cast<long long>(img.resized_width));
    std::printf("grid_thw:       [%lld, %lld, %lld]\n", static_cast<long long>(g[0]),
                static_cast<long long>(g[1]), static_cast<long long>(g[2]));
    std::printf("pixel_values:   [%lld, %lld]\n",
                static_cast<long long>(img.pixel_values.size(0)),
                static_cast<long long>(img.pixel_values.size(1)));
    std::printf("merged tokens:  %lld\n", static_cast<long long>(img.merged_tokens()));
    if (pixels_out) std::printf("pixels:         %s\n", pixels_out->c_str());
  }
  return 0;
}

int inspect_data(const DataArgs& a) {
  const bool as_json = a.json;
  Recipe recipe = load_recipe(a.recipe);
  const DataSection& d = recipe.data;
  VLM_CHECK(!d.train.empty() || !d.eval.empty(), recipe.location("data.train"),
            ": data.train and data.eval are both empty (hint: --set data.train=FILE.jsonl)");

  vlm::data::DatasetOptions dopt = dataset_options(recipe);
  dopt.on_index_progress = index_progress();
  dopt.max_bad_fraction = 1.0;  // inspecting reports bad records instead of failing
  dopt.max_printed_warnings = as_json ? 0 : 10;
  if (as_json) dopt.warn = [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); };

  const std::string tok_path = !recipe.model.tokenizer.empty() ? recipe.model.tokenizer
                                                               : recipe.model.path;
  std::unique_ptr<vlm::Tokenizer> tok;
  if (!tok_path.empty()) tok = vlm::load_tokenizer(tok_path);

  // The model's processor (resize factor, pixel limits) and default system turn.
  const vlm::VlmConfig model_cfg = recipe_model_config(recipe);
  const vlm::data::PixelConfig pixels = pixel_config(recipe, model_cfg);
  vlm::data::StatsOptions sopt;
  sopt.limits = pixels.limits;
  sopt.max_image_tokens = pixels.max_image_tokens;
  sopt.factor = pixels.geometry.factor();
  sopt.max_seq_len = d.max_seq_len;
  const vlm::data::SampleOptions sample_opts = sample_options(recipe, model_cfg);

  nlohmann::json splits = nlohmann::json::object();
  std::string text;
  const std::vector<std::pair<std::string, std::vector<std::string>>> split_files = {
      {"train", d.train}, {"eval", d.eval}};
  for (const auto& [name, files] : split_files) {
    if (files.empty()) continue;
    vlm::data::Dataset ds = vlm::data::load_dataset(files, dopt);
    std::vector<vlm::data::TextTokenCounts> counts;
    vlm::data::TextCountStats cs;
    if (tok) counts = vlm::data::dataset_text_token_counts(ds, *tok, sample_opts, true, &cs);
    vlm::data::DatasetStats st = vlm::data::dataset_stats(ds, counts, sopt);
    nlohmann::json j = st.to_json();
    j["files"] = files;
    nlohmann::json sources = nlohmann::json::array(), bad = nlohmann::json::array();
    std::string ftext = "  files:\n";
    for (const vlm::data::FileSummary& f : ds.files) {
      const std::string format = vlm::data::to_string(f.format);
      sources.push_back({{"entry", f.spec}, {"path", f.path}, {"container", f.container},
                         {"format", format}, {"records", f.records}, {"bad", f.bad}});
      ftext += vlm::str("    ", f.spec, f.spec == f.path ? "" : " -> " + f.path, ": ", f.container,
                       ", format ", format, ", ", f.records, " records, ", f.bad, " refused\n");
    }
    for (size_t i = 0; i < ds.bad.size(); ++i) {
      const vlm::data::BadRecord& b = ds.bad[i];
      bad.push_back({{"location", b.location()}, {"reason", b.reason}, {"detail", b.detail}});
      if (i < 50) ftext += vlm::str("    refused ", b.location(), ": ", b.reason, ": ", b.detail, "\n");
      else if (i == 50) ftext += vlm::str("    ... ", ds.bad.size() - 50, " more refused (see --json)\n");
    }
    j["sources"] = std::move(sources);
    j["bad_records"] = std::move(bad);
    if (tok) j["token_counts_cached"] = cs.cached;
    splits[name] = std::move(j);
    std::string ptext;
    if (tok) padding_report(recipe, pixels, ds, counts, a.world_size, &splits[name], &ptext);
    text += vlm::data::format_stats(name, st, sopt) + ptext + ftext;
  }
  if (as_json) {
    nlohmann::json out = {{"recipe", recipe.source},
                          {"tokenizer", tok ? nlohmann::json(tok_path) : nlohmann::json()},
                          {"max_image_tokens", d.max_image_tokens},
                          {"max_seq_len", d.max_seq_len},
                          {"min_pixels", pixels.limits.min_pixels},
                          {"max_pixels", pixels.limits.max_pixels},
                          {"factor", pixels.geometry.factor()},
                          {"splits", splits}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("recipe:     %s\ntokenizer:  %s\nlimits:     max_image_tokens %lld, "
                "max_seq_len %lld, pixels [%lld, %lld]\n%s",
                recipe.source.c_str(), tok ? tok_path.c_str() : "(none: set model.tokenizer)",
                static_cast<long long>(d.max_image_tokens), static_cast<long long>(d.max_seq_len),
                static_cast<long long>(pixels.limits.min_pixels),
                static_cast<long long>(pixels.limits.max_pixels),
                text.c_str());
  }
  return 0;
}

}  // namespace

CommandRun declare_inspect(CLI::App& app) {
  app.description(R"(usage: vlmtrain inspect data RECIPE [--set KEY=VALUE]... [--world-size N] [--json]
       vlmtrain inspect image FILE [--preset NAME | --model DIR] [--min-pixels N]
                              [--max-pixels N | --max-image-tokens N]
                              [--pixels OUT.safetensors] [--json]

inspect data: scans data.train and data.eval as training sees them (image sizes from the
index beside each JSONL, no decoding), with token and sequence-length statistics.
inspect image: decodes FILE as training does and prints its resized size, grid and tokens.
Run `vlmtrain inspect data --help` or `vlmtrain inspect image --help` for the options.
)");
  app.require_subcommand(1);
  auto which = std::make_shared<CommandRun>();

  CLI::App* data = app.add_subcommand("data", "");
  auto d = std::make_shared<DataArgs>();
  data->description(R"(usage: vlmtrain inspect data RECIPE [--set KEY=VALUE]... [--world-size N] [--json]

Scans data.train and data.eval as training sees them (image sizes from the index beside
each JSONL, no decoding; the index and the text token counts are cached there) and prints
per split: lines, records, bad records by reason, image width/height and image-token
histograms (before and after data.max_image_tokens), text tokens, supervised tokens and
sequence lengths (text + capped image tokens), and how many samples exceed
data.max_seq_len, and the padding fraction (padding tokens / tokens in micro-batches) of
one epoch's step plans with padded rows and with padding-free packing (batch.packing).
Token statistics need model.tokenizer (or model.path). Histograms use
power-of-two buckets: value v counts under the smallest power of two >= v.
Per file it prints the container (jsonl or json array) and the record format recognised
(or forced by data.format / a dataset_info.json entry), usable and refused records; then
every refused record with its location (file:line, or file:record N in a JSON array) and
reason (the first 50 in the text output).
)");
  add_recipe(*data, d->recipe);
  add_value(*data, "--world-size", d->world_size, "N",
            "ranks for the padding estimate (default 1): the step plans are\n"
            "those of a run on N ranks");
  add_flag(*data, "--json", d->json,
           "one JSON object: {\"tokenizer\", \"max_image_tokens\", \"max_seq_len\",\n"
           "\"splits\": {\"train\": {...}, \"eval\": {...}}}; each split also has\n"
           "\"sources\": [{\"entry\", \"path\", \"container\", \"format\", \"records\",\n"
           "\"bad\"}] and \"bad_records\": [{\"location\", \"reason\", \"detail\"}]; with a\n"
           "tokenizer \"padding\": {\"padded_fraction\", \"packed_fraction\", ...}");
  data->callback([which, d] { *which = [d] { return inspect_data(*d); }; });

  CLI::App* image = app.add_subcommand("image", "");
  auto i = std::make_shared<ImageArgs>();
  image->description(R"(usage: vlmtrain inspect image FILE [--preset NAME | --model DIR] [--min-pixels N]
                              [--max-pixels N | --max-image-tokens N]
                              [--pixels OUT.safetensors] [--json]

Decodes FILE as training does (EXIF orientation applied, alpha composited over white,
16-bit reduced to its high byte), applies smart_resize and prints the original and resized
size, grid_thw (patches) and the merged image tokens. The processor (patch size, mean/std,
pixel limits) is the model's: --preset NAME (its family's defaults, e.g. qwen3-vl-2b: patch
16, mean/std 0.5) or --model DIR (an HF directory: config.json and its
preprocessor_config.json); without either, Qwen2-VL's. pixel_values match HF transformers'
Qwen2VLImageProcessorPil with the same settings bit for bit (docs/image_parity.md).
)");
  add_value(*image, "FILE", i->file, "", "an image file")->required();
  add_value(*image, "--preset", i->preset, "NAME", "the processor of a built-in preset (tiny, qwen2-vl-2b, qwen3-vl-2b, ...)");
  add_value(*image, "--model", i->model, "DIR", "the processor of an HF model directory");
  add_value(*image, "--min-pixels", i->min_pixels, "N", "default: the model's (Qwen2-VL 3136, Qwen3-VL 65536)");
  add_value(*image, "--max-pixels", i->max_pixels, "N",
            "default: the model's (Qwen2-VL 12845056, Qwen3-VL 16777216)");
  add_value(*image, "--max-image-tokens", i->max_image_tokens, "N",
            "per-image cap in merged tokens (max_pixels = N x factor^2;\n"
            "factor = patch x merge: 28 Qwen2-VL, 32 Qwen3-VL)");
  add_value(*image, "--pixels", i->pixels, "OUT",
            "also write OUT (safetensors) with the model's inputs for this image,\n"
            "exactly as the training loader builds them: pixel_values F32\n"
            "[patches, C*T*p*p] (1176 for patch 14, 1536 for patch 16) and\n"
            "image_grid_thw I64 [1, 3] (t, h, w in patches)");
  add_flag(*image, "--json", i->json,
           "one JSON object: original_height, original_width, resized_height,\n"
           "resized_width, grid_thw [t,h,w], tokens, patches, patch_size, factor");
  image->callback([which, i] { *which = [i] { return inspect_image(*i); }; });

  return [which] { return (*which)(); };
}

}  // namespace vlm::app

// The image processor of a model (see processor_config.h).
#include "data/processor_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "vlm/runtime/check.h"
#include "vlm/families/registry.h"

namespace vlm::data {
namespace {

using nlohmann::json;

// A positive integer key of `j` (absent: `fallback`).
int64_t pp_positive_int(const json& j, const char* key, int64_t fallback, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  VLM_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, src, ": key '", key,
            "': expected a positive integer, got ", v.dump(),
            " (hint: fix or delete the key; the model family's default is ", fallback, ")");
  return v.get<int64_t>();
}

// image_mean / image_std: three numbers (std > 0).
std::array<double, 3> pp_triple(const json& j, const char* key, const std::array<double, 3>& fallback,
                                bool positive, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  VLM_CHECK(v.is_array() && v.size() == 3, src, ": key '", key,
            "': expected a list of 3 numbers (R, G, B), got ", v.dump());
  std::array<double, 3> out{};
  for (size_t c = 0; c < 3; ++c) {
    VLM_CHECK(v[c].is_number(), src, ": key '", key, "'[", c, "]: expected a number, got ", v[c].dump());
    out[c] = v[c].get<double>();
    VLM_CHECK(!positive || out[c] > 0, src, ": key '", key, "'[", c,
              "]: expected a positive number, got ", out[c]);
  }
  return out;
}

// patch_size / merge_size / temporal_patch_size must agree with config.json's vision section.
void pp_check_geometry(const json& j, const char* key, int64_t config_value, const char* config_key,
                       const std::string& src) {
  const int64_t v = pp_positive_int(j, key, config_value, src);
  VLM_CHECK(v == config_value, src, ": '", key, "' is ", v, " but config.json has vision ",
            config_key, " = ", config_value,
            " (hint: the preprocessor config belongs to another model; copy the model's own "
            "preprocessor_config.json into the directory, or delete the file to use the "
            "family's defaults)");
}

}  // namespace

PixelConfig family_pixel_config(const vlm::VlmConfig& cfg) {
  const vlm::ProcessorDefaults& d = vlm::family_spec(cfg.family).processor;
  PixelConfig px;
  px.geometry.patch_size = cfg.vision.patch_size;
  px.geometry.merge_size = cfg.vision.spatial_merge_size;
  px.geometry.temporal_patch_size = cfg.vision.temporal_patch_size;
  px.mean = d.image_mean;
  px.std = d.image_std;
  px.limits.min_pixels = d.min_pixels;
  px.limits.max_pixels = d.max_pixels;
  return px;
}

PixelConfig apply_preprocessor_config(PixelConfig base, const json& j, const std::string& src) {
  VLM_CHECK(j.is_object(), src, ": expected a JSON object, got ", j.type_name());
  const vlm::VisionPatchGeometry& g = base.geometry;
  pp_check_geometry(j, "patch_size", g.patch_size, "patch_size", src);
  pp_check_geometry(j, "merge_size", g.merge_size, "spatial_merge_size", src);
  pp_check_geometry(j, "temporal_patch_size", g.temporal_patch_size, "temporal_patch_size", src);
  base.mean = pp_triple(j, "image_mean", base.mean, false, src);
  base.std = pp_triple(j, "image_std", base.std, true, src);
  if (j.contains("size") && !j["size"].is_null()) {
    const json& size = j["size"];
    VLM_CHECK(size.is_object(), src, ": key 'size': expected an object {\"shortest_edge\": "
              "min_pixels, \"longest_edge\": max_pixels}, got ", size.dump());
    const std::string ssrc = src + " (size)";
    base.limits.min_pixels = pp_positive_int(size, "shortest_edge", base.limits.min_pixels, ssrc);
    base.limits.max_pixels = pp_positive_int(size, "longest_edge", base.limits.max_pixels, ssrc);
  }
  base.limits.min_pixels = pp_positive_int(j, "min_pixels", base.limits.min_pixels, src);
  base.limits.max_pixels = pp_positive_int(j, "max_pixels", base.limits.max_pixels, src);
  VLM_CHECK(base.limits.min_pixels <= base.limits.max_pixels, src, ": min_pixels (shortest_edge) ",
            base.limits.min_pixels, " is larger than max_pixels (longest_edge) ",
            base.limits.max_pixels, " (hint: swap or fix the values)");
  return base;
}

PixelConfig model_pixel_config(const vlm::VlmConfig& cfg, const std::string& model_dir) {
  PixelConfig px = family_pixel_config(cfg);
  if (model_dir.empty()) return px;
  namespace fs = std::filesystem;
  const fs::path file = fs::path(model_dir) / kPreprocessorConfigFile;
  if (!fs::is_regular_file(file)) return px;
  std::ifstream in(file);
  VLM_CHECK(in.good(), file.string(), ": cannot read the file (hint: check its permissions)");
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    throw vlm::Error(vlm::str(file.string(), ": not valid JSON (", e.what(),
                              "); hint: fix the file, or delete it to use the model family's "
                              "processor defaults"));
  }
  return apply_preprocessor_config(px, j, file.string());
}

}  // namespace vlm::data

#include "data/dataset_info.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "vlm/runtime/check.h"

namespace vlm::data {
namespace fs = std::filesystem;
namespace {

using json = nlohmann::json;

// Sets `field` from obj[key] when present; a non-string value is an error naming `where`.
void take_string(const json& obj, const char* key, std::string& field, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return;
  VLM_CHECK(it->is_string(), where, ": \"", key, "\" must be a string, got ", it->type_name());
  field = it->get<std::string>();
}

}  // namespace

std::vector<DatasetFile> dataset_info_files(const std::string& info_path, const std::string& name) {
  std::ifstream in(info_path);
  VLM_CHECK(in.good(), "cannot open '", info_path, "' (named by a data entry '", info_path, "#",
            name, "'; hint: the part before '#' is a dataset_info.json or its folder)");
  json info;
  try {
    info = json::parse(in);
  } catch (const json::exception& e) {
    throw vlm::Error(str(info_path, ": invalid JSON: ", e.what()));
  }
  VLM_CHECK(info.is_object(), info_path, ": expected a JSON object of datasets, got ", info.type_name());
  const std::string where = str(info_path, "#", name);
  auto it = info.find(name);
  if (it == info.end()) {
    std::string names;
    for (auto& [k, v] : info.items()) names += (names.empty() ? "" : ", ") + k;
    throw vlm::Error(str(where, ": no dataset \"", name, "\" in ", info_path, " (it has: ",
                         names.empty() ? "none" : names, ")"));
  }
  const json& e = *it;
  VLM_CHECK(e.is_object(), where, ": the entry must be an object, got ", e.type_name());
  for (const char* hub : {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"})
    VLM_CHECK(!e.contains(hub), where, ": \"", hub, "\" datasets are not supported (vlmtrain reads ",
              "local files only; hint: download the data and name it with \"file_name\")");
  VLM_CHECK(!e.value("ranking", false), where, ": preference datasets (\"ranking\": true) ",
            "are not supported (vlmtrain fine-tunes on answers)");
  std::string file_name, formatting = "alpaca";
  take_string(e, "file_name", file_name, where);
  take_string(e, "formatting", formatting, where);
  VLM_CHECK(!file_name.empty(), where, ": the entry has no \"file_name\"");
  VLM_CHECK(formatting == "alpaca" || formatting == "sharegpt", where, ": \"formatting\" is \"",
            formatting, "\"; expected \"alpaca\" or \"sharegpt\"");

  ColumnMap cols = ColumnMap::llamafactory_defaults();
  if (auto c = e.find("columns"); c != e.end()) {
    VLM_CHECK(c->is_object(), where, ": \"columns\" must be an object");
    const std::string w = where + " columns";
    take_string(*c, "prompt", cols.prompt, w);
    take_string(*c, "query", cols.query, w);
    take_string(*c, "response", cols.response, w);
    take_string(*c, "history", cols.history, w);
    take_string(*c, "messages", cols.messages, w);
    take_string(*c, "system", cols.system, w);
    take_string(*c, "images", cols.images, w);
  }
  if (auto t = e.find("tags"); t != e.end()) {
    VLM_CHECK(t->is_object(), where, ": \"tags\" must be an object");
    const std::string w = where + " tags";
    take_string(*t, "role_tag", cols.role_tag, w);
    take_string(*t, "content_tag", cols.content_tag, w);
    take_string(*t, "user_tag", cols.user_tag, w);
    take_string(*t, "assistant_tag", cols.assistant_tag, w);
    take_string(*t, "system_tag", cols.system_tag, w);
    take_string(*t, "observation_tag", cols.observation_tag, w);
    take_string(*t, "function_tag", cols.function_tag, w);
  }

  const fs::path dir = fs::path(info_path).parent_path();
  const fs::path target = dir / file_name;
  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(target, ec)) {
    for (const auto& f : fs::directory_iterator(target, ec)) {
      const std::string ext = f.path().extension().string();
      if (f.is_regular_file() && (ext == ".json" || ext == ".jsonl")) paths.push_back(f.path().string());
    }
    std::sort(paths.begin(), paths.end());
    VLM_CHECK(!paths.empty(), where, ": folder '", target.string(), "' has no .json or .jsonl file");
  } else {
    VLM_CHECK(fs::is_regular_file(target, ec), where, ": file_name '", file_name, "' not found (looked for '",
              target.string(), "')");
    paths.push_back(target.string());
  }
  std::vector<DatasetFile> out;
  for (const std::string& p : paths) {
    DatasetFile f;
    f.spec = info_path + "#" + name;
    f.path = fs::path(p).lexically_normal().string();
    f.format = formatting == "sharegpt" ? DatasetFormat::kSharegpt : DatasetFormat::kAlpaca;
    f.image_base = dir.string();
    f.columns = cols;
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<DatasetFile> resolve_dataset_files(const std::vector<std::string>& entries) {
  std::vector<DatasetFile> out;
  for (const std::string& entry : entries) {
    std::error_code ec;
    const size_t hash = entry.rfind('#');
    if (hash != std::string::npos && !fs::is_regular_file(entry, ec)) {
      std::string info = entry.substr(0, hash);
      if (fs::is_directory(info, ec)) info = (fs::path(info) / "dataset_info.json").string();
      for (DatasetFile& f : dataset_info_files(info, entry.substr(hash + 1))) {
        f.spec = entry;
        out.push_back(std::move(f));
      }
      continue;
    }
    DatasetFile f;
    f.spec = f.path = entry;
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace vlm::data

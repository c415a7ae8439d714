// data.train / data.eval entries -> the files to read. An entry is a dataset file (JSONL or
// a JSON array), or a LLaMA-Factory dataset named in its dataset_info.json:
//
//   data.train = ["data/dataset_info.json#mllm_demo", "more.jsonl"]
//   (the part before '#' may also be the folder holding dataset_info.json)
//
// The entry is read as LLaMA-Factory's data/README.md documents it:
//   file_name   the file, or a folder whose .json/.jsonl files are read in name order,
//               relative to the dataset_info.json folder (LLaMA-Factory's dataset_dir)
//   formatting  "alpaca" (default) or "sharegpt"
//   columns     prompt, query, response, history, messages, system, images (LLaMA-Factory's
//               defaults: instruction, input, output, none, conversations, none, none)
//   tags        role_tag, content_tag, user_tag, assistant_tag, system_tag, observation_tag,
//               function_tag (defaults from, value, human, gpt, system, observation,
//               function_call)
// Relative image paths resolve against the dataset_info.json folder (LLaMA-Factory's
// default media_dir) unless data.image_root is set. Unlike LLaMA-Factory, a path missing
// there is not retried relative to the working directory: it is a "missing image" record. Refused with a vlm::Error naming the
// entry: hub or script datasets (hf_hub_url, ms_hub_url, om_hub_url, script_url,
// cloud_file_name: vlmtrain reads local files only), ranking (preference) datasets, other
// formatting values, a missing name (the error lists the names there). Ignored: tools,
// videos, audios, kto_tag, chosen/rejected columns, num_samples, split, subset, folder.
#pragma once
#include <string>
#include <vector>

#include "data/dataset.h"

namespace vlm::data {

// Resolves each entry in order. A plain path becomes one DatasetFile with default options
// (format kAuto: data.format applies). Throws vlm::Error for an unusable dataset_info entry.
std::vector<DatasetFile> resolve_dataset_files(const std::vector<std::string>& entries);

// The entries of one dataset_info.json entry (used by resolve_dataset_files; exposed for
// tests). `info_path` is the dataset_info.json file, `name` the dataset.
std::vector<DatasetFile> dataset_info_files(const std::string& info_path, const std::string& name);

}  // namespace vlm::data

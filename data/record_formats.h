// Record field helpers shared by the format parsers, and LLaMA-Factory's two formats
// (sharegpt, alpaca) as its converters (llamafactory/data/converter.py) read them:
//
// sharegpt: turns = record[columns.messages]; each turn has role_tag and content_tag. A
//   first turn with system_tag is the system prompt (else the columns.system column). Then
//   user_tag turns at positions 0, 2, 4, .. and assistant_tag turns at 1, 3, 5, .., and an
//   even count. LLaMA-Factory skips other records as "abnormal"; here they are bad records
//   ("invalid turn order", "unknown role"; tool turns observation_tag/function_tag are
//   "unsupported role": vlmtrain has no tool template).
//   Without a dataset_info.json entry, a record without columns.messages but with
//   "messages" is read with OpenAI tags (role/content, user/assistant/system), as
//   LLaMA-Factory's "OpenAI format" entries are written.
// alpaca: user turn = instruction, plus "\n" + input when non-empty; assistant turn =
//   output (a string, required: vlmtrain trains on answers); history pairs come first.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "data/dataset.h"

namespace vlm::data {

// record[key] as a string; BadRecordError "missing field" / "invalid field" otherwise
// (`what` names the object in the message).
const std::string& record_string(const nlohmann::json& j, const char* key, const char* what);

// A string or a list of strings (null: empty); BadRecordError "invalid field" otherwise.
std::vector<std::string> record_string_list(const nlohmann::json& v, const char* key);

// Fill r.turns and append the record's image strings to `images` (BadRecordError).
void parse_sharegpt_record(const nlohmann::json& j, const ColumnMap& columns, Record& r,
                           std::vector<std::string>& images);
void parse_alpaca_record(const nlohmann::json& j, const ColumnMap& columns, Record& r,
                         std::vector<std::string>& images);

}  // namespace vlm::data

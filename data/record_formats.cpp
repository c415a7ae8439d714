#include "data/record_formats.h"

#include "vlm/runtime/check.h"

namespace vlm::data {
namespace {

using json = nlohmann::json;

// The record's system prompt from a column: a string (empty: none); null or absent: none.
void append_system_column(const json& j, const std::string& column, Record& r) {
  if (column.empty()) return;
  auto it = j.find(column);
  if (it == j.end() || it->is_null()) return;
  const std::string& s = record_string(j, column.c_str(), "record");
  if (!s.empty()) r.turns.push_back({"system", s});
}

void append_image_column(const json& j, const std::string& column, std::vector<std::string>& images) {
  if (column.empty()) return;
  auto it = j.find(column);
  if (it == j.end()) return;
  for (std::string& s : record_string_list(*it, column.c_str())) images.push_back(std::move(s));
}

}  // namespace

ColumnMap ColumnMap::llamafactory_defaults() {
  ColumnMap c;
  c.system.clear();
  c.images.clear();
  c.history.clear();
  c.from_dataset_info = true;
  return c;
}

const std::string& record_string(const json& j, const char* key, const char* what) {
  auto it = j.find(key);
  if (it == j.end()) throw BadRecordError("missing field", str("missing \"", key, "\" in ", what));
  if (!it->is_string())
    throw BadRecordError("invalid field", str("\"", key, "\" in ", what, " must be a string, got ",
                                              it->type_name()));
  return it->get_ref<const std::string&>();
}

std::vector<std::string> record_string_list(const json& v, const char* key) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_string())
        throw BadRecordError("invalid field", str("\"", key, "\" must hold strings, got ",
                                                  e.type_name()));
      out.push_back(e.get<std::string>());
    }
  } else if (!v.is_null()) {
    throw BadRecordError("invalid field", str("\"", key, "\" must be a string or a list, got ",
                                              v.type_name()));
  }
  return out;
}

void parse_sharegpt_record(const json& j, const ColumnMap& columns, Record& r,
                           std::vector<std::string>& images) {
  ColumnMap c = columns;
  if (!c.from_dataset_info && !j.contains(c.messages) && j.contains("messages")) {
    c.messages = "messages";  // LLaMA-Factory's "OpenAI format" tags
    c.role_tag = "role";
    c.content_tag = "content";
    c.user_tag = "user";
    c.assistant_tag = "assistant";
    c.system_tag = "system";
  }
  auto it = j.find(c.messages);
  if (it == j.end()) throw BadRecordError("missing field", str("missing \"", c.messages, "\""));
  if (!it->is_array() || it->empty())
    throw BadRecordError("invalid field", str("\"", c.messages, "\" must be a non-empty list"));
  auto role_of = [&](const json& m) -> const std::string& {
    if (!m.is_object()) throw BadRecordError("invalid field", "turn is not an object");
    return record_string(m, c.role_tag.c_str(), "turn");
  };
  size_t start = 0;
  if (!c.system_tag.empty() && role_of(it->front()) == c.system_tag) {
    const std::string& s = record_string(it->front(), c.content_tag.c_str(), "turn");
    if (!s.empty()) r.turns.push_back({"system", s});
    start = 1;
  } else {
    append_system_column(j, c.system, r);
  }
  for (size_t i = start; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string& role = role_of(m);
    const bool user_turn = (i - start) % 2 == 0;
    if (role == c.observation_tag || role == c.function_tag)
      throw BadRecordError("unsupported role", str("tool turn \"", role, "\" at turn ", i,
                                                   " (vlmtrain has no tool-call template)"));
    if (role != c.user_tag && role != c.assistant_tag) {
      if (role == c.system_tag)
        throw BadRecordError("invalid turn order",
                             str("system turn at turn ", i, " (only the first turn may be \"",
                                 c.system_tag, "\")"));
      throw BadRecordError("unknown role", str("role \"", role, "\" at turn ", i, " (expected \"",
                                               c.user_tag, "\" or \"", c.assistant_tag, "\")"));
    }
    const std::string& want = user_turn ? c.user_tag : c.assistant_tag;
    if (role != want)
      throw BadRecordError("invalid turn order",
                           str("turn ", i, " is \"", role, "\" where \"", want,
                               "\" is expected (user and assistant alternate, user first)"));
    r.turns.push_back({user_turn ? "user" : "assistant",
                       record_string(m, c.content_tag.c_str(), "turn")});
  }
  const size_t n = it->size() - start;
  if (n == 0 || n % 2 != 0)
    throw BadRecordError("invalid turn order",
                         str(n, " turn(s) after the system turn; expected user/assistant pairs"));
  append_image_column(j, c.images, images);
}

void parse_alpaca_record(const json& j, const ColumnMap& c, Record& r,
                         std::vector<std::string>& images) {
  append_system_column(j, c.system, r);
  if (!c.history.empty()) {
    auto h = j.find(c.history);
    if (h != j.end() && h->is_array()) {  // LLaMA-Factory ignores a history that is no list
      for (const json& pair : *h) {
        if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
          throw BadRecordError("invalid field",
                               str("\"", c.history, "\" must hold [query, answer] string pairs"));
        r.turns.push_back({"user", pair[0].get<std::string>()});
        r.turns.push_back({"assistant", pair[1].get<std::string>()});
      }
    }
  }
  std::string user;
  for (const std::string* col : {&c.prompt, &c.query}) {
    if (col->empty()) continue;
    auto it = j.find(*col);
    if (it == j.end() || it->is_null()) {
      if (col == &c.prompt) throw BadRecordError("missing field", str("missing \"", *col, "\""));
      continue;
    }
    const std::string& s = record_string(j, col->c_str(), "record");
    if (!s.empty()) user += (user.empty() ? "" : "\n") + s;
  }
  r.turns.push_back({"user", user});
  r.turns.push_back({"assistant", record_string(j, c.response.c_str(), "record")});
  append_image_column(j, c.images, images);
}

}  // namespace vlm::data

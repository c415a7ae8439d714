// Recipe parsing and printing: the only place TOML is read (cross-field checks:
// recipe_validate.cpp).
#include "app/config/recipe.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <toml.hpp>
#include <type_traits>

#include "app/config/recipe_fields.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"

namespace vlm::app {
namespace {


std::string type_name(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::boolean: return "a boolean";
    case toml::value_t::integer: return "an integer";
    case toml::value_t::floating: return "a float";
    case toml::value_t::string: return "a string";
    case toml::value_t::array: return "an array";
    case toml::value_t::table: return "a table";
    case toml::value_t::empty: return "nothing";
    default: return "a date/time";
  }
}

std::string where_of(const toml::value& v, const std::string& fallback) {
  auto loc = v.location();
  const std::string& file = loc.file_name();
  if (file.rfind("--set", 0) == 0) return file;
  if (file.empty() || file == "unknown file" || loc.line() == 0) return fallback;
  return file + ":" + std::to_string(loc.line());
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// ---------------------------------------------------------------- parsing

class Parser {
 public:
  // `table` may be null when the section is absent (all defaults).
  Parser(const toml::value* table, std::string prefix, Recipe& recipe, std::string table_where)
      : table_(table), prefix_(std::move(prefix)), recipe_(recipe), table_where_(std::move(table_where)) {}

  // Every field has a doc (the reference is generated from it): a field list entry
  // without one does not compile.
  template <class T>
  void operator()(const char* key, T& member, const char* /*doc*/) {
    visit(key, member, nullptr, nullptr);
  }
  template <class T>
  void operator()(const char* key, T& member, const Choice& choice, const char* /*doc*/) {
    visit(key, member, &choice, nullptr);
  }
  template <class T>
  void operator()(const char* key, T& member, const Range& range, const char* /*doc*/) {
    visit(key, member, nullptr, &range);
  }

  // Rejects keys of the table that no field claimed, with a suggestion.
  void finish() const {
    if (table_ == nullptr) return;
    for (const auto& [k, v] : table_->as_table()) {
      if (known_.count(k)) continue;
      std::string best;
      size_t best_d = 3;
      for (const auto& cand : known_) {
        size_t d = edit_distance(k, cand);
        if (d < best_d) best_d = d, best = cand;
      }
      std::string valid;
      for (const auto& cand : order_) valid += (valid.empty() ? "" : ", ") + cand;
      throw vlm::Error(where_of(v, table_where_) + ": unknown key '" + prefix_ + k + "'" +
                       (best.empty() ? "" : " (did you mean '" + prefix_ + best + "'?)") +
                       "; valid keys here: " + valid);
    }
  }

 private:
  template <class T>
  void visit(const char* key, T& member, const Choice* choice, const Range* range) {
    known_.insert(key);
    order_.push_back(key);
    if (table_ == nullptr) {
      if constexpr (has_fields<T>::value) {
        Parser sub(nullptr, prefix_ + key + ".", recipe_, table_where_);
        member.fields(sub);
      }
      return;
    }
    const auto& tbl = table_->as_table();
    auto it = tbl.find(key);
    std::string dotted = prefix_ + key;
    if (it == tbl.end()) {
      if constexpr (has_fields<T>::value) {  // absent section: defaults, still visited
        Parser sub(nullptr, dotted + ".", recipe_, table_where_);
        member.fields(sub);
      }
      return;
    }
    const toml::value& v = it->second;
    std::string at = where_of(v, table_where_);
    recipe_.where[dotted] = at;
    convert(dotted, at, v, member, choice, range);
  }

  [[noreturn]] static void type_error(const std::string& at, const std::string& key,
                                      const std::string& expected, const toml::value& v) {
    throw vlm::Error(at + ": key '" + key + "': expected " + expected + ", got " + type_name(v));
  }

  static void check_range(const std::string& at, const std::string& key, double x, const Range* r) {
    if (r == nullptr) return;
    bool low_ok = r->lo_open ? x > r->lo : x >= r->lo;
    if (!low_ok || x > r->hi || std::isnan(x)) {
      std::ostringstream ss;
      ss << at << ": key '" << key << "': value " << x << " is out of range (expected "
         << (r->lo_open ? "> " : ">= ") << r->lo << " and <= " << r->hi << ")";
      throw vlm::Error(ss.str());
    }
  }

  static void check_choice(const std::string& at, const std::string& key, const std::string& s,
                           const Choice* c) {
    if (c == nullptr) return;
    for (const auto& ok : c->values)
      if (s == ok) return;
    std::string list;
    for (const auto& ok : c->values) list += (list.empty() ? "" : ", ") + toml_quote(ok);
    throw vlm::Error(at + ": key '" + key + "': invalid value " + toml_quote(s) + " (expected one of " +
                     list + ")");
  }

  template <class T>
  void convert(const std::string& key, const std::string& at, const toml::value& v, T& out,
               const Choice* choice, const Range* range) {
    if constexpr (has_fields<T>::value) {
      if (!v.is_table()) type_error(at, key, "a table", v);
      Parser sub(&v, key + ".", recipe_, at);
      out.fields(sub);
      sub.finish();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) type_error(at, key, "a string", v);
      out = v.as_string().str;
      check_choice(at, key, out, choice);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) type_error(at, key, "true or false", v);
      out = v.as_boolean();
    } else if constexpr (std::is_same_v<T, int64_t>) {
      if (!v.is_integer()) type_error(at, key, "an integer", v);
      out = v.as_integer();
      check_range(at, key, static_cast<double>(out), range);
    } else if constexpr (std::is_same_v<T, double>) {
      if (v.is_integer()) out = static_cast<double>(v.as_integer());
      else if (v.is_floating()) out = v.as_floating();
      else type_error(at, key, "a number", v);
      check_range(at, key, out, range);
    } else if constexpr (is_optional<T>::value) {
      typename T::value_type inner{};
      convert(key, at, v, inner, choice, range);
      out = inner;
    } else if constexpr (is_vector<T>::value) {
      using E = typename T::value_type;
      out.clear();
      if constexpr (std::is_same_v<E, std::string>) {
        if (v.is_string()) {  // a single string is a list of one
          out.push_back(v.as_string().str);
          check_choice(at, key, out.back(), choice);
          return;
        }
      }
      if (!v.is_array()) type_error(at, key, "an array", v);
      size_t i = 0;
      for (const auto& item : v.as_array()) {
        std::string item_key = key + "[" + std::to_string(i++) + "]";
        recipe_.where[item_key] = where_of(item, at);
        E e{};
        convert(item_key, where_of(item, at), item, e, choice, range);
        out.push_back(std::move(e));
      }
    } else {
      static_assert(sizeof(T) == 0, "unsupported recipe field type");
    }
  }

  const toml::value* table_;
  std::string prefix_;
  Recipe& recipe_;
  std::string table_where_;
  std::set<std::string> known_;
  std::vector<std::string> order_;
};

// ---------------------------------------------------------------- printing

class Printer {
 public:
  explicit Printer(std::string header) : header_(std::move(header)) {}

  template <class T, class... Constraint>
  void operator()(const char* key, T& member, const Constraint&...) {
    add(key, member);
  }

  std::string str() const {
    std::string out;
    if (!header_.empty() && (!scalars_.empty() || nested_.empty())) out += header_ + "\n";
    out += scalars_;
    if (!nested_.empty()) out += (out.empty() ? "" : "\n") + nested_;
    return out;
  }

 private:
  template <class T>
  void add(const std::string& key, T& member) {
    if constexpr (has_fields<T>::value) {
      std::string path = table_path() + key;
      Printer sub("[" + path + "]");
      sub.path_ = path;
      member.fields(sub);
      nested_ += (nested_.empty() ? "" : "\n") + sub.str();
    } else if constexpr (is_struct_vector<T>::value) {
      std::string path = table_path() + key;
      for (auto& item : member) {
        Printer sub("[[" + path + "]]");
        sub.path_ = path;
        item.fields(sub);
        nested_ += (nested_.empty() ? "" : "\n") + sub.str();
      }
    } else if constexpr (is_optional<T>::value) {
      if (member.has_value()) add(key, *member);
    } else {
      scalars_ += key + " = " + toml_value(member) + "\n";
    }
  }

  std::string table_path() const { return path_.empty() ? "" : path_ + "."; }

  std::string header_;
  std::string path_;
  std::string scalars_;
  std::string nested_;
};

// ---------------------------------------------------------------- overrides

// toml11 parses arrays and inline tables recursively (deep nesting overflows the stack) and
// takes quadratic time in the parts of a dotted key, so a recipe's shape is bounded before
// toml11 sees it. Recipes are small, shallow files; these limits are far above real ones.
constexpr size_t kMaxRecipeBytes = 1 << 20;
constexpr int kMaxRecipeNesting = 32;     // [ and { levels
constexpr int kMaxDottedKeyParts = 32;    // a.b.c = ... / [a.b.c]

void check_toml_shape(const std::string& text, const std::string& source) {
  VLM_CHECK(text.size() <= kMaxRecipeBytes, source, ": ", text.size(), " bytes; expected a recipe of at most ",
            kMaxRecipeBytes, " bytes (hint: is this a recipe TOML file?)");
  int depth = 0, dots = 0;
  int64_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      dots = 0;
    } else if (c == '#') {  // comment to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (c == '"' || c == '\'') {  // string: skip it (multi-line when tripled)
      const bool triple = text.compare(i, 3, std::string(3, c)) == 0;
      const std::string close = triple ? std::string(3, c) : std::string(1, c);
      size_t j = i + close.size();
      while (j < text.size() && text.compare(j, close.size(), close) != 0) {
        if (text[j] == '\\' && c == '"') ++j;  // escape in a basic string
        if (j < text.size() && text[j] == '\n') {
          if (!triple) break;  // unterminated: toml11 reports it
          ++line;
        }
        ++j;
      }
      i = std::min(j + close.size(), text.size()) - 1;
    } else if (c == '[' || c == '{') {
      dots = 0;
      VLM_CHECK(++depth <= kMaxRecipeNesting, source, ":", line, ": arrays / inline tables nested deeper than ",
                kMaxRecipeNesting, " levels (hint: is this a recipe TOML file?)");
    } else if (c == ']' || c == '}') {
      dots = 0;
      depth = std::max(depth - 1, 0);
    } else if (c == '=' || c == ',') {
      dots = 0;
    } else if (c == '.') {
      VLM_CHECK(++dots < kMaxDottedKeyParts, source, ":", line, ": a dotted key with more than ",
                kMaxDottedKeyParts, " parts (hint: is this a recipe TOML file?)");
    }
  }
}

toml::value parse_override_value(const std::string& text, const std::string& source) {
  check_toml_shape(text, source);
  std::istringstream in("v = " + text + "\n");
  try {
    toml::value doc = toml::parse(in, source);
    return doc.as_table().at("v");
  } catch (const std::exception&) {
    // A bare word such as runs/x or cosine: take it as a string.
    std::istringstream in2("v = " + toml_quote(text) + "\n");
    toml::value doc = toml::parse(in2, source);
    return doc.as_table().at("v");
  }
}

void apply_override(toml::value& root, const std::string& spec) {
  auto eq = spec.find('=');
  VLM_CHECK(eq != std::string::npos && eq > 0, "--set ", spec,
            ": expected section.key=value (e.g. --set optim.lr=2e-5)");
  std::string key = spec.substr(0, eq);
  std::string source = "--set " + key;
  toml::value value = parse_override_value(spec.substr(eq + 1), source);

  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) {
    VLM_CHECK(!p.empty(), source, ": empty component in key '", key, "'");
    parts.push_back(p);
  }
  toml::value* cur = &root;
  for (size_t i = 0; i + 1 <= parts.size(); ++i) {
    const std::string& p = parts[i];
    bool last = i + 1 == parts.size();
    if (cur->is_array()) {
      char* end = nullptr;
      long idx = std::strtol(p.c_str(), &end, 10);
      auto& arr = cur->as_array();
      VLM_CHECK(*end == '\0' && idx >= 0 && static_cast<size_t>(idx) < arr.size(), source,
                ": '", p, "' is not an index of the array (it has ", arr.size(), " entries)");
      if (last) arr[idx] = value;
      else cur = &arr[idx];
      continue;
    }
    VLM_CHECK(cur->is_table(), source, ": '", p, "' is inside a value that is not a table");
    auto& tbl = cur->as_table();
    if (last) {
      tbl[p] = value;
    } else {
      auto it = tbl.find(p);
      if (it == tbl.end()) it = tbl.emplace(p, toml::table{}).first;
      cur = &it->second;
    }
  }
}

Recipe from_toml(toml::value root, const std::string& source, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(root, o);
  Recipe r;
  r.source = source;
  Parser p(&root, "", r, source);
  r.fields(p);
  p.finish();
  if (r.run.name.empty()) {
    std::string stem = source.substr(source.find_last_of('/') + 1);
    if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".toml") stem.resize(stem.size() - 5);
    r.run.name = stem;
  }
  return r;
}

toml::value parse_toml(const std::string& text, const std::string& source) {
  check_toml_shape(text, source);
  std::istringstream in(text);
  try {
    return toml::parse(in, source);
  } catch (const toml::exception& e) {
    throw vlm::Error(source + ": TOML syntax error:\n" + std::string(e.what()));
  }
}

}  // namespace

// ---------------------------------------------------------------- public API

Recipe parse_recipe(const std::string& text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  return from_toml(parse_toml(text, source_name), source_name, overrides);
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in.good(), "cannot open recipe '", path, "' (check the path; recipes live in recipes/)");
  std::stringstream text;
  text << in.rdbuf();
  return from_toml(parse_toml(text.str(), path), path, overrides);
}

std::string to_toml(const Recipe& recipe) {
  Recipe copy = recipe;  // fields() is non-const by design (one list for parse and print)
  Printer root("");
  copy.fields(root);
  return root.str();
}

std::string recipe_hash(const Recipe& recipe) {
  // FNV-1a 64 over the resolved TOML: stable across platforms and runs.
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : to_toml(recipe)) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string save_resolved_recipe(const Recipe& recipe, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  VLM_CHECK(!ec, "cannot create run directory '", dir, "': ", ec.message(),
            " (hint: check run.output_dir and permissions)");
  std::string path = (fs::path(dir) / "recipe.toml").string();
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    VLM_CHECK(out.good(), "cannot write '", tmp, "'");
    out << "# resolved from " << recipe.source << " (hash " << recipe_hash(recipe) << ")\n"
        << to_toml(recipe);
    out.flush();
    VLM_CHECK(out.good(), "writing '", tmp, "' failed (disk full?)");
  }
  fs::rename(tmp, path, ec);
  VLM_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  return path;
}

std::vector<std::string> known_presets() { return vlm::preset_names(); }

std::vector<std::string> family_choices() {
  std::vector<std::string> out{""};
  for (const auto& f : vlm::family_names()) out.push_back(f);
  return out;
}

std::string Recipe::location(const std::string& key) const {
  auto it = where.find(key);
  return it != where.end() ? it->second : source;
}

// ---------------------------------------------------------------- TOML spelling (recipe_fields.h)

std::string toml_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

static std::string format_double(double x) {
  char buf[40];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// A scalar field's value in TOML syntax.
std::string toml_value(const std::string& s) { return toml_quote(s); }
std::string toml_value(bool b) { return b ? "true" : "false"; }
std::string toml_value(int64_t x) { return std::to_string(x); }
std::string toml_value(double x) { return format_double(x); }
std::string toml_value(const std::vector<std::string>& xs) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + toml_quote(xs[i]);
  return out + "]";
}

}  // namespace vlm::app

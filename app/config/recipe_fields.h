// How the recipe's field lists are walked (recipe.cpp's parser and printer, recipe_doc.cpp's
// reference): traits that tell a nested table, an array of tables and an optional key apart
// from a scalar, and the TOML spelling of a scalar value.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace vlm::app {

template <class T, class = void>
struct has_fields : std::false_type {};
struct ProbeVisitor {
  template <class... A>
  void operator()(A&&...) {}
};
template <class T>
struct has_fields<T, std::void_t<decltype(std::declval<T&>().fields(std::declval<ProbeVisitor&>()))>>
    : std::true_type {};

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

template <class T>
struct is_struct_vector : std::false_type {};
template <class T>
struct is_struct_vector<std::vector<T>> : has_fields<T> {};

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// A string as a TOML basic string (quotes, escapes).
std::string toml_quote(const std::string& s);
// A scalar field's value in TOML syntax (doubles: the shortest spelling that reads back
// the same value, always with a '.', 'e' or 'n').
std::string toml_value(const std::string& s);
std::string toml_value(bool b);
std::string toml_value(int64_t x);
std::string toml_value(double x);
std::string toml_value(const std::vector<std::string>& xs);

}  // namespace vlm::app

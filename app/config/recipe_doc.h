// The recipe key reference (docs/recipe.md; `vlmtrain recipe --doc`).
#pragma once
#include <string>

namespace vlm::app {

// Every section of the recipe with its doc, then one markdown table row per key with its
// type, default, allowed values and doc, all from the field lists of recipe.h.
// Deterministic: the same build prints the same text.
std::string recipe_reference();

}  // namespace vlm::app

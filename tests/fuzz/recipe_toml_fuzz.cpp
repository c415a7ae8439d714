// Fuzz target: a TOML recipe through vlm::app::parse_recipe and Recipe::validate for every
// purpose; an accepted recipe is printed (to_toml) and must parse back to the same text.
#include <string>

#include "app/config/recipe.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  vlm::app::Recipe recipe;
  try {
    recipe = vlm::app::parse_recipe(text, "<fuzz>.toml");
  } catch (const vlm::Error&) {
    return 0;
  }
  for (auto purpose : {vlm::app::Purpose::train, vlm::app::Purpose::eval, vlm::app::Purpose::plan})
    vlm::fuzz::expect_only_vlm_errors([&] { recipe.validate(purpose); });
  const std::string printed = vlm::app::to_toml(recipe);
  vlm::app::Recipe again = vlm::app::parse_recipe(printed, "<fuzz>.toml");  // must parse
  if (vlm::app::to_toml(again) != printed) __builtin_trap();
  (void)vlm::app::recipe_hash(recipe);
  return 0;
}

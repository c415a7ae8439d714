// Fuzz target: a TOML recipe through vlmtrain::parse_recipe and Recipe::validate for every
// purpose; an accepted recipe is printed (to_toml) and must parse back to the same text.
#include <string>

#include "app/recipe.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  vlmtrain::Recipe recipe;
  try {
    recipe = vlmtrain::parse_recipe(text, "<fuzz>.toml");
  } catch (const vlm::Error&) {
    return 0;
  }
  for (auto purpose : {vlmtrain::Purpose::train, vlmtrain::Purpose::eval, vlmtrain::Purpose::plan})
    vlmfuzz::expect_only_vlm_errors([&] { recipe.validate(purpose); });
  const std::string printed = vlmtrain::to_toml(recipe);
  vlmtrain::Recipe again = vlmtrain::parse_recipe(printed, "<fuzz>.toml");  // must parse
  if (vlmtrain::to_toml(again) != printed) __builtin_trap();
  (void)vlmtrain::recipe_hash(recipe);
  return 0;
}

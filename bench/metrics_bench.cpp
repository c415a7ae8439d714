// Speed of the OCR metrics on page-length texts (not in CI; see scripts/bench.sh).
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "app/eval/metrics.h"

using vlm::app::Scorer;
using vlm::app::edit_distance;

int main() {
  std::mt19937 rng(99);
  auto page = [&](size_t n) {
    std::u32string s;
    for (size_t i = 0; i < n; ++i) s.push_back(0xAC00 + rng() % 64);  // Hangul syllables
    return s;
  };
  const std::u32string a = page(4000), b = page(4000);
  const auto t0 = std::chrono::steady_clock::now();
  const size_t d = edit_distance(a, b);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("edit_distance 4000 x 4000 code points: %.1f ms (%.2f ns/cell), distance %zu\n",
              ms, ms * 1e6 / (4000.0 * 4000.0), d);

  // A whole sample through the Scorer, every metric: a 3000-code-point page (Hangul and
  // Latin words) against a prediction with ~3% of its code points substituted.
  std::u32string ref;
  while (ref.size() < 3000) {
    const size_t w = 1 + rng() % 6;
    for (size_t i = 0; i < w; ++i)
      ref.push_back(rng() % 2 ? char32_t(0xAC00 + rng() % 400) : char32_t('a' + rng() % 26));
    ref.push_back(rng() % 10 ? U' ' : U'\n');
  }
  std::u32string hyp = ref;
  for (size_t k = 0; k < ref.size() * 3 / 100; ++k) hyp[rng() % hyp.size()] = U'#';
  const std::string ref8 = vlm::app::to_utf8(ref), hyp8 = vlm::app::to_utf8(hyp);
  Scorer scorer;
  const auto t1 = std::chrono::steady_clock::now();
  const auto s = scorer.add(hyp8, {ref8});
  const double ms1 =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  std::printf("Scorer::add, all metrics, %zu-code-point page, %zu char edits: %.1f ms\n",
              ref.size(), s.char_edits, ms1);
  return 0;
}

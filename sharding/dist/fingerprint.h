// Start-up consistency check: every rank must run the same recipe, model, unit table and
// data, or the collectives that follow would mismatch and hang. Ranks exchange a 64-bit
// hash per named field (two small all-gathers: the field list, then the field hashes) and
// every rank throws the same vlm::Error naming the differing fields and which ranks hold
// which value, e.g.
//   "recipe hash differs: ranks 0,2 = 3fa9c2e17b0d4c21, rank 1 = 9c0e5b7a2d114f80"
// No rank can hang in the check: the exchange has a fixed shape (2 then F int64 values)
// once the field lists agree, and a differing field list is detected by the first step.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vlm::sharding {

class Comm;

struct Fingerprint {
  // Named fields in a fixed order; values are arbitrary strings (a hash, a JSON dump...).
  std::vector<std::pair<std::string, std::string>> fields;

  Fingerprint& add(const std::string& name, const std::string& value);

  // The standard start-up fingerprint; adds "libtorch version" itself.
  static Fingerprint standard(const std::string& recipe_hash, const std::string& model_config,
                              const std::string& unit_table, int64_t dataset_size);
};

// FNV-1a 64-bit hash of a byte string (stable across processes and builds).
uint64_t fnv1a64(const std::string& bytes);

// Collective: every rank of `comm` must call it. Returns normally when all ranks agree;
// otherwise throws vlm::Error on every rank.
void check_fingerprint(Comm& comm, const Fingerprint& fp);

}  // namespace vlm::sharding

// Logging for the app layer (spdlog): rank-prefixed lines, rank 0 only by default.
// Library layers (vlm, sharding, collate, data) do not log; they return facts or throw.
#pragma once
#include <string>

namespace vlm::app {

// Sets up the default logger. `level` is trace|debug|info|warn|error; the environment
// variable VLMTRAIN_LOG_LEVEL overrides it. Ranks other than 0 log warnings and errors
// only, unless `all_ranks`.
void init_logging(int rank, int world_size, const std::string& level, bool all_ranks);

}  // namespace vlm::app

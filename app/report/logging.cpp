#include "app/report/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "vlm/runtime/check.h"

namespace vlm::app {

void init_logging(int rank, int world_size, const std::string& level, bool all_ranks) {
  std::string lvl = level;
  if (const char* env = std::getenv("VLMTRAIN_LOG_LEVEL"); env != nullptr && *env != '\0') lvl = env;
  auto parsed = spdlog::level::from_str(lvl);
  VLM_CHECK(parsed != spdlog::level::off || lvl == "off", "unknown log level '", lvl,
            "' (expected trace, debug, info, warn or error)");
  if (rank != 0 && !all_ranks && parsed < spdlog::level::warn) parsed = spdlog::level::warn;

  auto logger = spdlog::stderr_color_mt("vlmtrain-" + std::to_string(rank));
  std::string prefix = world_size > 1 ? "[rank " + std::to_string(rank) + "] " : "";
  logger->set_pattern("%H:%M:%S %^%L%$ " + prefix + "%v");
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace vlm::app

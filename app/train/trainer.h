// The trainer: `vlmtrain train RECIPE` from start to finish (see trainer.cpp, which reads
// top to bottom).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "app/config/recipe.h"

namespace vlm::app {

struct TrainSummary {
  int64_t start_step = 0;       // 0, or the step of the checkpoint resumed from
  int64_t end_step = 0;         // last step done
  double last_loss = 0;         // token-weighted global mean loss of the last step
  std::string last_checkpoint;  // "" when none was written
  bool stopped_by_signal = false;
};

// Runs the recipe on this process's rank (world from the launcher's environment). Every
// rank calls it. Throws vlm::Error on failure (after writing TORCHELASTIC_ERROR_FILE).
TrainSummary run_training(const Recipe& recipe);

}  // namespace vlm::app

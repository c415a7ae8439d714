// metrics.jsonl (+ TensorBoard): where the trainer's step and eval metrics go.
//
//   MetricsFile metrics(out_dir, /*enabled=*/rank == 0, recipe.log.tensorboard, st.step + 1);
//   metrics.write({{"step", 7}, {"loss", 2.5}});   // one JSON object per line, flushed
//
// Every object goes to <dir>/metrics.jsonl (appended to, so a resumed run continues the
// file) and, with `tensorboard`, the same object's numbers to the TensorBoard events under
// <dir>/tb/ (tensorboard.h), so the two cannot drift. `first_step` is the first step this
// process logs (after a resume), TensorBoard's restart point. A disabled file (ranks other
// than 0) writes nothing.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>

#include "app/report/tensorboard.h"

namespace vlm::app {

class MetricsFile {
 public:
  // Throws vlm::Error when enabled and <dir>/metrics.jsonl cannot be opened for appending.
  MetricsFile(const std::string& dir, bool enabled, bool tensorboard, int64_t first_step);
  // Appends `j` as one line and flushes; then the TensorBoard scalars. No-op when disabled.
  void write(const nlohmann::json& j);
  // The TensorBoard events file ("" without TensorBoard or when disabled).
  const std::string& tensorboard_file() const { return tb_.path(); }

 private:
  std::string path_;
  std::ofstream out_;
  TensorBoardWriter tb_;
};

}  // namespace vlm::app

// data.synth.generate_if_missing: the synthetic OCR set a recipe trains on, rendered at the
// start of `vlmtrain train` when it is not there yet (data/synth_ocr.h renders it; `vlmtrain
// synth-ocr` is the same renderer as a command).
#pragma once
#include "app/config/recipe.h"
#include "sharding/dist/comm.h"

namespace vlm::app {

// Collective (every rank; two all-reduces on `comm` when data.synth.generate_if_missing is
// set and data.train is not empty, none otherwise). Rank 0 (`main`) renders the set into
// data.train[0]'s folder when it is missing, or when synth_ocr.json there says it was
// rendered differently (other options, older renderer). Rank 0 decides; every rank learns
// it by all-reduce, and every rank throws vlm::Error when rank 0 failed to render it.
void ensure_synth_data(const Recipe& recipe, vlm::sharding::Comm& comm, bool main);

}  // namespace vlm::app

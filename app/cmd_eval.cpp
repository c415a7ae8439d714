// `vlmtrain eval`: evaluate a checkpoint or hf model on ocr sets.
#include "app/commands.h"

namespace vlmtrain {

const char* help_eval() {
  return R"(usage: vlmtrain eval RECIPE [--checkpoint DIR | --model HF_DIR] [--data FILE.jsonl]...
                     [--max-new-tokens N] [--batch-size B] [--set KEY=VALUE]...

Generates answers greedily for every sample and writes predictions.jsonl and
eval_summary.json (CER, WER, NED, exact match, ANLS, OCRBench-style accuracy).
)";
}

int cmd_eval(Args& args) {
  (void)args;
  not_yet("eval", "issue #10");
}

}  // namespace vlmtrain

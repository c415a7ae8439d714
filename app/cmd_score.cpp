// `vlmtrain score`: score an existing predictions.jsonl (no model needed).
#include "app/commands.h"

namespace vlmtrain {

const char* help_score() {
  return R"(usage: vlmtrain score --pred predictions.jsonl [--metrics cer,wer,ned,em,anls,ocrbench]
                      [--out summary.json]
)";
}

int cmd_score(Args& args) {
  (void)args;
  not_yet("score", "issue #10");
}

}  // namespace vlmtrain

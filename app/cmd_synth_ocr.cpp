// `vlmtrain synth-ocr`: render a synthetic ocr dataset (+ a small sentencepiece model).
#include "app/commands.h"

namespace vlmtrain {

const char* help_synth_ocr() {
  return R"(usage: vlmtrain synth-ocr --out DIR [--train N] [--val M] [--seed S]
)";
}

int cmd_synth_ocr(Args& args) {
  (void)args;
  not_yet("synth-ocr", "issue #5");
}

}  // namespace vlmtrain

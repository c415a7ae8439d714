// `vlmtrain tokenize`: encode or decode text with a tokenizer (debugging / conformance).
#include "app/commands.h"

namespace vlmtrain {

const char* help_tokenize() {
  return R"(usage: vlmtrain tokenize --tokenizer PATH [--ids|--tokens] TEXT...
       vlmtrain tokenize --tokenizer PATH --decode ID...

PATH is a tokenizer.json, a sentencepiece .model, or a model directory holding one.
Prints one line per input.
)";
}

int cmd_tokenize(Args& args) {
  (void)args;
  not_yet("tokenize", "issue #4");
}

}  // namespace vlmtrain

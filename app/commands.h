// One function per subcommand, each defined in app/cmd_<name>.cpp.
#pragma once
#include "app/cli.h"
#include "app/recipe.h"

namespace vlmtrain {

int cmd_train(Args& args);      // app/cmd_train.cpp
int cmd_eval(Args& args);       // app/cmd_eval.cpp
int cmd_plan(Args& args);       // app/cmd_plan.cpp
int cmd_export(Args& args);     // app/cmd_export.cpp
int cmd_score(Args& args);      // app/cmd_score.cpp
int cmd_synth_ocr(Args& args);  // app/cmd_synth_ocr.cpp
int cmd_inspect(Args& args);    // app/cmd_inspect.cpp
int cmd_tokenize(Args& args);   // app/cmd_tokenize.cpp
int cmd_launch(Args& args);     // app/cmd_launch.cpp
int cmd_report(Args& args);     // app/cmd_report.cpp

// Help text of each subcommand, printed by `vlmtrain <cmd> --help`.
const char* help_train();
const char* help_eval();
const char* help_plan();
const char* help_export();
const char* help_score();
const char* help_synth_ocr();
const char* help_inspect();
const char* help_tokenize();
const char* help_launch();
const char* help_report();

// Loads the recipe named by positional `index` with every `--set KEY=VALUE` applied.
Recipe recipe_from_args(Args& args, size_t index = 0);

// For subcommands whose implementation has not landed: a clear error, non-zero exit.
[[noreturn]] void not_yet(const std::string& command, const std::string& issue);

}  // namespace vlmtrain

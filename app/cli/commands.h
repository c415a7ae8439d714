// One declare function per subcommand, each defined in app/cmd_<name>.cpp: it declares the
// command's options on `app` (its help is generated from them, see app/cli/cli.h) and returns
// what runs the command with the parsed values.
#pragma once
#include <string>
#include <vector>

#include "app/cli/cli.h"
#include "app/config/recipe.h"

namespace vlm::app {

CommandRun declare_train(CLI::App& app);      // app/cli/cmd_train.cpp
CommandRun declare_eval(CLI::App& app);       // app/cli/cmd_eval.cpp
CommandRun declare_plan(CLI::App& app);       // app/cli/cmd_plan.cpp
CommandRun declare_export(CLI::App& app);     // app/cli/cmd_export.cpp
CommandRun declare_score(CLI::App& app);      // app/cli/cmd_score.cpp
CommandRun declare_synth_ocr(CLI::App& app);  // app/cli/cmd_synth_ocr.cpp
CommandRun declare_inspect(CLI::App& app);    // app/cli/cmd_inspect.cpp
CommandRun declare_tokenize(CLI::App& app);   // app/cli/cmd_tokenize.cpp
CommandRun declare_launch(CLI::App& app);     // app/cli/cmd_launch.cpp (help only: see cmd_launch)
CommandRun declare_report(CLI::App& app);     // app/cli/cmd_report.cpp
CommandRun declare_recipe(CLI::App& app);     // app/cli/cmd_recipe.cpp

// `vlmtrain launch ARGS...`: the launcher's options, then the worker's command line passed
// through unchanged (app/launch/launcher.h parses them).
int cmd_launch(const std::vector<std::string>& args);

// The recipe RECIPE names with every `--set KEY=VALUE` applied.
Recipe load_recipe(const RecipeArgs& args);

}  // namespace vlm::app

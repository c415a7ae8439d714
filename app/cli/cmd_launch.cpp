// `vlmtrain launch`: spawn N workers with the torchrun environment (no Python needed).
//
// The launcher's own options come first, each with a value; the first other token starts
// the worker's command line, which is passed through unchanged (so a worker's --help or
// --set is the worker's). The options are declared once (declare_launch_options) and
// serve both the generated help and parse_launch_args (app/launch/launcher.h).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "app/cli/commands.h"
#include "app/launch/launcher.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

namespace {

// What the options hold before the checks that involve several of them.
struct LaunchArgs {
  long long nproc_per_node = 1, nnodes = 1, grace_s = 30;
  std::optional<long long> node_rank, master_port;
  std::optional<std::string> master_addr;
  std::string log_dir, run_id;
};

// "--nnodes expects an integer in [1, 65536], got '0'".
CLI::Validator in_range(const std::string& option, long long lo, long long hi) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        if (errno != 0 || end == v.c_str() || *end != '\0' || x < lo || x > hi)
          return vlm::str(option, " expects an integer in [", lo, ", ", hi, "], got '", v, "'");
        v = std::to_string(x);
        return "";
      },
      "", "");
}

// An integer option in [lo, hi]; `target` is long long or std::optional<long long>.
template <class T>
CLI::Option* add_count(CLI::App& app, const std::string& names, T& target, long long lo, long long hi,
                       const std::string& metavar, const std::string& help) {
  CLI::Option* opt = app.add_option(names, target, help)->type_name(metavar);
  return opt->transform(in_range(opt->get_name(), lo, hi));
}

// The launcher's options (torchrun's underscore spellings are accepted too).
void declare_launch_options(CLI::App& app, LaunchArgs& a) {
  app.description(R"(usage: vlmtrain launch [--nproc-per-node N] [--nnodes M --node-rank R --master-addr A
                       --master-port P] [--log-dir DIR] [train|eval] RECIPE [ARGS...]
       vlmtrain launch [launcher options] --exec PROGRAM [ARGS...]

Starts N worker processes on this node with the environment torchrun gives its workers
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RUN_ID, TORCHELASTIC_ERROR_FILE, ...). By default each worker
runs `vlmtrain train RECIPE ARGS...`; `eval` runs `vlmtrain eval`; --exec runs any program.

Worker output lines are prefixed "[rank R] ". SIGINT/SIGTERM/SIGHUP are forwarded to the
workers. When a worker fails (non-zero exit or signal) the others are stopped (SIGTERM,
then SIGKILL after the grace period) and the launcher exits 1 naming the first failing
rank, its exit code or signal, and the message from its error file. No restarts.
)");
  app.option_defaults()->group("options (before the worker command)");
  app.set_help_flag("-h,--help", "print this help and exit");
  add_count(app, "--nproc-per-node,--nproc_per_node", a.nproc_per_node, 1, 4096, "N",
            "workers on this node (default 1)");
  add_count(app, "--nnodes", a.nnodes, 1, 65536, "M", "nodes in the job, one launcher per node (default 1)");
  add_count(app, "--node-rank,--node_rank", a.node_rank, 0, 65535, "R",
            "this node's index in [0, M) (required when M > 1)");
  add_value(app, "--master-addr,--master_addr", a.master_addr, "A",
            "address of node 0 reachable from every node (required when M > 1;\n"
            "default 127.0.0.1)");
  add_count(app, "--master-port,--master_port", a.master_port, 1, 65535, "P",
            "rendezvous port on node 0 (required when M > 1; default: a free port)");
  add_value(app, "--log-dir,--log_dir", a.log_dir, "DIR",
            "keep each rank's output (DIR/rank<R>.log) and error file\n"
            "(DIR/rank<R>.error.json); default: error files in a temporary dir");
  add_value(app, "--run-id,--run_id", a.run_id, "ID", "TORCHELASTIC_RUN_ID (default \"none\")");
  add_count(app, "--grace-s", a.grace_s, 0, 3600, "S",
            "seconds between SIGTERM and SIGKILL when stopping workers\n"
            "(default 30, as torchrun; the trainer checkpoints on SIGTERM)");
  app.footer(R"(worker command (after the options):
  [train] RECIPE [ARGS...]   `vlmtrain train RECIPE ARGS...` on every worker
  eval RECIPE [ARGS...]      `vlmtrain eval RECIPE ARGS...`
  --exec PROGRAM [ARGS...]   any program
  -- ...                     ends the options (what follows is a train command line)

examples:
  vlmtrain launch --nproc-per-node 2 recipes/ocr_tiny.toml --set optim.lr=5e-4
  # two nodes (run on each, NODE_RANK = 0 or 1):
  vlmtrain launch --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 8 \
      --master-addr node0.cluster --master-port 29500 recipes/ocr_qwen.toml)");
}

}  // namespace

LaunchOptions parse_launch_args(const std::vector<std::string>& args, const std::string& self_exe) {
  std::unique_ptr<CLI::App> app_ptr = make_app("vlmtrain launch");
  CLI::App& app = *app_ptr;
  LaunchArgs a;
  declare_launch_options(app, a);
  std::vector<std::string> known;
  for (const CLI::Option* o : app.get_options())
    if (o != app.get_help_ptr())
      for (const std::string& l : o->get_lnames()) known.push_back("--" + l);

  // The launcher's options: every one takes a value (--name V or --name=V).
  std::vector<std::string> head;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--exec") break;  // the worker command starts here
    const std::string name = arg.substr(0, arg.find('='));
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      const std::string hint = did_you_mean(name, known);
      throw vlm::Error(vlm::str("vlmtrain launch: unknown option ", name,
                                hint.empty() ? "" : " (did you mean " + hint + "?)",
                                " (launcher options come before the worker command; see "
                                "`vlmtrain launch --help`)"));
    }
    head.push_back(arg);
    if (arg.find('=') == std::string::npos) {
      VLM_CHECK(i + 1 < args.size(), "vlmtrain launch: option ", name, " needs a value");
      head.push_back(args[++i]);
    }
  }
  parse_command(app, head);

  VLM_CHECK(i < args.size(), "vlmtrain launch: missing the worker command: a RECIPE, "
            "`train RECIPE`, `eval RECIPE` or `--exec PROGRAM [ARGS...]` (see `vlmtrain launch --help`)");
  LaunchOptions o;
  if (args[i] == "--exec") {
    VLM_CHECK(i + 1 < args.size(), "vlmtrain launch: --exec needs a PROGRAM");
    o.worker_argv.assign(args.begin() + i + 1, args.end());
  } else {
    o.worker_argv = {self_exe};
    if (args[i] != "train" && args[i] != "eval") o.worker_argv.push_back("train");
    o.worker_argv.insert(o.worker_argv.end(), args.begin() + i, args.end());
  }
  o.nproc_per_node = static_cast<int>(a.nproc_per_node);
  o.nnodes = static_cast<int>(a.nnodes);
  o.node_rank = static_cast<int>(a.node_rank.value_or(0));
  o.master_port = static_cast<int>(a.master_port.value_or(0));
  o.log_dir = a.log_dir;
  o.run_id = a.run_id;
  o.grace = std::chrono::milliseconds(a.grace_s * 1000);
  VLM_CHECK(!a.master_addr || !a.master_addr->empty(), "vlmtrain launch: --master-addr is empty");
  o.master_addr = a.master_addr.value_or("");

  VLM_CHECK(o.node_rank < o.nnodes, "vlmtrain launch: --node-rank must be < --nnodes, got ",
            "--node-rank ", o.node_rank, " with --nnodes ", o.nnodes);
  if (o.nnodes > 1) {
    const bool have_node_rank = a.node_rank.has_value(), have_addr = a.master_addr.has_value();
    VLM_CHECK(have_node_rank && have_addr && o.master_port != 0, "vlmtrain launch: --nnodes ",
              o.nnodes, " needs --node-rank, --master-addr and --master-port on every node ",
              "(missing:", have_node_rank ? "" : " --node-rank", have_addr ? "" : " --master-addr",
              o.master_port != 0 ? "" : " --master-port",
              "; hint: --master-addr is an address of node 0 that the other nodes can reach)");
  }
  if (o.master_addr.empty()) o.master_addr = "127.0.0.1";
  return o;
}

CommandRun declare_launch(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  declare_launch_options(app, *a);
  return [] { return 0; };  // never run: `vlmtrain launch` goes through cmd_launch
}

int cmd_launch(const std::vector<std::string>& args) {
  // --help among the launcher's own options (the worker's --help goes to the worker).
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      CommandApp cmd = make_command("launch");
      std::fputs(cmd.app->help().c_str(), stdout);
      return 0;
    }
    if (a.rfind("--", 0) != 0 || a == "--exec" || a == "--") break;
    if (a.find('=') == std::string::npos) ++i;  // skip the option's value
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  VLM_CHECK(n > 0, "vlmtrain launch: cannot find the vlmtrain binary (readlink /proc/self/exe)");
  self[n] = '\0';
  LaunchOptions o = parse_launch_args(args, self);
  return run_launcher(o);
}

}  // namespace vlm::app

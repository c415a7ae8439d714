// vlmtrain entry point: the one place errors are caught and turned into an exit code.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <exception>

#include "app/cli/cli.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/host_malloc.h"
#include "vlm/runtime/tensor_memory.h"

int main(int argc, char** argv) {
  // Line-buffered stdout even into a pipe (launchers, `tee`, log collectors), so a rank's
  // lines appear as they are printed and interleave with stderr in order.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  vlm::tune_host_malloc();  // before the first large allocation; logged by `train`
  // CPU tensor bytes (the step log's mem on CPU); VLMTRAIN_TENSOR_METER=0 keeps LibTorch's own
  // CPU allocator (mem then shows the peak RSS), e.g. to time the meter's cost.
  const char* meter = std::getenv("VLMTRAIN_TENSOR_METER");
  if (meter == nullptr || std::string(meter) != "0") vlm::TensorMemoryMeter::install();
  try {
    return vlm::app::run_cli(argc, argv);
  } catch (const vlm::Error& e) {
    std::fprintf(stderr, "vlmtrain: error: %s\n", e.what());
    vlm::app::report_fatal(e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vlmtrain: fatal: %s\n", e.what());
    vlm::app::report_fatal(e.what());
    return 2;
  }
}

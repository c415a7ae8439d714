// How one c10d process group of ParallelDims is made: Gloo bound to the interface that reaches
// the master (GLOO_SOCKET_IFNAME when set, 127.0.0.1 for a loopback master, else the local
// address of the route to the master), or NCCL with vlmtrain's environment defaults
// (apply_nccl_env_defaults, parallel_dims.h) and a timeout one minute past ours (our watchdog
// reports first). Errors become vlm::Error with `who` / `where` and a hint.
#pragma once
#include <torch/torch.h>

#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "sharding/dist/dist_env.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

// Runs `f`, turning c10 / system errors into a vlm::Error with our context and hint.
template <typename F>
auto wrap(const std::string& what, const std::string& hint, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw Error(str(what, ": ", e.what_without_backtrace(), " (hint: ", hint, ")"));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(str(what, ": ", e.what(), " (hint: ", hint, ")"));
  }
}

// A Gloo group of `size` ranks (this one `rank`) meeting through `store`.
c10::intrusive_ptr<c10d::Backend> make_gloo_group(const DistEnv& env, const ParallelOptions& opts,
                                                  const c10::intrusive_ptr<c10d::Store>& store,
                                                  const std::string& who, const std::string& where, int rank,
                                                  int size);
// An NCCL group of `size` ranks through `store` (its own communicator and stream); throws when
// this LibTorch has no NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl_group(const DistEnv& env, const ParallelOptions& opts,
                                                  const c10::intrusive_ptr<c10d::Store>& store,
                                                  const std::string& who, int rank, int size);

}  // namespace vlm::sharding

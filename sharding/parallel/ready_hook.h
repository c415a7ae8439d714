// Autograd post-hook that runs a callback when a gradient accumulator has fired: how DDP
// (bucket ready) and FSDP (shard gradient ready) learn that a parameter's gradient is final.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace vlm::sharding {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  // owner: the engine that installed the hook (remove_ready_hooks() takes only its own).
  ReadyHook(const void* owner, std::function<void()> fn) : owner_(owner), fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }
  const void* owner() const { return owner_; }

 private:
  const void* owner_;
  std::function<void()> fn_;
};

// Removes `owner`'s hooks, so a model that outlives the engine does not call into freed memory.
inline void remove_ready_hooks(const std::vector<std::shared_ptr<torch::autograd::Node>>& accumulators,
                               const void* owner) {
  for (const auto& acc : accumulators) {
    auto& hooks = acc->post_hooks();
    hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                               [owner](const std::unique_ptr<torch::autograd::FunctionPostHook>& h) {
                                 const auto* r = dynamic_cast<const ReadyHook*>(h.get());
                                 return r != nullptr && r->owner() == owner;
                               }),
                hooks.end());
  }
}

}  // namespace vlm::sharding

// Activation checkpointing (see activation_checkpoint.h).
#include "sharding/parallel/activation_checkpoint.h"

#include <ATen/core/Generator.h>

#include <atomic>

#include "vlm/runtime/check.h"

namespace vlm::sharding {

namespace {

std::atomic<int64_t> g_recomputes{0};

// What the backward needs besides x: fn, the pre-recompute hook, the forward's RNG states.
struct CheckpointState : public torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  std::function<torch::Tensor(const torch::Tensor&)> recompute;  // fn when empty
  std::function<void()> before_recompute;
  torch::Tensor cpu_rng;     // CPU generator state at forward
  c10::Device device{torch::kCPU};
  torch::Tensor device_rng;  // accelerator generator state (undefined on CPU)
  bool x_requires_grad = false;
  size_t n_params = 0;  // trainable parameters passed as inputs
};

struct RngState {
  torch::Tensor cpu, dev;
};

RngState save_rng(const c10::Device& device) {
  RngState s;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cpu = gen.get_state();
  }
  if (device.type() != torch::kCPU) {
    auto gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.dev = gen.get_state();
  }
  return s;
}

void restore_rng(const c10::Device& device, const torch::Tensor& cpu, const torch::Tensor& dev) {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(cpu);
  }
  if (device.type() != torch::kCPU && dev.defined()) {
    auto gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(dev);
  }
}

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // x: [*] the unit's input; params: the unit's trainable parameters (see the header).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               at::TensorList params, c10::intrusive_ptr<CheckpointState> st) {
    const RngState rng = save_rng(x.device());
    st->cpu_rng = rng.cpu;
    st->device_rng = rng.dev;
    st->device = x.device();
    std::vector<torch::Tensor> saved{x};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return st->fn(x);  // autograd is off inside forward: no activations kept
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    if (st->before_recompute) st->before_recompute();
    torch::Tensor xd = x.detach();
    if (st->x_requires_grad) xd.requires_grad_(true);
    torch::Tensor y;
    {
      const RngState now = save_rng(st->device);
      restore_rng(st->device, st->cpu_rng, st->device_rng);
      torch::AutoGradMode enable(true);
      y = st->recompute ? st->recompute(xd) : st->fn(xd);
      restore_rng(st->device, now.cpu, now.dev);
    }
    ++g_recomputes;
    // Gradients of x' and of the parameters, without accumulating anywhere.
    std::vector<torch::Tensor> inputs;
    if (st->x_requires_grad) inputs.push_back(xd);
    for (size_t k = 0; k < st->n_params; ++k) inputs.push_back(saved[1 + k]);
    std::vector<torch::Tensor> g(inputs.size());
    if (y.requires_grad() && grads[0].defined())
      g = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                /*allow_unused=*/true);
    torch::autograd::variable_list out;  // x, params..., state
    out.push_back(st->x_requires_grad ? g[0] : torch::Tensor());
    for (size_t k = 0; k < st->n_params; ++k) out.push_back(g[(st->x_requires_grad ? 1 : 0) + k]);
    out.push_back(torch::Tensor());
    return out;
  }
};

}  // namespace

torch::Tensor checkpoint_unit(const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                              std::function<torch::Tensor(const torch::Tensor&)> fn,
                              std::function<void()> before_recompute,
                              std::function<torch::Tensor(const torch::Tensor&)> recompute) {
  VLM_CHECK(x.defined(), "activation checkpointing: the unit's input is undefined");
  std::vector<torch::Tensor> trainable;
  for (const auto& p : params)
    if (p.requires_grad()) trainable.push_back(p);
  if (!torch::GradMode::is_enabled() || (!x.requires_grad() && trainable.empty())) return fn(x);
  auto st = c10::make_intrusive<CheckpointState>();
  st->fn = std::move(fn);
  st->before_recompute = std::move(before_recompute);
  st->recompute = std::move(recompute);
  st->x_requires_grad = x.requires_grad();
  st->n_params = trainable.size();
  return CheckpointFunction::apply(x, at::TensorList(trainable), st);
}

int64_t checkpoint_recomputes() { return g_recomputes.load(); }

}  // namespace vlm::sharding

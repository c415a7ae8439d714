// Planned step memory (see step_memory.h).
#include "app/plan/step_memory.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace vlm::app {

double cublas_workspace_bytes(int sm_major) {
  if (const char* cfg = std::getenv("CUBLAS_WORKSPACE_CONFIG"); cfg != nullptr && *cfg != '\0') {
    // ":4096:8" or ":4096:2:16:8": pairs of (KiB, count).
    std::vector<double> nums;
    for (const char* p = cfg; *p != '\0';) {
      if (*p == ':') {
        ++p;
        continue;
      }
      char* end = nullptr;
      nums.push_back(std::strtod(p, &end));
      if (end == p) break;
      p = end;
    }
    double bytes = 0;
    for (size_t i = 0; i + 1 < nums.size(); i += 2) bytes += nums[i] * 1024 * nums[i + 1];
    return bytes;
  }
  return sm_major >= 9 ? 4096.0 * 1024 * 8 : 4096.0 * 1024 * 2 + 16.0 * 1024 * 8;
}

double cublaslt_workspace_bytes() {
  if (const char* u = std::getenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE"); u != nullptr && std::string(u) == "1") return 0;
  if (const char* kib = std::getenv("CUBLASLT_WORKSPACE_SIZE"); kib != nullptr && *kib != '\0')
    return std::strtod(kib, nullptr) * 1024;
  return 1024.0 * 1024;
}

double training_blas_workspace_bytes(int sm_major) {
  return kTrainingBlasWorkspaces * (cublas_workspace_bytes(sm_major) + cublaslt_workspace_bytes());
}

StepMemoryModel::StepMemoryModel(vlm::VisionLanguageModelImpl& model, const vlm::app::MemoryPlan& plan,
                                 const std::vector<vlm::sharding::UnitPlan>& units, torch::Dtype param_dtype,
                                 vlm::app::AttentionPath path, int64_t prefetch_samples)
    : model_(&model), dtype_(param_dtype), path_(path) {
  step_grads_ = plan.backward_grad_bytes + plan.unsharded_accum_bytes;
  persistent_ = plan.total.total() - plan.backward_grad_bytes;
  gathered_ = plan.gathered_peak_bytes;
  reduce_ = plan.reduce_scatter_peak_bytes;
  // On the CPU the device is the host: the offloaded optimizer state and the loader's
  // decoded samples are in the same memory.
  if (path == vlm::app::AttentionPath::cpu) {
    persistent_ += plan.total.host_optim_bytes;
    prefetch_samples_ = prefetch_samples;
  } else {
    workspace_ = training_blas_workspace_bytes();
  }
  const double p = static_cast<double>(c10::elementSize(param_dtype));
  for (const auto& u : units) {
    if (u.checkpointed) checkpointed_.push_back(u.path);
    if (u.trainable()) grads_ = std::max(grads_, p * static_cast<double>(u.numel));
  }
}

vlm::app::MicroBatchShape StepMemoryModel::shape_of(const vlm::collate::MicroBatch& mb) {
  const auto& b = mb.batch;
  vlm::app::MicroBatchShape s;
  s.rows = b.input_ids.size(0);
  s.seq_len = b.input_ids.size(1);
  s.patches = b.pixel_values.defined() ? b.pixel_values.size(0) : 0;
  s.loss_rows = mb.supervised_tokens;
  s.packed = b.text_cu_seqlens.defined();
  if (s.packed) s.samples = b.text_cu_seqlens.numel() - 1;
  return s;
}

double StepMemoryModel::input_bytes(const vlm::app::MicroBatchShape& s) const {
  const auto& v = model_->cfg.vision;
  const double tokens = static_cast<double>(s.tokens());
  const double image_rows = static_cast<double>(s.patches / std::max<int64_t>(1, v.merge_unit()));
  return tokens * (3 + 3) * 8 + static_cast<double>(s.loss_rows) * 8 + image_rows * 8 +
         static_cast<double>(s.patches) * static_cast<double>(v.patch_dim()) *
             static_cast<double>(c10::elementSize(dtype_));
}

void StepMemoryModel::add_activations(StepMemory& m, const vlm::app::MicroBatchShape& shape) const {
  const auto plan = vlm::app::plan_activations(*model_, shape, dtype_, path_);
  auto ckpt = [this](const std::string& path) {
    return std::find(checkpointed_.begin(), checkpointed_.end(), path) != checkpointed_.end();
  };
  const double others = m.in_flight > 1 ? static_cast<double>(m.in_flight - 1) * plan.forward_bytes(ckpt) : 0.0;
  m.act_head = std::max(m.act_head, plan.head_peak_bytes(ckpt) + others);
  m.act_units = std::max(m.act_units, plan.units_peak_bytes(ckpt) + others);
}

StepMemory StepMemoryModel::base(int64_t micro_batches) const {
  StepMemory m;
  m.persistent = persistent_;
  m.gathered = gathered_;
  m.reduce = reduce_;
  m.grads = grads_;
  m.step_grads = step_grads_;
  m.micro_batches = micro_batches;
  const vlm::PipelineStage& stage = model_->pipeline_stage();  // 1F1B: min(pp - s, m)
  m.in_flight = std::max<int64_t>(1, std::min(stage.count - stage.index, micro_batches));
  m.workspace = workspace_;
  return m;
}

void StepMemoryModel::add_loader_window(StepMemory& m, int64_t samples) const {
  if (samples > 0) m.persistent += m.inputs * static_cast<double>(prefetch_samples_) / static_cast<double>(samples);
}

StepMemory StepMemoryModel::step(const std::vector<vlm::collate::MicroBatch>& micro_batches) const {
  StepMemory m = base(static_cast<int64_t>(micro_batches.size()));
  int64_t samples = 0;
  for (const auto& mb : micro_batches) {
    vlm::app::MicroBatchShape s = shape_of(mb);
    s.cp = cp_;
    s.cp_ring = cp_ring_;
    m.inputs += input_bytes(s);
    add_activations(m, s);
    samples += static_cast<int64_t>(mb.indices.size());
  }
  add_loader_window(m, samples);
  return m;
}

StepMemory StepMemoryModel::step(const vlm::app::MicroBatchShape& shape, int64_t count, int64_t samples) const {
  StepMemory m = base(count);
  m.inputs = static_cast<double>(count) * input_bytes(shape);
  add_activations(m, shape);
  add_loader_window(m, samples);
  return m;
}

}  // namespace vlm::app

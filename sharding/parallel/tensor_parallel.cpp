#include "sharding/parallel/tensor_parallel.h"

#include <map>
#include <utility>

#include "sharding/parallel/context_parallel.h"
#include "vlm/model/tensor_parallel.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

std::string tensor_parallel_problem(const vlm::VlmConfig& cfg, int64_t tp) {
  return vlm::tensor_parallel_problem(cfg.text, tp);
}

int64_t tensor_parallel_sharing(const vlm::VlmConfig& cfg, const std::string& name, int64_t tp) {
  const vlm::TpSplit split = vlm::tensor_parallel_split(cfg, name, tp);
  if (!split.split()) return 1;
  return split.parts == tp ? 0 : split.parts;
}

void apply_tensor_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims) {
  if (dims.tp() == 1) return;
  const auto& cfg = model.cfg;
  const std::string problem = tensor_parallel_problem(cfg, dims.tp());
  VLM_CHECK(problem.empty(), "dist.tp = ", dims.tp(), ": ", problem,
            " (hint: tensor parallelism gives each rank heads / tp heads, intermediate_size / tp MLP channels and "
            "vocab_size / tp vocabulary rows; pick a tp that divides them)");
  VLM_CHECK(cfg.text.tensor_parallel == dims.tp(), "dist.tp = ", dims.tp(), " but the model was built for tp = ",
            cfg.text.tensor_parallel, " (hint: set cfg.text.tensor_parallel before building the model)");
  for (const auto& p : model.named_parameters())
    VLM_CHECK(p.key().find("lora_") == std::string::npos, "dist.tp = ", dims.tp(), ": parameter ", p.key(),
              " is a LoRA adapter; LoRA with tensor parallelism is not built yet (hint: tp 1, or full fine-tuning)");
  model.set_tensor_exchange(comm_sequence_exchange(dims.tp_comm(), vlm::SequenceMode::kUlysses));
}

namespace {

// Rank r's slices of a full source (tensor_parallel_source). A split parameter's slice is
// built whole at its first fill (split along dim 0: the blocks' row ranges read directly;
// along dim 1: the whole tensor read, then sliced) and kept until another parameter is asked
// for: sharded loading asks for each parameter's ranges in order.
class TensorParallelSource : public vlm::ParamSource {
 public:
  TensorParallelSource(std::unique_ptr<vlm::ParamSource> full, vlm::VlmConfig cfg,
                       std::map<std::string, std::vector<int64_t>> shapes, int64_t rank, int64_t tp)
      : full_(std::move(full)), cfg_(std::move(cfg)), shapes_(std::move(shapes)), rank_(rank), tp_(tp) {
    cfg_.text.tensor_parallel = 1;
  }

  void fill(const std::string& name, int64_t lo, int64_t hi, torch::Tensor out) override {
    const vlm::TpSplit split = vlm::tensor_parallel_split(cfg_, name, tp_);
    if (!split.split()) {
      full_->fill(name, lo, hi, out);
      bytes_read_ = full_->bytes_read();
      return;
    }
    if (name != cached_name_) {
      cached_ = slice_of(name, split, out.options());
      cached_name_ = name;
    }
    VLM_CHECK(hi <= cached_.numel(), "tensor parallel source: ", name, " has ", cached_.numel(),
              " elements in rank ", rank_, "'s slice, asked for up to ", hi);
    out.copy_(cached_.view({-1}).narrow(0, lo, hi - lo));
  }

  std::string describe() const override {
    return full_->describe() + vlm::str(" (tensor-parallel slice ", rank_, " of ", tp_, ")");
  }

  void drop_resident_pages() override {
    full_->drop_resident_pages();
    cached_ = torch::Tensor();
    cached_name_.clear();
  }

 private:
  torch::Tensor slice_of(const std::string& name, const vlm::TpSplit& split, const torch::TensorOptions& opts) {
    const auto it = shapes_.find(name);
    VLM_CHECK(it != shapes_.end(), "tensor parallel source: no full shape for parameter ", name);
    const std::vector<int64_t>& shape = it->second;
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    torch::Tensor slice;
    if (split.dim == 0) {  // each block's rows [off + i * b / parts, + b / parts): contiguous elements
      const int64_t row = shape[0] > 0 ? numel / shape[0] : 0;
      std::vector<int64_t> local = shape;
      local[0] = shape[0] / split.parts;
      slice = torch::empty(local, opts);
      int64_t off = 0, at = 0;
      for (int64_t b : split.blocks) {
        const int64_t rows = b / split.parts, first = off + split.piece(rank_, tp_) * rows;
        full_->fill(name, first * row, (first + rows) * row, slice.view({-1}).narrow(0, at * row, rows * row));
        off += b;
        at += rows;
      }
    } else {
      torch::Tensor whole = torch::empty(shape, opts);
      full_->fill(name, 0, numel, whole.view({-1}));
      slice = vlm::tp_slice(whole, split, rank_, tp_);
    }
    bytes_read_ = full_->bytes_read();
    return slice;
  }

  std::unique_ptr<vlm::ParamSource> full_;
  vlm::VlmConfig cfg_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  int64_t rank_, tp_;
  std::string cached_name_;
  torch::Tensor cached_;
};

}  // namespace

std::unique_ptr<vlm::ParamSource> tensor_parallel_source(std::unique_ptr<vlm::ParamSource> full,
                                                         const vlm::VlmConfig& cfg,
                                                         std::map<std::string, std::vector<int64_t>> shapes,
                                                         int64_t rank, int64_t tp) {
  if (tp <= 1) return full;
  return std::make_unique<TensorParallelSource>(std::move(full), cfg, std::move(shapes), rank, tp);
}

double tensor_parallel_layer_bytes(const vlm::TextConfig& cfg, bool sparse, int64_t tp, int64_t batch, int64_t padded,
                                   int64_t b, bool recomputed) {
  if (tp <= 1) return 0;
  const double act = static_cast<double>(batch) * static_cast<double>(padded) * static_cast<double>(cfg.hidden_size) *
                     static_cast<double>(b);
  const double pair = 2.0 * static_cast<double>(tp - 1) / static_cast<double>(tp) * act;  // all-gather + reduce-scatter
  const double forward = sparse ? pair : 2 * pair;
  return forward * (recomputed ? 2.0 : 1.0) + forward;  // backward: each op's reverse
}

}  // namespace vlm::sharding

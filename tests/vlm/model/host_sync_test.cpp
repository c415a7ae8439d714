// The training step's forward and backward issue no operator that makes the host wait for
// a GPU (docs/design.md: one host sync per step, the step statistics). On CUDA the sync
// debug mode catches them (host_sync_cuda_test.cpp); here, on the CPU, every ATen operator
// the model runs is recorded (at::RecordFunction) for a batch as collate builds it (right
// padded, position ids, loss rows and image rows from the host) and the ones whose result
// the host must read back are refused: item / _local_scalar_dense, nonzero, masked_select
// (also masked_scatter's backward), is_nonzero, equal, unique. Every tiny family, with
// images and text-only (the dummy image).
#include <gtest/gtest.h>

#include <ATen/record_function.h>

#include <mutex>
#include <set>
#include <string>

#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/rope_index.h"
#include "vlm/model/vision_language_model.h"
#include "tests/vlm/model/host_sync_testing.h"

namespace {

using vlm::Batch;

const std::set<std::string>& syncing_ops() {
  static const std::set<std::string> ops = {"aten::item",       "aten::_local_scalar_dense", "aten::nonzero",
                                            "aten::masked_select", "aten::is_nonzero",      "aten::equal",
                                            "aten::_unique2",   "aten::unique_consecutive", "aten::unique_dim"};
  return ops;
}

// Records the names of the ATen operators run (any thread) while alive.
class OpRecorder {
 public:
  OpRecorder() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(
                                        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                          std::lock_guard<std::mutex> lock(mu());
                                          if (active()) seen().insert(fn.name());
                                          return nullptr;
                                        })
                                        .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    std::lock_guard<std::mutex> lock(mu());
    seen().clear();
    active() = true;
  }
  ~OpRecorder() {
    {
      std::lock_guard<std::mutex> lock(mu());
      active() = false;
    }
    at::removeCallback(handle_);
  }
  std::set<std::string> syncing() const {
    std::lock_guard<std::mutex> lock(mu());
    std::set<std::string> out;
    for (const auto& n : seen())
      if (syncing_ops().count(n)) out.insert(n);
    return out;
  }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mu());
    return seen().size();
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::set<std::string>& seen() {
    static std::set<std::string> s;
    return s;
  }
  static bool& active() {
    static bool a = false;
    return a;
  }
  at::CallbackHandle handle_;
};

}  // namespace

// The recorder itself: a masked_select (data-dependent shape) is seen and refused.
TEST(HostSyncRecorder, SeesASyncingOperator) {
  std::set<std::string> bad;
  {
    OpRecorder rec;
    auto x = torch::arange(6.0);
    (void)x.masked_select(x > 2.0);
    bad = rec.syncing();
  }
  EXPECT_EQ(bad.count("aten::masked_select"), 1u);  // (it reads its count back: item too)
}

namespace {

class HostSync : public ::testing::TestWithParam<std::string> {};

TEST_P(HostSync, TrainingForwardAndBackwardRunNoSyncingOperator) {
  vlm::VisionLanguageModel m(vlm::preset(GetParam()), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 1});
  m->train();
  for (bool images : {true, false}) {
    SCOPED_TRACE(images ? "with images" : "text only");
    const Batch b = vlm::test::collate_like_batch(m->cfg, images);
    m->zero_grad();
    std::set<std::string> bad;
    size_t ops = 0;
    {
      OpRecorder rec;
      auto out = m->forward(b);
      out.loss_sum.backward();
      bad = rec.syncing();
      ops = rec.count();
    }
    EXPECT_GT(ops, 20u) << "the recorder saw almost nothing: is RecordFunction enabled?";
    std::string names;
    for (const auto& n : bad) names += n + " ";
    EXPECT_TRUE(bad.empty()) << "operators that read device results back on the host: " << names;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HostSync,
                         ::testing::Values("tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (ch == '.' || ch == '-') ch = '_';
                           return s;
                         });

}  // namespace

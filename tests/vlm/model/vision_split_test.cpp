// The vision tower's split over a context-parallel group (vlm/model/vision_split.h), its host
// side: which rows each rank holds (whole merge groups, padding past the patches as zero rows),
// the padding's own attention segment, and when the tower stays whole (heads not dividing by
// cp, no group). The split's numerics (every vision gradient equal to one process, cp 2 and 4,
// with patch counts not a multiple of cp x merge^2 and a 4-patch dummy image that leaves
// ranks with padding only) are tests/sharding/parallel/context_parallel_dist_test.cpp's.
#include <gtest/gtest.h>

#include "vlm/model/vision_split.h"

namespace vision_split_test {

// Only the group's shape matters here: no exchange is issued.
class ShapeOnly : public vlm::SequenceExchange {
 public:
  ShapeOnly(int64_t cp, int64_t rank) : cp_(cp), rank_(rank) {}
  int64_t size() const override { return cp_; }
  int64_t rank() const override { return rank_; }
  vlm::SequenceMode mode() const override { return vlm::SequenceMode::kUlysses; }
  torch::Tensor all_to_all(const torch::Tensor&, const std::string&) override {
    ADD_FAILURE() << "no exchange expected";
    return {};
  }
  torch::Tensor ring_pass(const torch::Tensor&, const std::string&) override {
    ADD_FAILURE() << "no exchange expected";
    return {};
  }

 private:
  int64_t cp_, rank_;
};

TEST(VisionSplit, RanksHoldWholeMergeGroupsAndZeroPadding) {
  const int64_t patches = 12, unit = 4, cp = 4;  // padded to 16: rank 3 holds padding only
  auto x = torch::arange(patches * 2, torch::kFloat32).view({patches, 2}) + 1;  // no zero row
  auto order = torch::arange(patches - 1, -1, -1, torch::kInt64);              // reversed rows
  std::vector<torch::Tensor> got, got_ordered;
  for (int64_t r = 0; r < cp; ++r) {
    ShapeOnly ex(cp, r);
    const auto s = vlm::vision_split(&ex, patches, unit, /*heads=*/8);
    ASSERT_TRUE(s.active());
    EXPECT_EQ(s.padded, 16);
    EXPECT_EQ(s.len, 4);
    EXPECT_EQ(s.begin, 4 * r);
    EXPECT_EQ(s.len % unit, 0) << "merge groups stay whole";
    got.push_back(s.rows(x));
    got_ordered.push_back(s.rows(x, order));
    EXPECT_EQ(s.segments({0, 4, 12}), (std::vector<int64_t>{0, 4, 12, 16})) << "padding: a segment of its own";
  }
  auto all = torch::cat(got, 0), all_ordered = torch::cat(got_ordered, 0);
  EXPECT_TRUE(torch::equal(all.narrow(0, 0, patches), x));
  EXPECT_TRUE(torch::equal(all_ordered.narrow(0, 0, patches), x.index_select(0, order)));
  EXPECT_TRUE(torch::equal(all.narrow(0, patches, 4), torch::zeros({4, 2})));
  EXPECT_TRUE(torch::equal(got[3], torch::zeros({4, 2}))) << "a rank of padding only";
}

TEST(VisionSplit, TowerStaysWholeWhenItsHeadsDoNotDivideOrNoGroup) {
  auto x = torch::randn({8, 3});
  ShapeOnly four(4, 1), one(1, 0);
  for (const auto& s : {vlm::vision_split(&four, 8, 4, /*heads=*/6), vlm::vision_split(&one, 8, 4, 6),
                        vlm::vision_split(nullptr, 8, 4, 6)}) {
    EXPECT_FALSE(s.active());
    EXPECT_EQ(s.len, 8);
    EXPECT_TRUE(torch::equal(s.rows(x), x));
    EXPECT_EQ(s.segments({0, 8}), (std::vector<int64_t>{0, 8}));
    EXPECT_TRUE(torch::equal(s.gather(x, "test"), x));
  }
  EXPECT_TRUE(vlm::vision_splits(16, 4));
  EXPECT_FALSE(vlm::vision_splits(6, 4));
  EXPECT_FALSE(vlm::vision_splits(16, 1));
}

}  // namespace vision_split_test

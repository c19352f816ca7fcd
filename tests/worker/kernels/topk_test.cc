#include "worker/kernels/topk.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::kernels {
namespace {

using ::testing::ElementsAre;

// Plain reference: sort all nonzero positions by (|x| desc, index asc).
sparse::SparseBlock SortReference(const std::vector<float>& x, size_t k,
                                  uint32_t base) {
  std::vector<uint32_t> order;
  for (uint32_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0.0f) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  if (order.size() > k) order.resize(k);
  std::sort(order.begin(), order.end());
  sparse::SparseBlock out;
  for (uint32_t i : order) out.push_back(base + i, x[i]);
  return out;
}

std::vector<float> Values(size_t n, uint64_t seed, int distinct) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  if (distinct > 0) {
    // Heavy ties: few distinct magnitudes, both signs.
    std::uniform_int_distribution<int> pick(-distinct, distinct);
    for (float& v : x) v = static_cast<float>(pick(rng));
  } else {
    std::normal_distribution<float> normal;
    for (float& v : x) v = normal(rng);
  }
  return x;
}

TEST(TopKTest, MatchesSortReferenceOnRandomAndTiedInputs) {
  for (size_t n : {1u, 2u, 17u, 1000u, 4099u}) {
    for (int distinct : {0, 1, 3, 50}) {
      const std::vector<float> x = Values(n, n * 31 + distinct, distinct);
      for (size_t k : {size_t{0}, size_t{1}, n / 100, n / 3, n - 1, n, n + 5}) {
        EXPECT_EQ(TopKAbs(x, k, 100), SortReference(x, k, 100))
            << "n=" << n << " distinct=" << distinct << " k=" << k;
      }
    }
  }
}

TEST(TopKTest, TiesGoToTheLowerIndex) {
  const std::vector<float> x = {1.0f, -2.0f, 2.0f, -1.0f, 2.0f};
  const sparse::SparseBlock top = TopKAbs(x, 2, 0);
  EXPECT_THAT(top.indices, ElementsAre(1, 2));
  EXPECT_THAT(top.values, ElementsAre(-2.0f, 2.0f));
}

TEST(TopKTest, NeverSelectsZeros) {
  const std::vector<float> x = {0.0f, -0.0f, 3.0f, 0.0f};
  EXPECT_THAT(TopKAbs(x, 3, 0).indices, ElementsAre(2));
  EXPECT_TRUE(TopKAbs(std::vector<float>(10, 0.0f), 4, 0).empty());
  EXPECT_TRUE(TopKAbs({}, 4, 0).empty());
}

TEST(TopKTest, HandlesNegativeAndDenormalValues) {
  const float denormal = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {-5.0f, denormal, -denormal * 3, 4.0f, -1e30f};
  const sparse::SparseBlock top = TopKAbs(x, 4, 7);
  EXPECT_THAT(top.indices, ElementsAre(7, 9, 10, 11));
  EXPECT_EQ(top, SortReference(x, 4, 7));
}

TEST(TopKTest, SplitKeepsTheTopAndDropsTheRest) {
  const sparse::SparseBlock block{{2, 5, 8, 9}, {1.0f, -4.0f, 0.0f, 3.0f}};
  sparse::SparseBlock kept, dropped;
  SplitTopKAbs(block, 2, &kept, &dropped);
  EXPECT_THAT(kept.indices, ElementsAre(5, 9));
  EXPECT_THAT(dropped.indices, ElementsAre(2, 8));
  EXPECT_EQ(sparse::Add(kept, dropped), block);
  SplitTopKAbs(block, 10, &kept, &dropped);
  EXPECT_THAT(kept.indices, ElementsAre(2, 5, 9));  // the zero is dropped
  SplitTopKAbs(block, 0, &kept, &dropped);
  EXPECT_TRUE(kept.empty());
  EXPECT_EQ(dropped, block);
}

}  // namespace
}  // namespace gradmesh::kernels

namespace gradmesh::kernels {
namespace {

TEST(ThresholdTest, SelectsEveryNonzeroAtOrAboveTheThreshold) {
  const std::vector<float> x = {0.5f, -2.0f, 0.0f, 2.0f, -0.25f, 1.0f};
  const sparse::SparseBlock s = SelectAbsAtLeast(x, 1.0f, 10);
  EXPECT_THAT(s.indices, ::testing::ElementsAre(11, 13, 15));
  EXPECT_THAT(s.values, ::testing::ElementsAre(-2.0f, 2.0f, 1.0f));
  EXPECT_EQ(SelectAbsAtLeast(x, 0.0f, 0).size(), 5u);  // zeros never
}

TEST(ThresholdTest, KthLargestIsTheTopKThreshold) {
  const std::vector<float> x = Values(5000, 3, 0);
  for (size_t k : {1u, 7u, 50u, 4999u}) {
    const float th = KthLargestAbs(x, k);
    EXPECT_EQ(SelectAbsAtLeast(x, th, 0), TopKAbs(x, k, 0)) << k;
  }
  EXPECT_EQ(KthLargestAbs(x, 0), std::numeric_limits<float>::infinity());
  EXPECT_EQ(KthLargestAbs({0.0f, -3.0f}, 5), 3.0f);
  EXPECT_EQ(KthLargestAbs({0.0f}, 1), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace gradmesh::kernels

namespace gradmesh::kernels {
namespace {

TEST(SegmentedTopKTest, SelectsPerSegmentIncludingEdgeCases) {
  const std::vector<float> x = Values(1000, 11, 5);  // ties
  const std::vector<sparse::IndexRange> segments = {
      {0, 100}, {100, 100}, {100, 400}, {400, 1000}, {1000, 1000}};
  const std::vector<uint64_t> quotas = {7, 3, 0, 10000, 2};
  const std::vector<sparse::SparseBlock> out =
      SegmentedTopKAbs(x, segments, quotas, 50);
  ASSERT_EQ(out.size(), segments.size());
  for (size_t s = 0; s < segments.size(); ++s) {
    const std::vector<float> part(x.begin() + segments[s].begin,
                                  x.begin() + segments[s].end);
    EXPECT_EQ(out[s],
              SortReference(part, quotas[s],
                            50 + static_cast<uint32_t>(segments[s].begin)))
        << "segment " << s;
  }
  EXPECT_TRUE(out[1].empty());
  EXPECT_TRUE(out[2].empty());
  EXPECT_TRUE(out[4].empty());
}

// Values that share their top key bits (the radix select's boundary bin)
// and differ only in the low bits, plus denormals and exact ties.
TEST(TopKTest, ResolvesTheBoundaryBinExactly) {
  std::vector<float> x;
  for (int i = 0; i < 5000; ++i) {
    x.push_back(std::bit_cast<float>(0x3f800000u + (i * 7919u) % 4096u) *
                (i % 2 ? -1.0f : 1.0f));
  }
  for (int i = 0; i < 300; ++i) {
    x.push_back(std::numeric_limits<float>::denorm_min() * (i % 17));
  }
  for (size_t k : {1u, 10u, 2500u, 4999u, 5000u, 5100u, 6000u}) {
    EXPECT_EQ(TopKAbs(x, k, 0), SortReference(x, k, 0)) << k;
  }
}

TEST(TopKTest, ParallelPathMatchesTheReference) {
  // Above the size where selection splits over threads.
  std::vector<float> x = Values(3'000'001, 21, 0);
  for (size_t i = 0; i < x.size(); i += 3) x[i] = std::round(x[i] * 4) / 4;
  for (size_t k : {1u, 30000u, 1000000u}) {
    EXPECT_EQ(TopKAbs(x, k, 0), SortReference(x, k, 0)) << k;
  }
}

}  // namespace
}  // namespace gradmesh::kernels

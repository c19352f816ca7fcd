// Top-k over 100M values, bounded in time and memory (about 0.9 GB): checked
// by properties in one pass, since a sort-based reference would not be.
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "worker/kernels/topk.h"

namespace gradmesh::kernels {
namespace {

TEST(TopKLargeTest, HundredMillionValues) {
  constexpr size_t kN = 100'000'000;
  constexpr size_t kK = 1'000'000;
  std::vector<float> x(kN);
  uint64_t state = 7;
  for (float& v : x) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    // Coarse values (256 magnitudes) so that ties at the threshold abound.
    v = static_cast<float>(static_cast<int>(state >> 56) - 128) / 16.0f;
  }
  const sparse::SparseBlock top = TopKAbs(x, kK, 0);
  ASSERT_EQ(top.size(), kK);
  ASSERT_TRUE(sparse::Validate(top, {0, kN}).ok());
  float threshold = INFINITY;
  for (float v : top.values) {
    ASSERT_NE(v, 0.0f);
    threshold = std::min(threshold, std::fabs(v));
  }
  // Everything left out is no larger than the threshold, and the ties at the
  // threshold that were taken are the lowest-indexed ones.
  size_t j = 0;
  bool tie_skipped = false;
  for (size_t i = 0; i < kN; ++i) {
    const bool taken = j < top.size() && top.indices[j] == i;
    if (taken) {
      ASSERT_EQ(top.values[j], x[i]);
      ++j;
      if (std::fabs(x[i]) == threshold) {
        ASSERT_FALSE(tie_skipped) << i;
      }
    } else {
      ASSERT_LE(std::fabs(x[i]), threshold) << i;
      if (std::fabs(x[i]) == threshold) tie_skipped = true;
    }
  }
}

}  // namespace
}  // namespace gradmesh::kernels

// Parity of the CUDA top-k with the CPU one. Skips where there is no device.
#include "worker/kernels/topk_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/kernels/cuda_device.h"
#include "worker/kernels/force_cuda.h"
#include "worker/kernels/topk.h"

namespace gradmesh::kernels {
namespace {

class CudaTopKTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << CudaDeviceDescription();
  }
};

std::vector<float> Values(size_t n, uint64_t seed, bool ties) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = ties ? std::round(normal(rng) * 4) / 4 : normal(rng);
  return x;
}

TEST_F(CudaTopKTest, MatchesTheCpuOnRandomAndTiedSegments) {
  for (size_t n : {1u, 1000u, 65537u, 3'000'001u}) {
    for (bool ties : {false, true}) {
      const std::vector<float> x = Values(n, n + ties, ties);
      float* device = nullptr;
      ASSERT_EQ(cudaMalloc(&device, n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(device, x.data(), n * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      auto topk = CudaTopK::Create(n);
      ASSERT_TRUE(topk.ok()) << topk.status();
      const std::vector<TopKSegment> segments = {{0, n / 3, n / 100 + 1},
                                                 {n / 3, n / 3, 5},
                                                 {n / 3, n, 0},
                                                 {n / 3, n, n / 50 + 2},
                                                 {0, n, n}};
      auto got = (*topk)->SegmentedTopKAbs(device, n, segments, 7);
      ASSERT_TRUE(got.ok()) << got.status();
      for (size_t s = 0; s < segments.size(); ++s) {
        const auto span = absl::MakeConstSpan(x).subspan(
            segments[s].begin, segments[s].end - segments[s].begin);
        const sparse::SparseBlock want =
            TopKAbs(span, segments[s].quota,
                    7 + static_cast<uint32_t>(segments[s].begin));
        EXPECT_EQ((*got)[s].indices, want.indices) << "n=" << n << " s=" << s;
        EXPECT_EQ((*got)[s].values, want.values) << "n=" << n << " s=" << s;
      }
      cudaFree(device);
    }
  }
}

TEST_F(CudaTopKTest, ForcedDevicePathAgreesThroughTheCpuInterface) {
  const std::vector<float> x = Values(2'000'000, 3, true);
  const sparse::SparseBlock cpu = TopKAbs(x, 20000, 0);
  ASSERT_TRUE(ForceCudaTopK().ok());
  const sparse::SparseBlock gpu = TopKAbs(x, 20000, 0);
  SetTopKPositionsForTesting(nullptr);
  EXPECT_EQ(gpu, cpu);
}

}  // namespace
}  // namespace gradmesh::kernels

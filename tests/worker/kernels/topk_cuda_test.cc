// Parity of the CUDA top-k with the CPU one. Skips where there is no device.
#include "worker/kernels/topk_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
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

// A device copy of `x`, freed when it goes out of scope; ok() is false when
// it could not be made.
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<float>& x) {
    ok_ = cudaMalloc(&data_, std::max<size_t>(x.size(), 1) * sizeof(float)) ==
              cudaSuccess &&
          cudaMemcpy(data_, x.data(), x.size() * sizeof(float),
                     cudaMemcpyHostToDevice) == cudaSuccess;
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  bool ok() const { return ok_; }
  const float* data() const { return data_; }

 private:
  float* data_ = nullptr;
  bool ok_ = false;
};

// Every segment's device selection equals the CPU's TopKAbs.
void ExpectParity(const std::vector<float>& x,
                  const std::vector<TopKSegment>& segments,
                  const std::string& what) {
  const DeviceArray device(x);
  ASSERT_TRUE(device.ok()) << what << ": no device copy of " << x.size();
  size_t longest = 1;
  for (const TopKSegment& s : segments) {
    longest = std::max<size_t>(longest, s.end - s.begin);
  }
  auto topk = CudaTopK::Create(longest);
  ASSERT_TRUE(topk.ok()) << topk.status();
  auto got = (*topk)->SegmentedTopKAbs(device.data(), x.size(), segments, 3);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t s = 0; s < segments.size(); ++s) {
    const auto span = absl::MakeConstSpan(x).subspan(
        segments[s].begin, segments[s].end - segments[s].begin);
    const sparse::SparseBlock want = TopKAbs(
        span, segments[s].quota, 3 + static_cast<uint32_t>(segments[s].begin));
    ASSERT_EQ((*got)[s].indices, want.indices) << what << " segment " << s;
    ASSERT_EQ((*got)[s].values, want.values) << what << " segment " << s;
  }
}

TEST_F(CudaTopKTest, SelectsNothingFromZerosOfEitherSign) {
  std::vector<float> x(1'000'003, 0.0f);
  for (size_t i = 0; i < x.size(); i += 3) x[i] = -0.0f;
  ExpectParity(x, {{0, x.size(), 10}, {0, x.size(), x.size()}}, "zeros");
  x[777] = -1e-3f;  // one nonzero among them: it alone is selected
  ExpectParity(x, {{0, x.size(), 10}}, "one nonzero");
}

TEST_F(CudaTopKTest, OrdersDenormalsByMagnitudeWithTiesToTheLowerIndex) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> x(300'001);
  for (size_t i = 0; i < x.size(); ++i) {
    // Denormals 1..63 times the smallest, both signs, many ties; a few
    // normal values above them.
    x[i] = (i % 2 ? -tiny : tiny) * static_cast<float>(i % 64);
    if (i % 10007 == 0) x[i] = 1e-30f * static_cast<float>(i % 5 + 1);
  }
  for (uint64_t k : {1, 20, 4'700, 150'000, 300'001}) {
    ExpectParity(x, {{0, x.size(), k}, {5, 70'000, k / 3}},
                 "denormals k=" + std::to_string(k));
    if (HasFatalFailure()) return;
  }
}

// Many equal magnitudes (clipped gradients), infinities among them, and
// fewer nonzeros than k: ties go to the lower index, and every nonzero is
// taken when there are too few.
TEST_F(CudaTopKTest, EqualMagnitudesInfinitiesAndTooFewNonzeros) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(1'000'003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 2 ? 0.5f : -0.5f;
  ExpectParity(x, {{0, x.size(), 10}, {3, 900'000, 123'457}}, "all equal");
  if (HasFatalFailure()) return;
  x[77] = -inf;
  x[500'000] = inf;
  ExpectParity(x, {{0, x.size(), 1}, {0, x.size(), 5'000}}, "infinities");
  if (HasFatalFailure()) return;
  std::fill(x.begin(), x.end(), 0.0f);
  x[9] = 2.0f;
  x[999'999] = -inf;
  ExpectParity(x, {{0, x.size(), 3}, {0, x.size(), 1}}, "too few nonzeros");
}

TEST_F(CudaTopKTest, ManySegmentsOfEveryLength) {
  const std::vector<float> x = Values(2'000'000, 11, true);
  std::vector<TopKSegment> segments;
  std::mt19937_64 rng(5);
  for (uint64_t begin = 0; begin < x.size();) {
    const uint64_t length = std::min<uint64_t>(
        x.size() - begin, segments.size() % 7 == 0 ? 1 : rng() % 40'000);
    segments.push_back({begin, begin + length, rng() % (length / 50 + 2)});
    begin += length;
  }
  ExpectParity(x, segments, "segments");
}

// 1 to 100M values, at the densities the engine uses (0.1% and 1%), on
// random and on tied data.
TEST_F(CudaTopKTest, MatchesTheCpuFromOneToAHundredMillionValues) {
  for (size_t n : {size_t{1}, size_t{2}, size_t{1'000'000}, size_t{25'000'000},
                   size_t{100'000'000}}) {
    for (bool ties : {false, true}) {
      const std::vector<float> x = Values(n, 100 + n + ties, ties);
      ExpectParity(x,
                   {{0, n, std::max<uint64_t>(1, n / 1000)},
                    {0, n, std::max<uint64_t>(1, n / 100)}},
                   "n=" + std::to_string(n) + (ties ? " tied" : " random"));
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaTopKTest, ForcedDevicePathAgreesThroughTheCpuInterface) {
  const std::vector<float> x = Values(2'000'000, 3, true);
  const sparse::SparseBlock cpu = TopKAbs(x, 20000, 0);
  absl::StatusOr<const TopKSelector*> cuda = CudaTopKForHostData();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  const sparse::SparseBlock gpu = (*cuda)->TopKAbs(x, 20000, 0);
  EXPECT_EQ(gpu, cpu);
}

TEST_F(CudaTopKTest, LeavesTheSelectionOnTheDevice) {
  const std::vector<float> x = Values(3'000'017, 9, true);
  const DeviceArray device(x);
  ASSERT_TRUE(device.ok());
  auto topk = CudaTopK::Create(x.size());
  ASSERT_TRUE(topk.ok()) << topk.status();
  EXPECT_EQ((*topk)->EnqueueTopKAbs(device.data(), x.size(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (uint64_t k : {1, 3'001, 30'000}) {
    auto selection = (*topk)->EnqueueTopKAbs(device.data(), x.size(), k);
    ASSERT_TRUE(selection.ok()) << selection.status();
    ASSERT_TRUE((*topk)->Synchronize().ok());
    int count = -1;
    ASSERT_EQ(cudaMemcpy(&count, selection->count, sizeof(int),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    const sparse::SparseBlock want = TopKAbs(x, k, 0);
    ASSERT_EQ(static_cast<size_t>(count), want.indices.size()) << "k=" << k;
    std::vector<uint32_t> indices(count);
    std::vector<float> values(count);
    ASSERT_EQ(cudaMemcpy(indices.data(), selection->positions,
                         count * sizeof(uint32_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(values.data(), selection->values,
                         count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(indices, want.indices) << "k=" << k;
    EXPECT_EQ(values, want.values) << "k=" << k;
  }
}

}  // namespace
}  // namespace gradmesh::kernels

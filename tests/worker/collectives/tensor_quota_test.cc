#include "worker/collectives/tensor_quota.h"

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "worker/collectives/registry.h"
#include "worker/transport/loopback.h"

namespace gradmesh::collectives {
namespace {

using ::gradmesh::testing::MassBalance;
using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RankRun;
using ::gradmesh::testing::RunIteration;
using ::testing::ElementsAre;

uint64_t SumOfQuotas(const std::vector<TensorQuotas::Part>& parts) {
  uint64_t total = 0;
  for (const auto& part : parts) total += part.quota;
  return total;
}

TEST(TensorQuotasTest, OneVectorWithoutTensors) {
  const TensorQuotas plain;
  EXPECT_FALSE(plain.per_tensor());
  const auto parts = plain.Split(5, {10, 20});
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].range, (sparse::IndexRange{10, 20}));
  EXPECT_EQ(parts[0].quota, 5u);
}

TEST(TensorQuotasTest, SplitsInProportionWithLargestRemainder) {
  // Tensors [0,50) [50,80) [80,100); k = 10 over [0,100): 5, 3, 2.
  const TensorQuotas quotas({0, 50, 80});
  const auto parts = quotas.Split(10, {0, 100});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].quota, 5u);
  EXPECT_EQ(parts[1].quota, 3u);
  EXPECT_EQ(parts[2].quota, 2u);
  // k = 7: shares 3.5, 2.1, 1.4 -> floors 3, 2, 1, the one left to 3.5.
  const auto seven = quotas.Split(7, {0, 100});
  EXPECT_EQ(seven[0].quota, 4u);
  EXPECT_EQ(seven[1].quota, 2u);
  EXPECT_EQ(seven[2].quota, 1u);
}

TEST(TensorQuotasTest, EveryTensorGetsOneWhileTheQuotaAllows) {
  // A 4-value tensor beside a 996-value one: 1% of 1000 is 10, and the small
  // tensor's share (0.04) would round to nothing.
  const TensorQuotas quotas({0, 996});
  const auto parts = quotas.Split(10, {0, 1000});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].quota, 9u);
  EXPECT_EQ(parts[1].quota, 1u);
  // Fewer values than tensors: proportional only.
  const TensorQuotas many({0, 1, 2, 3, 4});
  EXPECT_EQ(SumOfQuotas(many.Split(3, {0, 10})), 3u);
}

TEST(TensorQuotasTest, OnlyTheTensorsInTheRangeShareIt) {
  const TensorQuotas quotas({0, 40, 60});
  const auto parts = quotas.Split(4, {50, 100});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].range, (sparse::IndexRange{50, 60}));
  EXPECT_EQ(parts[1].range, (sparse::IndexRange{60, 100}));
  EXPECT_EQ(parts[0].quota + parts[1].quota, 4u);
  EXPECT_GE(parts[0].quota, 1u);
}

TEST(TensorQuotasTest, QuotasAddUpToKForEveryRange) {
  const TensorQuotas quotas({0, 3, 4, 100, 101, 500});
  for (uint64_t begin : {0u, 2u, 50u, 100u}) {
    for (uint64_t end : {101u, 300u, 600u}) {
      for (uint64_t k : {0u, 1u, 3u, 6u, 17u, 1000u}) {
        const auto parts = quotas.Split(k, {begin, end});
        EXPECT_EQ(SumOfQuotas(parts), std::min(k, end - begin))
            << begin << " " << end << " " << k;
        for (const auto& part : parts) {
          EXPECT_LE(part.quota, part.range.size());
          if (k >= parts.size()) {
            EXPECT_GE(part.quota, 1u);
          }
        }
      }
    }
  }
}

TEST(TensorQuotasTest, TopKKeepsTheSmallTensor) {
  // x holds [10, 18): values 100..103 at the end of tensor 0 ([0, 14)),
  // small ones at the start of tensor 1 ([14, ...)).
  std::vector<float> x = {100, 101, 102, 103, 0.001f, 0.002f, 0.003f, 0};
  const TensorQuotas quotas({0, 14});
  const sparse::SparseBlock per_tensor =
      quotas.TopK(kernels::CpuTopK(), x, 2, 10);
  EXPECT_THAT(per_tensor.indices, ElementsAre(13, 16));
  const sparse::SparseBlock plain =
      TensorQuotas().TopK(kernels::CpuTopK(), x, 2, 10);
  EXPECT_THAT(plain.indices, ElementsAre(12, 13));
}

TEST(TensorQuotasTest, SplitTopKKeepsAndDropsEveryEntry) {
  sparse::SparseBlock block;
  block.push_back(1, 5.0f);
  block.push_back(2, -6.0f);
  block.push_back(3, 7.0f);
  block.push_back(8, 0.5f);
  block.push_back(9, -0.25f);
  const TensorQuotas quotas({0, 5});
  sparse::SparseBlock kept, dropped;
  quotas.SplitTopK(kernels::CpuTopK(), block, 2, {0, 10}, &kept, &dropped);
  EXPECT_THAT(kept.indices, ElementsAre(3, 8));
  EXPECT_THAT(dropped.indices, ElementsAre(1, 2, 9));
  EXPECT_THAT(dropped.values, ElementsAre(5.0f, -6.0f, -0.25f));
}

TEST(TensorQuotasTest, CountsMissingTensors) {
  sparse::SparseBlock result;
  result.push_back(0, 1.0f);
  result.push_back(7, 1.0f);
  const std::vector<uint64_t> starts = {0, 4, 6};
  EXPECT_EQ(CountMissingTensors(starts, 10, result), 1u);  // [4,6) has none
  EXPECT_EQ(CountMissingTensors({}, 10, result), 0u);
  EXPECT_EQ(CountMissingTensors({}, 10, sparse::SparseBlock{}), 1u);
}

// A bucket as SAFusion's motivating example has it: a large tensor of large
// gradients, then a small tensor of small ones (a bias).
struct Bucket {
  std::vector<uint64_t> starts;
  uint64_t n;
};

std::vector<std::vector<float>> SmallBesideLarge(int p, const Bucket& bucket,
                                                 uint64_t seed) {
  std::vector<std::vector<float>> gradients;
  for (int r = 0; r < p; ++r) {
    std::vector<float> g = RandomVector(bucket.n, seed + r);
    for (uint64_t i = bucket.starts.back(); i < bucket.n; ++i) g[i] *= 1e-3f;
    gradients.push_back(std::move(g));
  }
  return gradients;
}

class PerTensorCollectiveTest
    : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

// With quotas per tensor the small tensor is in the result; without, it is
// not. Either way every rank gets the same result and nothing is lost.
TEST_P(PerTensorCollectiveTest, SmallTensorIsNotMissing) {
  const auto [algorithm, p, teams] = GetParam();
  const Bucket bucket{{0, 4000}, 4016};
  for (bool per_tensor : {true, false}) {
    SCOPED_TRACE(per_tensor ? "per tensor" : "after fusion");
    transport::LoopbackNetwork network(p);
    AlgorithmOptions options{
        .algorithm = algorithm, .density = 0.01, .teams = teams};
    if (per_tensor) options.tensor_starts = bucket.starts;
    std::vector<std::unique_ptr<Collective>> instances;
    for (int r = 0; r < p; ++r) {
      instances.push_back(*CreateCollective(options, p, r, bucket.n));
    }
    const auto gradients = SmallBesideLarge(p, bucket, 7);
    std::vector<std::vector<float>> residuals(
        p, std::vector<float>(bucket.n, 0.0f));
    const MassBalance balance(gradients, residuals);
    const std::vector<RankRun> runs =
        RunIteration(network, instances, gradients, residuals, 1);
    for (int r = 0; r < p; ++r) {
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      EXPECT_EQ(runs[r].result.indices, runs[0].result.indices);
      EXPECT_EQ(runs[r].result.values, runs[0].result.values);
    }
    EXPECT_TRUE(balance.Holds(runs[0].result, residuals));
    EXPECT_EQ(CountMissingTensors(bucket.starts, bucket.n, runs[0].result),
              per_tensor ? 0u : 1u);
  }
}

std::string PerTensorName(
    const ::testing::TestParamInfo<std::tuple<std::string, int, int>>& test) {
  return std::get<0>(test.param) + "_p" +
         std::to_string(std::get<1>(test.param)) + "_d" +
         std::to_string(std::get<2>(test.param));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, PerTensorCollectiveTest,
                         ::testing::Values(std::make_tuple("spardl", 4, 1),
                                           std::make_tuple("spardl", 4, 2),
                                           std::make_tuple("spardl", 6, 3),
                                           std::make_tuple("spardl", 5, 1),
                                           std::make_tuple("topka", 4, 1),
                                           std::make_tuple("topka", 3, 1)),
                         PerTensorName);

}  // namespace
}  // namespace gradmesh::collectives

// Every algorithm over every kind of wire format: tagged fp32 formats give
// bitwise the same results as plain COO; 16-bit values keep the conservation
// identity (what rounding takes off stays in residuals) and every rank still
// ends with the identical result.
#include "worker/collectives/wire.h"

#include <bit>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "worker/collectives/registry.h"

namespace gradmesh::collectives {
namespace {

using ::gradmesh::testing::MassBalance;
using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RankRun;
using ::gradmesh::testing::RunIteration;

struct Wire {
  const char* encoding;
  const char* values;
};

// d for SparDL: a team count that exercises R-SAG or B-SAG where P allows.
int TeamsFor(int world) {
  if (world % 3 == 0) return 3;
  if (world % 2 == 0) return 2;
  return 1;
}

using Param = std::tuple<std::string, int, uint64_t>;

class WireTest : public ::testing::TestWithParam<Param> {};

// Runs three iterations of `algorithm` with `wire`; checks identity and
// conservation; returns every iteration's result.
std::vector<sparse::SparseBlock> RunWith(const std::string& algorithm,
                                         int world, uint64_t n,
                                         const WireFormat& wire,
                                         std::vector<OpStats>* rank0_stats) {
  transport::LoopbackNetwork network(world);
  std::vector<std::unique_ptr<Collective>> instances;
  for (int r = 0; r < world; ++r) {
    auto created =
        CreateCollective({.algorithm = algorithm,
                          .density = 0.05,
                          .teams = algorithm == "spardl" ? TeamsFor(world) : 1,
                          .oktopk_tau = 2,
                          .oktopk_tau_prime = 2,
                          .wire = wire},
                         world, r, n);
    EXPECT_TRUE(created.ok()) << created.status();
    instances.push_back(*std::move(created));
  }
  std::vector<std::vector<float>> residuals(world, std::vector<float>(n, 0.0f));
  std::vector<sparse::SparseBlock> results;
  for (int it = 0; it < 3; ++it) {
    std::vector<std::vector<float>> gradients;
    for (int r = 0; r < world; ++r) {
      gradients.push_back(RandomVector(n, 31 * it + r));
      // Some tiny values, which 16-bit types round to zero.
      for (uint64_t i = 0; i < n; i += 7) gradients[r][i] *= 1e-9f;
    }
    const MassBalance balance(gradients, residuals);
    const std::vector<RankRun> runs =
        RunIteration(network, instances, gradients, residuals, it);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(runs[r].status.ok()) << runs[r].status;
      EXPECT_EQ(runs[r].result.indices, runs[0].result.indices);
      for (size_t e = 0; e < runs[r].result.size(); ++e) {
        EXPECT_EQ(std::bit_cast<uint32_t>(runs[r].result.values[e]),
                  std::bit_cast<uint32_t>(runs[0].result.values[e]));
      }
    }
    EXPECT_TRUE(balance.Holds(runs[0].result, residuals)) << "iteration " << it;
    results.push_back(runs[0].result);
    rank0_stats->push_back(runs[0].stats);
  }
  return results;
}

TEST_P(WireTest, EveryFormatConservesAndTaggedFloat32ChangesNothing) {
  const auto& [algorithm, world, n] = GetParam();
  std::vector<OpStats> plain_stats;
  const auto plain = RunWith(algorithm, world, n, WireFormat{}, &plain_stats);
  const Wire wires[] = {{"auto", "fp32"},
                        {"runs", "fp32"},
                        {"delta", "fp32"},
                        {"auto", "fp16"},
                        {"auto", "bf16"}};
  for (const Wire& w : wires) {
    SCOPED_TRACE(absl::StrCat(w.encoding, " ", w.values));
    const WireFormat format = *WireFormat::Parse(w.encoding, w.values);
    std::vector<OpStats> stats;
    const auto results = RunWith(algorithm, world, n, format, &stats);
    for (size_t it = 0; it < results.size(); ++it) {
      // The sparse volume is counted as plain COO whatever the format.
      // TopkA's and Gaussiank's first iteration gathers the same local
      // selections in every format (none of them rounds to zero), so the
      // volume is the same.
      if (it == 0 && (algorithm == "topka" || algorithm == "gaussiank")) {
        EXPECT_EQ(stats[it].coo_bytes_received,
                  plain_stats[it].coo_bytes_received);
      }
      if (std::string(w.values) == "fp32") {
        EXPECT_EQ(results[it], plain[it]) << "iteration " << it;
        EXPECT_EQ(stats[it].coo_bytes_received,
                  plain_stats[it].coo_bytes_received);
      }
    }
  }
  // Plain COO: the transport's bytes are the sparse volume itself where only
  // sparse blocks travel.
  if (algorithm == "spardl" || algorithm == "topka" || algorithm == "gtopk") {
    for (const OpStats& s : plain_stats) {
      EXPECT_EQ(s.bytes_received, s.coo_bytes_received);
    }
  }
}

std::string WireTestName(const ::testing::TestParamInfo<Param>& info) {
  const auto& [algorithm, world, n] = info.param;
  return absl::StrCat(algorithm, "_P", world, "_n", n);
}

INSTANTIATE_TEST_SUITE_P(
    AlgorithmsWorldsSizes, WireTest,
    ::testing::Combine(::testing::Values("spardl", "topka", "gaussiank",
                                         "topkdsa", "gtopk", "oktopk"),
                       ::testing::Values(1, 3, 4, 6, 8),
                       ::testing::Values<uint64_t>(0, 37, 3001)),
    WireTestName);

TEST(WireFormatTest, ParsesWhatTheFlagsTakeAndRejectsTheRest) {
  EXPECT_FALSE(WireFormat::Parse("coo", "fp32")->tagged);
  EXPECT_TRUE(WireFormat::Parse("auto", "fp32")->tagged);
  EXPECT_FALSE(WireFormat::Parse("auto", "fp32")->fixed.has_value());
  EXPECT_EQ(*WireFormat::Parse("bitmap", "bf16")->fixed,
            sparse::Encoding::kBitmap);
  EXPECT_TRUE(
      absl::IsInvalidArgument(WireFormat::Parse("zip", "fp32").status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(WireFormat::Parse("auto", "fp8").status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(WireFormat::Parse("coo", "fp16").status()));
}

TEST(BlockCodecTest, RoundKeepsTheLossAndDropsWhatRoundsToZero) {
  const BlockCodec codec(*WireFormat::Parse("auto", "fp16"));
  sparse::SparseBlock block{{1, 2, 3}, {1.0f, 1e-9f, 1.0f + 1.0f / 3}};
  sparse::SparseBlock dropped;
  const sparse::SparseBlock loss = codec.Round(&block, &dropped);
  EXPECT_THAT(block.indices, ::testing::ElementsAre(1, 3));
  EXPECT_THAT(dropped.indices, ::testing::ElementsAre(2));
  ASSERT_THAT(loss.indices, ::testing::ElementsAre(3));
  EXPECT_EQ(block.values[1] + loss.values[0], 1.0f + 1.0f / 3);
}

}  // namespace
}  // namespace gradmesh::collectives

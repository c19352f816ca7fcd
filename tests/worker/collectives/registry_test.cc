// The table of algorithms: every entry is reachable by name, honours what it
// says it honours (and refuses the rest), and its cost is a consistent range.
// The formulas' figures are checked against the schedules per algorithm in
// baselines_test, spardl_test, sim_test and coordinator_test.
#include "worker/collectives/registry.h"

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"

namespace gradmesh::collectives {
namespace {

TEST(RegistryTest, EveryEntryIsFoundByItsUniqueName) {
  std::set<std::string> names;
  for (const AlgorithmEntry& entry : Algorithms()) {
    EXPECT_TRUE(names.insert(std::string(entry.name)).second) << entry.name;
    EXPECT_EQ(FindAlgorithm(entry.name), &entry);
    EXPECT_NE(entry.create, nullptr) << entry.name;
    EXPECT_NE(entry.smallest_selection, nullptr) << entry.name;
  }
  EXPECT_EQ(AlgorithmNames().size(), names.size());
  EXPECT_EQ(AlgorithmNames()[0], "spardl");
  EXPECT_EQ(FindAlgorithm("allreduce"), nullptr);
  const auto unknown = CreateCollective({.algorithm = "allreduce"}, 4, 0, 100);
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_THAT(std::string(unknown.status().message()),
              ::testing::HasSubstr("spardl"));
}

TEST(RegistryTest, EntriesHonourTeamsAndQuantizationAsTheySay) {
  for (const AlgorithmEntry& entry : Algorithms()) {
    SCOPED_TRACE(entry.name);
    const std::string name(entry.name);
    EXPECT_EQ(CreateCollective({.algorithm = name, .teams = 2}, 4, 0, 100).ok(),
              entry.teams);
    EXPECT_EQ(
        CreateCollective({.algorithm = name, .quantize_bits = 4}, 4, 0, 100)
            .ok(),
        entry.quantizes);
    EXPECT_TRUE(CreateCollective({.algorithm = name}, 4, 0, 100).ok());
  }
}

TEST(RegistryTest, AlgorithmOptionsCarryEveryPlanField) {
  const Plan plan{.algorithm = "topkdsa",
                  .density = 0.3,
                  .teams = 1,
                  .encoding = "delta",
                  .values = "bf16",
                  .quantize_bits = 8,
                  .oktopk_tau = 5,
                  .oktopk_tau_prime = 6,
                  .seed = 42};
  absl::StatusOr<AlgorithmOptions> options = AlgorithmOptionsOf(plan);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->algorithm, "topkdsa");
  EXPECT_EQ(options->density, 0.3);
  EXPECT_EQ(options->teams, 1);
  EXPECT_EQ(options->quantize_bits, 8);
  EXPECT_EQ(options->oktopk_tau, 5);
  EXPECT_EQ(options->oktopk_tau_prime, 6);
  EXPECT_EQ(options->seed, 42u);
  EXPECT_EQ(options->wire.fixed, sparse::Encoding::kDeltaVarint);
  EXPECT_EQ(options->wire.values, sparse::ValueType::kBfloat16);
  EXPECT_TRUE(absl::IsInvalidArgument(
      AlgorithmOptionsOf({.encoding = "zip"}).status()));
}

// A selector that counts its calls and selects as the CPU does.
class CountingTopK final : public kernels::TopKSelector {
 public:
  std::vector<uint32_t> Positions(absl::Span<const float> x,
                                  size_t k) const override {
    ++calls;
    return kernels::CpuTopK().Positions(x, k);
  }
  mutable std::atomic<int> calls{0};
};

TEST(RegistryTest, AlgorithmsSelectThroughTheInjectedSelector) {
  constexpr int kP = 4;
  constexpr uint64_t kN = 2000;
  for (const std::string& name : AlgorithmNames()) {
    SCOPED_TRACE(name);
    CountingTopK counting;
    std::vector<sparse::SparseBlock> results[2];
    for (bool inject : {false, true}) {
      transport::LoopbackNetwork network(kP);
      std::vector<std::unique_ptr<Collective>> instances;
      std::vector<std::vector<float>> gradients, residuals;
      for (int r = 0; r < kP; ++r) {
        instances.push_back(
            *CreateCollective({.algorithm = name,
                               .density = 0.02,
                               .topk = inject ? &counting : nullptr},
                              kP, r, kN));
        gradients.push_back(testing::RandomVector(kN, 3 + r));
        residuals.emplace_back(kN, 0.0f);
      }
      for (const testing::RankRun& run :
           testing::RunIteration(network, instances, gradients, residuals, 1)) {
        ASSERT_TRUE(run.status.ok()) << run.status;
        results[inject].push_back(run.result);
      }
    }
    EXPECT_EQ(results[1], results[0]);
    // The dense ring selects nothing; Gaussiank selects by threshold (an
    // exact k-th value only when the estimate falls short).
    if (name != "dense" && name != "gaussiank") {
      EXPECT_GT(counting.calls, 0);
    }
  }
}

TEST(RegistryTest, CostsCoverModelPointsInsideTheirRanges) {
  for (const AlgorithmEntry& entry : Algorithms()) {
    if (entry.cost == nullptr) continue;
    for (int p : {1, 2, 6, 8, 12}) {
      for (int teams = 1; teams <= p; ++teams) {
        if (p % teams != 0 || (teams > 1 && !entry.teams)) continue;
        SCOPED_TRACE(absl::StrCat(entry.name, " P=", p, " d=", teams));
        const FormulaCost cost = entry.cost(p, teams, 100000, 0.01);
        EXPECT_LE(cost.min_bytes, cost.model_bytes);
        EXPECT_LE(cost.model_bytes, cost.max_bytes);
        EXPECT_GE(cost.rounds, 0);
      }
    }
  }
  // SparDL is exact where Table I is (d = 1, d a power of two), a range with
  // B-SAG.
  EXPECT_TRUE(TableOneCost("spardl", 8, 2, 100000, 0.01)->exact());
  EXPECT_FALSE(TableOneCost("spardl", 6, 3, 100000, 0.01)->exact());
  EXPECT_FALSE(TableOneCost("gaussiank", 8, 1, 100000, 0.01).has_value());
}

}  // namespace
}  // namespace gradmesh::collectives

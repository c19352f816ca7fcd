// `gradmesh sim`: determinism, what scaling n down keeps, bad cases, and
// the formulas it prints. The schedules at scale: sim_scale_test.cc.
#include "tools/gradmesh/sim.h"

#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tools/sim_cases.h"
#include "worker/collectives/registry.h"

namespace gradmesh::tools {
namespace {

using collectives::FormulaCost;
using collectives::TableOneCost;

// ---- Scaling and the clock ----

TEST(SimTest, SameCaseSameTimes) {
  SimCase c = SparDl(8, 2, 100'000, 0.01);
  c.iterations = 2;
  c.compute = {.select_s_per_value = 1e-9,
               .merge_s_per_value = 3e-9,
               .accumulate_s_per_value = 5e-10};
  const SimResult a = *Simulate(c);
  const SimResult b = *Simulate(c);
  EXPECT_EQ(a.seconds, b.seconds);
  EXPECT_GT(a.compute_seconds, 0);
  EXPECT_LT(a.compute_seconds, a.mean_seconds);
}

// Half the values, counted twice: same rounds, bytes and time within a few
// percent while the blocks stay large.
TEST(SimTest, ScalingNDownKeepsRoundsAndScalesBytes) {
  SimCase full = SparDl(16, 4, 400'000, 0.01);
  full.compute = {.select_s_per_value = 1e-9, .accumulate_s_per_value = 5e-10};
  SimCase half = full;
  half.max_values = 16 * 3 * 200'000;
  const SimResult a = *Simulate(full);
  const SimResult b = *Simulate(half);
  EXPECT_EQ(a.scale, 1);
  EXPECT_EQ(b.simulated_n, 200'000u);
  EXPECT_DOUBLE_EQ(b.scale, 2);
  EXPECT_EQ(a.max_rounds, b.max_rounds);
  EXPECT_NEAR(b.mean_bytes_received / a.mean_bytes_received, 1, 0.02);
  EXPECT_NEAR(b.mean_seconds / a.mean_seconds, 1, 0.05);
}

TEST(SimTest, SimulatedValuesBoundsMemory) {
  SimCase c = SparDl(1024, 1, 25'000'000, 0.01);
  c.max_values = uint64_t{1} << 29;
  EXPECT_EQ(SimulatedValues(c), (uint64_t{1} << 29) / (1024 * 3));
  c.algorithm.algorithm = "topka";  // also every worker's k at 8 bytes
  EXPECT_EQ(SimulatedValues(c),
            static_cast<uint64_t>((uint64_t{1} << 29) /
                                  (1024 * (3 + 2 * 1024 * 0.01))));
  c.workers = 2;
  c.n = 1000;
  EXPECT_EQ(SimulatedValues(c), 1000u);
}

TEST(SimTest, BadCasesAreClearErrors) {
  SimCase c = SparDl(12, 5, 1000, 0.01);
  EXPECT_TRUE(absl::IsInvalidArgument(Simulate(c).status()));  // 5 !| 12
  c = SparDl(0, 1, 1000, 0.01);
  EXPECT_THAT(std::string(Simulate(c).status().message()),
              ::testing::HasSubstr("--workers=0"));
  c = SparDl(4, 1, 1000, 0.01);
  c.max_values = 3;
  EXPECT_THAT(std::string(Simulate(c).status().message()),
              ::testing::HasSubstr("--max-values"));
  c = SparDl(4, 1, 1000, 0.01);
  c.algorithm.algorithm = "nope";
  EXPECT_TRUE(absl::IsInvalidArgument(Simulate(c).status()));
  c = SparDl(4, 1, 1000, 0.01);
  c.iterations = kMaxSimIterations + 1;
  EXPECT_THAT(std::string(Simulate(c).status().message()),
              ::testing::HasSubstr("--iterations"));
  c = SparDl(4, 1, 1000, 0.01);
  c.link.alpha_s = std::numeric_limits<double>::infinity();
  EXPECT_THAT(std::string(Simulate(c).status().message()),
              ::testing::HasSubstr("--alpha-us"));
  c = SparDl(4, 1, 1000, 0.01);
  c.compute.merge_s_per_value = -1;
  EXPECT_THAT(std::string(Simulate(c).status().message()),
              ::testing::HasSubstr("--merge-ns"));
  // A negative density: the algorithm's own check, before any sizing.
  c = SparDl(4, 1, 1000, -0.5);
  c.algorithm.algorithm = "topka";
  EXPECT_THAT(std::string(Simulate(c).status().message()),
              ::testing::HasSubstr("density"));
}

TEST(TableOneTest, FormulasByHand) {
  // P = 8, n = 1000, k = 10.
  EXPECT_EQ(TableOneCost("topkdsa", 8, 1, 1000, 0.01)->rounds, 8 + 6);
  EXPECT_DOUBLE_EQ(TableOneCost("topkdsa", 8, 1, 1000, 0.01)->min_bytes,
                   4 * 4 * 7.0 / 8 * 10);
  EXPECT_DOUBLE_EQ(TableOneCost("topkdsa", 8, 1, 1000, 0.01)->max_bytes,
                   4 * 7.0 / 8 * (20 + 1000));
  EXPECT_EQ(TableOneCost("oktopk", 8, 1, 1000, 0.01)->rounds, 2 * (8 + 3));
  EXPECT_DOUBLE_EQ(TableOneCost("oktopk", 8, 1, 1000, 0.01)->max_bytes,
                   4 * 6 * 7.0 / 8 * 10);
  EXPECT_DOUBLE_EQ(TableOneCost("dense", 8, 1, 1000, 0.01)->max_bytes,
                   4 * 2 * 7.0 / 8 * 1000);
  // B-SAG, P = 6, d = 3: [2 (18+6-6)/18 k, 2 (9+12-9)/6 k] words.
  const FormulaCost bsag = *TableOneCost("spardl", 6, 3, 1000, 0.01);
  EXPECT_DOUBLE_EQ(bsag.min_bytes, 4 * 2 * 18.0 / 18 * 10);
  EXPECT_DOUBLE_EQ(bsag.max_bytes, 4 * 2 * 12.0 / 6 * 10);
  EXPECT_FALSE(TableOneCost("gaussiank", 8, 1, 1000, 0.01).has_value());
}

}  // namespace
}  // namespace gradmesh::tools

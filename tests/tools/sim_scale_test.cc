// `gradmesh sim` at scale: the real schedules' rounds and bytes against
// Table I up to P = 1024, and the simulated choice of d against the
// coordinator's model. Minutes of threads and memory (label "scale": not run
// under the sanitizers).
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/cost_model.h"
#include "tests/tools/sim_cases.h"
#include "tools/gradmesh/sim.h"
#include "worker/collectives/registry.h"
#include "worker/collectives/schedule.h"

namespace gradmesh::tools {
namespace {

using collectives::FormulaCost;
using collectives::TableOneCost;

using collectives::CeilLog2;

// ---- Table I, where it is exact ----

// SparDL with d = 1 or R-SAG, at n = 240 P/d and k = 8 P/d: every block of
// every step holds exactly its quota d k/P = 8, so Table I holds exactly:
// rounds 2 log2(P/d) + log2 d, bytes 8 (2 (P-d)/P + d/P log2 d) k.
class SparDlTableOneTest
    : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(SparDlTableOneTest, RoundsAndBytesAreExact) {
  const auto [world, teams] = GetParam();
  const uint64_t n = 240 * static_cast<uint64_t>(world / teams);
  const double P = world, d = teams, k = 8.0 * world / teams;
  absl::StatusOr<SimResult> result =
      Simulate(SparDl(world, teams, n, 1.0 / 30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->simulated_n, n);
  EXPECT_EQ(result->max_rounds, 2 * CeilLog2(world / teams) + CeilLog2(teams));
  const double bytes = 8 * (2 * (P - d) / P + d / P * std::log2(d)) * k;
  EXPECT_DOUBLE_EQ(result->max_bytes_received, bytes);
  EXPECT_DOUBLE_EQ(result->mean_bytes_received, bytes);
  // The formula the command prints is the same.
  const std::optional<FormulaCost> formula =
      TableOneCost("spardl", world, teams, n, 1.0 / 30);
  ASSERT_TRUE(formula.has_value());
  EXPECT_EQ(formula->rounds, result->max_rounds);
  EXPECT_DOUBLE_EQ(formula->min_bytes, bytes);
  EXPECT_TRUE(formula->exact());
}

std::string WorldAndTeams(
    const ::testing::TestParamInfo<std::tuple<int, int>>& param) {
  return absl::StrCat("P", std::get<0>(param.param), "_d",
                      std::get<1>(param.param));
}

INSTANTIATE_TEST_SUITE_P(UpTo1024, SparDlTableOneTest,
                         ::testing::Values(std::tuple(16, 1), std::tuple(64, 4),
                                           std::tuple(256, 1),
                                           std::tuple(256, 16),
                                           std::tuple(1024, 1),
                                           std::tuple(1024, 32)),
                         WorldAndTeams);

// TopkA: a Bruck all-gather of every worker's k values, ceil(log2 P) rounds
// and 2 (P-1) k words for any P.
TEST(SimTableOneTest, TopkAAllGathersEveryWorkersK) {
  for (const int world : {100, 1024}) {
    SCOPED_TRACE(world);
    SimCase c = SparDl(world, 1, 2000, 0.01);
    c.algorithm.algorithm = "topka";
    absl::StatusOr<SimResult> result = Simulate(c);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->max_rounds, CeilLog2(world));
    EXPECT_DOUBLE_EQ(result->max_bytes_received, 8.0 * 20 * (world - 1));
    const std::optional<FormulaCost> formula =
        TableOneCost("topka", world, 1, 2000, 0.01);
    ASSERT_TRUE(formula.has_value());
    EXPECT_EQ(formula->rounds, result->max_rounds);
    EXPECT_DOUBLE_EQ(formula->max_bytes, result->max_bytes_received);
  }
}

// gTopk's tree: the root receives log2 P blocks of k on the way up and
// sends on the way down, 2 log2 P rounds. Table I's 4 log P k words count
// both directions of the critical path, twice what the root receives.
TEST(SimTableOneTest, GTopkTreeAt1024) {
  SimCase c = SparDl(1024, 1, 10'000, 0.01);
  c.algorithm.algorithm = "gtopk";
  absl::StatusOr<SimResult> result = Simulate(c);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->max_rounds, 20);
  EXPECT_DOUBLE_EQ(result->max_bytes_received, 8.0 * 100 * 10);
  const std::optional<FormulaCost> formula =
      TableOneCost("gtopk", 1024, 1, 10'000, 0.01);
  ASSERT_TRUE(formula.has_value());
  EXPECT_DOUBLE_EQ(formula->max_bytes, 2 * result->max_bytes_received);
}

// B-SAG is a range in Table I; the schedules land inside it.
TEST(SimTableOneTest, BSagWithinItsRange) {
  for (const auto& [world, teams] : {std::pair(12, 3), std::pair(14, 7),
                                     std::pair(768, 3), std::pair(1000, 10)}) {
    SCOPED_TRACE(absl::StrCat("P=", world, " d=", teams));
    const uint64_t n = 240 * static_cast<uint64_t>(world / teams);
    SimCase c = SparDl(world, teams, n, 1.0 / 30);
    c.iterations = 3;  // Algorithm 2 adjusts h between iterations
    absl::StatusOr<SimResult> result = Simulate(c);
    ASSERT_TRUE(result.ok()) << result.status();
    const FormulaCost formula =
        *TableOneCost("spardl", world, teams, n, 1.0 / 30);
    EXPECT_EQ(result->max_rounds, formula.rounds);
    EXPECT_GE(result->mean_bytes_received, formula.min_bytes);
    EXPECT_LE(result->max_bytes_received, formula.max_bytes);
  }
}

// ---- The choice of d ----

constexpr uint64_t kChoiceN = 200'000;

// Simulated seconds of SparDL at every d for P workers, n = kChoiceN.
absl::flat_hash_map<int, double> SecondsByTeams(
    int world, const server::LinkModel& link,
    const transport::SimCompute& compute) {
  absl::flat_hash_map<int, double> seconds;
  for (const int d : server::ValidTeamCounts(world)) {
    SimCase c = SparDl(world, d, kChoiceN, 0.01);
    c.iterations = 2;
    c.link = {.alpha_s = link.alpha_s, .beta_s_per_byte = link.beta_s_per_byte};
    c.compute = compute;
    absl::StatusOr<SimResult> result = Simulate(c);
    EXPECT_TRUE(result.ok()) << result.status();
    seconds[d] = result.ok() ? result->mean_seconds : 0;
  }
  return seconds;
}

// The d of least time, ties to the smaller.
int Fastest(const absl::flat_hash_map<int, double>& seconds) {
  int best = 0;
  for (const auto& [d, s] : seconds) {
    if (best == 0 || s < seconds.at(best) ||
        (s == seconds.at(best) && d < best)) {
      best = d;
    }
  }
  return best;
}

// Without compute, the d with the least simulated time is the one the
// coordinator's model ranks first, for powers of two (R-SAG) and not (B-SAG),
// latency- and bandwidth-bound links.
TEST(SimTeamChoiceTest, SimulatedBestEqualsTheModelsPick) {
  for (const int world : {12, 14, 16, 64}) {
    for (const double gbit : {1.0, 100.0}) {
      for (const double alpha : {10e-6, 100e-6}) {
        SCOPED_TRACE(
            absl::StrCat("P=", world, " ", gbit, " Gbit/s alpha ", alpha));
        const server::LinkModel link{.alpha_s = alpha,
                                     .beta_s_per_byte = 8e-9 / gbit};
        EXPECT_EQ(
            Fastest(SecondsByTeams(world, link, {})),
            server::RankTeamCounts(world, kChoiceN, 0.01, link, 3.0)[0].teams);
      }
    }
  }
}

// With compute charged (at `gradmesh sim`'s default costs, which the model
// knows nothing of), the model's pick may differ from the simulated best,
// but autotune never skips the simulated best at the coordinator's default
// skip factor, and the model's pick costs at most 5% more.
TEST(SimTeamChoiceTest, AutotuneNeverSkipsTheSimulatedBest) {
  const double skip_factor = server::PlanConfig{}.skip_factor;
  for (const int world : {12, 16, 64}) {
    for (const double gbit : {1.0, 100.0}) {
      SCOPED_TRACE(absl::StrCat("P=", world, " ", gbit, " Gbit/s"));
      const server::LinkModel link{.alpha_s = 50e-6,
                                   .beta_s_per_byte = 8e-9 / gbit};
      const absl::flat_hash_map<int, double> seconds =
          SecondsByTeams(world, link,
                         {.select_s_per_value = 0.98e-9,
                          .merge_s_per_value = 4.8e-9,
                          .accumulate_s_per_value = 0.89e-9});
      const int best = Fastest(seconds);
      const std::vector<server::TeamCountModel> ranked =
          server::RankTeamCounts(world, kChoiceN, 0.01, link, skip_factor);
      for (const server::TeamCountModel& m : ranked) {
        EXPECT_FALSE(m.skipped && m.teams == best) << "d=" << best;
      }
      EXPECT_LE(seconds.at(ranked[0].teams), 1.05 * seconds.at(best))
          << "model's d=" << ranked[0].teams << ", best d=" << best;
    }
  }
}

}  // namespace
}  // namespace gradmesh::tools

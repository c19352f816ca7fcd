// Tests of one autotune round (server/autotune.h): operations counted per
// bucket size, and the choice between the dense ring and SparDL's d.
#include "server/autotune.h"

#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::vector<std::string> kMembers = {"a", "b"};
constexpr uint64_t kSmall = 100'000;
constexpr uint64_t kLarge = 2'000'000;

AutotuneRound Round(std::vector<int> teams, bool with_dense, int window = 2,
                    double margin = 1.5) {
  return AutotuneRound(kMembers, std::move(teams), with_dense,
                       {.window = window, .sparse_margin = margin});
}

// Every member reports (step, n); the slowest takes `seconds`, and its step
// `period` (0: not known).
bool Report(AutotuneRound& round, uint64_t step, uint64_t n, double seconds,
            double period = 0) {
  bool ended = round.Add("a", step, n, seconds / 2, period / 2);
  ended = round.Add("b", step, n, seconds, period) || ended;
  return ended;
}

// Runs the current trial: the warm-up and `window` counted steps, each with a
// bucket of every size in `seconds` (n -> the slowest member's seconds).
// With `rest`, each step lasts the all-reduce plus `rest` (compute), and
// `pause` seconds more at steps 1 (its period holds the warm-up) and 2 (an
// evaluation).
void RunTrial(AutotuneRound& round, int window,
              const std::map<uint64_t, double>& seconds, double rest = 0,
              double pause = 0) {
  ASSERT_NE(round.current(), nullptr);
  const std::string name = round.current()->Name();
  auto period = [&](int step, double s) {
    return rest == 0 ? 0 : s + rest + (step == 1 || step == 2 ? pause : 0);
  };
  // The last step's reports end the trial: its first size to count
  // `window` operations ends it, the later ones are too late for it.
  for (int step = 0; step < window; ++step) {
    for (const auto& [n, s] : seconds) {
      ASSERT_FALSE(Report(round, step, n, s, period(step, s)))
          << name << " step " << step;
    }
  }
  for (const auto& [n, s] : seconds) {
    if (Report(round, window, n, s, period(window, s))) return;
  }
  FAIL() << name << " did not end";
}

TEST(AutotuneRoundTest, CountsOperationsPerBucketSize) {
  AutotuneRound round = Round({1}, /*with_dense=*/false, /*window=*/3);
  // Two sizes a step; the first operation of each size warms up.
  RunTrial(round, 3, {{kSmall, 1e-3}, {kLarge, 10e-3}});
  const Trial& trial = round.trials()[0];
  EXPECT_EQ(trial.iterations, 3);
  EXPECT_DOUBLE_EQ(trial.size_seconds.at(kSmall), 1e-3);
  EXPECT_DOUBLE_EQ(trial.size_seconds.at(kLarge), 10e-3);
  EXPECT_DOUBLE_EQ(trial.mean_seconds, 11e-3);
  EXPECT_EQ(round.current(), nullptr);
}

TEST(AutotuneRoundTest, AnOperationWaitsForEveryMember) {
  AutotuneRound round = Round({1}, /*with_dense=*/false, /*window=*/1);
  EXPECT_FALSE(Report(round, 0, kSmall, 1e-3));  // the warm-up
  EXPECT_FALSE(round.Add("a", 1, kSmall, 5e-3));
  EXPECT_EQ(round.trials()[0].iterations, 0);
  EXPECT_TRUE(round.Add("b", 1, kSmall, 2e-3));
  EXPECT_DOUBLE_EQ(round.trials()[0].size_seconds.at(kSmall), 5e-3);
}

TEST(AutotuneRoundTest, TheDenseRingIsTriedLastAndNeverSkipped) {
  AutotuneRound round = Round({1, 2}, /*with_dense=*/true);
  // A link where the model finds the dense ring's bytes hopeless.
  round.Rank(kLarge, {.alpha_s = 1e-6, .beta_s_per_byte = 1e-6}, 0);
  ASSERT_EQ(round.trials().size(), 3u);
  EXPECT_EQ(round.trials()[2].algorithm, kDense);
  EXPECT_FALSE(round.trials()[2].skipped);
  EXPECT_GT(round.trials()[2].modeled_seconds,
            3 * round.trials()[0].modeled_seconds);
  EXPECT_EQ(round.current(), &round.trials()[0]);
}

TEST(AutotuneRoundTest, WithoutTheDenseRingTheFastestDWins) {
  AutotuneRound round = Round({1, 2}, /*with_dense=*/false);
  RunTrial(round, 2, {{kLarge, 20e-3}});
  RunTrial(round, 2, {{kLarge, 12e-3}});
  const Choice choice = round.Result();
  EXPECT_EQ(choice.algorithm, kSparDl);
  EXPECT_EQ(choice.teams, 2);
  EXPECT_THAT(choice.dense_sizes, IsEmpty());
  EXPECT_EQ(choice.note, "autotune chose d=2 (12.000 ms) over d=1 (20.000 ms)");
}

// d = 1, 2, 4 timed at 10, 10.8 and 11.5 ms: the teams margin keeps the
// largest d within it of the fastest (larger blocks, closer to the global
// top-k); a margin of 1 keeps the fastest.
TEST(AutotuneRoundTest, TheLargestDWithinTheTeamsMarginWins) {
  for (const auto& [margin, teams] :
       std::vector<std::pair<double, int>>{{1.0, 1}, {1.1, 2}, {1.2, 4}}) {
    AutotuneRound round(kMembers, {1, 2, 4}, /*with_dense=*/false,
                        {.window = 2, .teams_margin = margin});
    RunTrial(round, 2, {{kLarge, 10e-3}});
    RunTrial(round, 2, {{kLarge, 10.8e-3}});
    RunTrial(round, 2, {{kLarge, 11.5e-3}});
    const Choice choice = round.Result();
    EXPECT_EQ(choice.teams, teams) << "margin " << margin;
    if (teams > 1) {
      EXPECT_THAT(
          choice.note,
          HasSubstr(absl::StrCat("within ", margin, "x of the fastest, d=1")));
    }
  }
}

TEST(AutotuneRoundTest, WithTheDenseRingTheTeamsMarginPicksTheLargestD) {
  AutotuneRound round(kMembers, {1, 2}, /*with_dense=*/true,
                      {.window = 2, .sparse_margin = 1.5, .teams_margin = 1.2});
  RunTrial(round, 2, {{kLarge, 10e-3}});
  RunTrial(round, 2, {{kLarge, 11e-3}});
  RunTrial(round, 2, {{kLarge, 100e-3}});  // the dense ring
  const Choice choice = round.Result();
  EXPECT_EQ(choice.algorithm, kSparDl);
  EXPECT_EQ(choice.teams, 2);
  EXPECT_THAT(choice.dense_sizes, IsEmpty());
  EXPECT_THAT(choice.note, HasSubstr("within 1.2x of the fastest, d=1"));
}

// The fastest d sums size B sparsely; a larger d within the teams margin
// would sum it densely (its step is the dense ring's): it is not chosen.
TEST(AutotuneRoundTest, TheTeamsMarginNeverTurnsASparseSizeDense) {
  AutotuneRound round(
      kMembers, {1, 2}, /*with_dense=*/true,
      {.window = 2, .sparse_margin = 1.5, .teams_margin = 1.25});
  RunTrial(round, 2, {{kSmall, 10e-3}, {kLarge, 1e-3}});    // d=1
  RunTrial(round, 2, {{kSmall, 10e-3}, {kLarge, 1.9e-3}});  // d=2
  RunTrial(round, 2, {{kSmall, 10e-3}, {kLarge, 2e-3}});    // dense
  const Choice choice = round.Result();
  EXPECT_EQ(choice.algorithm, kSparDl);
  EXPECT_EQ(choice.teams, 1);
  EXPECT_THAT(choice.dense_sizes, ElementsAre(kSmall));
}

TEST(AutotuneRoundTest, AutoSumsDenselyTheSizesWhereSparDlIsNotMarginFaster) {
  AutotuneRound round = Round({1, 2}, /*with_dense=*/true);
  RunTrial(round, 2, {{kSmall, 0.9e-3}, {kLarge, 10e-3}});  // d=1
  RunTrial(round, 2, {{kSmall, 0.8e-3}, {kLarge, 12e-3}});  // d=2
  RunTrial(round, 2, {{kSmall, 1.0e-3}, {kLarge, 40e-3}});  // dense
  const Choice choice = round.Result();
  // The small bucket: SparDL is not 1.5x faster; the large one: d=1 is.
  EXPECT_EQ(choice.algorithm, kSparDl);
  EXPECT_EQ(choice.teams, 1);
  EXPECT_THAT(choice.dense_sizes, ElementsAre(kSmall));
  EXPECT_THAT(choice.note, HasSubstr("auto chose spardl d=1"));
  EXPECT_THAT(choice.note,
              HasSubstr("100000 values: dense 1.000 ms against d=1 0.900 ms"));
  EXPECT_THAT(choice.note,
              HasSubstr("2000000 values: d=1 10.000 ms against dense"));
}

TEST(AutotuneRoundTest, AutoPicksTheDenseRingWhereItIsFasterEverywhere) {
  AutotuneRound round = Round({1, 2}, /*with_dense=*/true);
  RunTrial(round, 2, {{kSmall, 2e-3}, {kLarge, 10e-3}});
  RunTrial(round, 2, {{kSmall, 2e-3}, {kLarge, 11e-3}});
  RunTrial(round, 2, {{kSmall, 1e-3}, {kLarge, 8e-3}});  // dense
  const Choice choice = round.Result();
  EXPECT_EQ(choice.algorithm, kDense);
  EXPECT_EQ(choice.teams, 1);
  EXPECT_THAT(choice.dense_sizes, IsEmpty());
  EXPECT_THAT(choice.note, HasSubstr("auto chose dense for every bucket"));
}

// Every size dense whatever d: the note compares with SparDL's fastest d.
TEST(AutotuneRoundTest, AllDenseNamesTheFastestD) {
  AutotuneRound round = Round({1, 2}, /*with_dense=*/true);
  RunTrial(round, 2, {{kLarge, 100e-3}});  // d=1
  RunTrial(round, 2, {{kLarge, 70e-3}});   // d=2
  RunTrial(round, 2, {{kLarge, 60e-3}});   // dense
  const Choice choice = round.Result();
  EXPECT_EQ(choice.algorithm, kDense);
  EXPECT_THAT(choice.note, HasSubstr("dense 60.000 ms against d=2 70.000 ms"));
}

TEST(AutotuneRoundTest, TheMarginDecidesNearTies) {
  for (const auto& [sparse_seconds, expected] :
       std::vector<std::pair<double, std::string>>{{7e-3, "dense"},
                                                   {6e-3, "spardl"}}) {
    // SparDL 1.43x and 1.67x faster than the dense ring's 10 ms.
    AutotuneRound round = Round({1}, /*with_dense=*/true, 2, /*margin=*/1.5);
    RunTrial(round, 2, {{kLarge, sparse_seconds}});
    RunTrial(round, 2, {{kLarge, 10e-3}});
    EXPECT_EQ(round.Result().algorithm, expected) << sparse_seconds;
  }
  AutotuneRound no_margin = Round({1}, /*with_dense=*/true, 2, /*margin=*/1);
  RunTrial(no_margin, 2, {{kLarge, 9e-3}});
  RunTrial(no_margin, 2, {{kLarge, 10e-3}});
  EXPECT_EQ(no_margin.Result().algorithm, kSparDl);
}

// SparDL sums 2x faster, but the step is mostly compute: 130 ms against
// 160 ms is not 1.5x shorter, so the exact sum wins; with little compute,
// SparDL does. A pause in one step (an evaluation) does not move the step.
TEST(AutotuneRoundTest, TheMarginWeighsTheWholeStepCompute) {
  for (const auto& [rest, expected] :
       std::vector<std::pair<double, std::string>>{{100e-3, "dense"},
                                                   {5e-3, "spardl"}}) {
    AutotuneRound round = Round({1}, /*with_dense=*/true, 3, /*margin=*/1.5);
    RunTrial(round, 3, {{kLarge, 30e-3}}, rest, /*pause=*/10);
    RunTrial(round, 3, {{kLarge, 60e-3}}, rest, /*pause=*/10);
    const Choice choice = round.Result();
    EXPECT_EQ(choice.algorithm, expected) << rest;
    if (rest > 50e-3) {
      EXPECT_THAT(choice.note,
                  HasSubstr("dense 60.000 ms against d=1 30.000 ms, in steps "
                            "of 160.000 ms against 130.000 ms"));
      EXPECT_THAT(choice.note, HasSubstr("SparDL's step must be 1.5x shorter"));
    }
  }
  // Periods known to one trial only: the sums alone decide, as before.
  AutotuneRound round = Round({1}, /*with_dense=*/true, 3, /*margin=*/1.5);
  RunTrial(round, 3, {{kLarge, 30e-3}}, 100e-3);
  RunTrial(round, 3, {{kLarge, 60e-3}});
  EXPECT_EQ(round.Result().algorithm, kSparDl);
}

TEST(AutotuneRoundTest, SkippedTrialsAreNotRun) {
  AutotuneRound round(kMembers, {1, 2}, /*with_dense=*/true,
                      {.window = 2, .skip_factor = 1});
  // Latency alone, P = 2: d=2 takes 1 round, d=1 2, so d=1 is skipped at a
  // skip factor of 1; the dense ring stays last all the same.
  round.Rank(kLarge, {.alpha_s = 1, .beta_s_per_byte = 0}, 0);
  ASSERT_EQ(round.trials().size(), 3u);
  EXPECT_EQ(round.trials()[0].teams, 2);
  EXPECT_TRUE(round.trials()[1].skipped);
  EXPECT_EQ(round.trials()[2].algorithm, kDense);
  RunTrial(round, 2, {{kLarge, 5e-3}});  // d=2
  EXPECT_EQ(round.current(), &round.trials()[2]);
  RunTrial(round, 2, {{kLarge, 10e-3}});  // dense
  EXPECT_EQ(round.current(), nullptr);
  EXPECT_EQ(round.trials()[1].iterations, 0);
  EXPECT_EQ(round.Result().teams, 2);
}

TEST(AutotuneRoundTest, ATrialWaitsForEverySizeItSaw) {
  AutotuneRound round = Round({1}, /*with_dense=*/false, /*window=*/2);
  for (uint64_t step = 0; step <= 1; ++step) {
    EXPECT_FALSE(Report(round, step, kLarge, 10e-3));
    EXPECT_FALSE(Report(round, step, kSmall, 1e-3));
  }
  EXPECT_FALSE(Report(round, 2, kLarge, 10e-3));  // the small one has 1
  EXPECT_TRUE(Report(round, 2, kSmall, 1e-3));
  EXPECT_THAT(round.trials()[0].size_seconds,
              ElementsAre(std::pair{kSmall, 1e-3}, std::pair{kLarge, 10e-3}));
}

// Each bucket counts its own steps: one far behind the others is not taken
// for lost reports.
TEST(AutotuneRoundTest, ABucketBehindTheOthersWaitsForEveryMember) {
  AutotuneRound round = Round({1}, /*with_dense=*/false, /*window=*/1);
  EXPECT_FALSE(Report(round, 100, kLarge, 10e-3));  // warms up
  EXPECT_FALSE(Report(round, 5, kSmall, 1e-3));     // warms up
  EXPECT_FALSE(Report(round, 101, kLarge, 10e-3));  // counted
  EXPECT_FALSE(round.Add("a", 6, kSmall, 1e-3));
  EXPECT_TRUE(round.Add("b", 6, kSmall, 9e-3));
  EXPECT_DOUBLE_EQ(round.trials()[0].size_seconds.at(kSmall), 9e-3);
}

TEST(AutotuneRoundTest, StepsNearTheEndOfTheRangeAreNotLostAtOnce) {
  AutotuneRound round = Round({1}, /*with_dense=*/false, /*window=*/1);
  const uint64_t last = std::numeric_limits<uint64_t>::max();
  EXPECT_FALSE(round.Add("a", last - 1, kLarge, 1e-3));
  EXPECT_FALSE(round.Add("a", last, kLarge, 1e-3));
  EXPECT_EQ(round.trials()[0].iterations, 0);
}

// A size only SparDL's trial timed has no evidence for SparDL: it stays
// dense, and a SparDL size elsewhere keeps the plan SparDL.
TEST(AutotuneRoundTest, ASizeTheDenseTrialDidNotTimeIsDense) {
  AutotuneRound round = Round({1}, /*with_dense=*/true);
  RunTrial(round, 2, {{kSmall, 1e-3}, {kLarge, 10e-3}});  // d=1
  RunTrial(round, 2, {{kLarge, 40e-3}});                  // dense
  const Choice choice = round.Result();
  EXPECT_EQ(choice.algorithm, kSparDl);
  EXPECT_THAT(choice.dense_sizes, ElementsAre(kSmall));
}

TEST(AutotuneRoundTest, TimesAtMostkMaxSizesSizes) {
  AutotuneRound round = Round({1}, /*with_dense=*/true, /*window=*/1);
  std::map<uint64_t, double> many;
  for (uint64_t n = 1; n <= kMaxSizes + 10; ++n) many[n] = 1e-3;
  RunTrial(round, 1, many);
  EXPECT_EQ(round.trials()[0].size_seconds.size(), kMaxSizes);
}

}  // namespace
}  // namespace gradmesh::server

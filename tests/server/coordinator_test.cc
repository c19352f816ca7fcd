// Tests of the coordinator's state machine and SparDL's cost model, driven by
// an explicit clock (absl::Now() only bounds the blocking WaitForView tests).
#include "server/coordinator.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cost_model.h"

namespace gradmesh::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr uint64_t kN = 1'000'000;

MemberInfo Node(const std::string& id) {
  return {.node_id = id, .address = id + ":7000", .host = id, .gpus = 1};
}

std::vector<std::string> Ids(const View& view) {
  std::vector<std::string> ids;
  for (const MemberInfo& member : view.members) ids.push_back(member.node_id);
  return ids;
}

std::vector<int> TrialTeams(const Coordinator& coordinator) {
  std::vector<int> teams;
  for (const Trial& trial : coordinator.trials()) teams.push_back(trial.teams);
  return teams;
}

void JoinAll(Coordinator& coordinator, const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    ASSERT_TRUE(coordinator.Join(Node(id), kT0).ok()) << id;
  }
}

// Every member reports `operation` of the current epoch; member i takes
// seconds * (i + 1) / P, so the slowest takes `seconds`.
void ReportOperation(Coordinator& coordinator, uint64_t operation,
                     double seconds) {
  const View view = coordinator.view();
  const double p = view.members.size();
  for (size_t i = 0; i < view.members.size(); ++i) {
    ASSERT_TRUE(coordinator
                    .Report({.node_id = view.members[i].node_id,
                             .epoch = view.epoch,
                             .operation = operation,
                             .seconds = seconds * (i + 1) / p,
                             .rounds = 3,
                             .bytes_received = 1000,
                             .values = kN})
                    .ok());
  }
}

// The warm-up and `window` counted operations of the current trial, the
// slowest member taking `seconds` each time.
void RunTrial(Coordinator& coordinator, int window, double seconds) {
  for (int op = 0; op <= window; ++op) {
    ReportOperation(coordinator, op, seconds);
  }
}

// ---- Cost model ----

TEST(CostModelTest, ValidTeamCountsAreTheDivisors) {
  EXPECT_THAT(ValidTeamCounts(12), ElementsAre(1, 2, 3, 4, 6, 12));
  EXPECT_THAT(ValidTeamCounts(7), ElementsAre(1, 7));
  EXPECT_THAT(ValidTeamCounts(1), ElementsAre(1));
  EXPECT_THAT(ValidTeamCounts(0), IsEmpty());
}

TEST(CostModelTest, RankTeamCountsOrdersByModeledTimeAndSkipsHopeless) {
  // P = 8, n = 1M at 1% (k = 10,000). Rounds and values received:
  //   d=1: 6, 1.75 k   d=2: 5, 1.75 k   d=4: 4, 2.0 k   d=8: 3, 3.0 k.
  // A slow link (1 byte a second): the bytes rank, d = 1 and 2 tie on bytes,
  // 2 has fewer rounds.
  const LinkModel slow{.alpha_s = 1e-6, .beta_s_per_byte = 1};
  std::vector<TeamCountModel> ranked = RankTeamCounts(8, kN, 0.01, slow, 1.5);
  ASSERT_EQ(ranked.size(), 4u);
  EXPECT_EQ(ranked[0].teams, 2);
  EXPECT_EQ(ranked[1].teams, 1);
  EXPECT_EQ(ranked[2].teams, 4);
  EXPECT_EQ(ranked[3].teams, 8);
  EXPECT_DOUBLE_EQ(ranked[0].seconds, ModelSeconds(ranked[0].cost, slow));
  EXPECT_FALSE(ranked[2].skipped);  // 2.0 / 1.75 < 1.5
  EXPECT_TRUE(ranked[3].skipped);   // 3.0 / 1.75 > 1.5
  // Latency alone: the fewest rounds first.
  const LinkModel fast{.alpha_s = 1, .beta_s_per_byte = 1e-12};
  ranked = RankTeamCounts(8, kN, 0.01, fast, 100);
  EXPECT_EQ(ranked[0].teams, 8);
  // n unknown: the rounds rank, ties to the smaller d, nothing skipped.
  ranked = RankTeamCounts(12, 0, 0.01, slow, 1);
  std::vector<int> order;
  for (const TeamCountModel& m : ranked) {
    order.push_back(m.teams);
    EXPECT_FALSE(m.skipped);
  }
  // Rounds: d=1: 8, 2: 7, 3: 6, 4: 6, 6: 5, 12: 4.
  EXPECT_THAT(order, ElementsAre(12, 6, 3, 4, 2, 1));
}

TEST(CostModelTest, RoundsFollowTableOne) {
  // d = 1: plain SRS + Bruck, 2 ceil(log2 P).
  EXPECT_EQ(SparDlCost(6, 1, kN, 0.01).rounds, 6);
  EXPECT_EQ(SparDlCost(8, 1, kN, 0.01).rounds, 6);
  // R-SAG: 2 ceil(log2 P/d) + log2 d.
  EXPECT_EQ(SparDlCost(8, 2, kN, 0.01).rounds, 2 * 2 + 1);
  EXPECT_EQ(SparDlCost(8, 8, kN, 0.01).rounds, 0 + 3);
  EXPECT_EQ(SparDlCost(12, 4, kN, 0.01).rounds, 2 * 2 + 2);
  // B-SAG: 2 ceil(log2 P/d) + ceil(log2 d).
  EXPECT_EQ(SparDlCost(6, 3, kN, 0.01).rounds, 2 * 1 + 2);
  EXPECT_EQ(SparDlCost(12, 6, kN, 0.01).rounds, 2 * 1 + 3);
  EXPECT_EQ(SparDlCost(10, 5, kN, 0.01).rounds, 2 * 1 + 3);
}

TEST(CostModelTest, BytesFollowTableOne) {
  const double k = 10'000;  // 1% of kN
  // d = 1: 4 (P-1)/P k words of 4 bytes.
  EXPECT_DOUBLE_EQ(SparDlCost(6, 1, kN, 0.01).bytes, 16 * k * 5 / 6);
  // R-SAG: 2 ((2P-2d)/P + d/P log2 d) k words.
  EXPECT_DOUBLE_EQ(SparDlCost(8, 2, kN, 0.01).bytes,
                   8 * k * (12.0 / 8 + 2.0 / 8 * 1));
  EXPECT_DOUBLE_EQ(SparDlCost(8, 8, kN, 0.01).bytes, 8 * k * (0 + 1.0 * 3));
  // B-SAG at h = k/P: SRS + (d-1) k/P + Bruck.
  EXPECT_DOUBLE_EQ(SparDlCost(6, 3, kN, 0.01).bytes,
                   8 * k * (3.0 / 6 + 2.0 / 6 + 3.0 / 6));
  // No gradient, no bytes.
  EXPECT_EQ(SparDlCost(8, 2, 0, 0.01).bytes, 0);
}

TEST(CostModelTest, BsagLiesInsideEquationTenRange) {
  const double k = 10'000;
  for (int p = 2; p <= 64; ++p) {
    for (int d : ValidTeamCounts(p)) {
      if (d == 1 || (d & (d - 1)) == 0) continue;
      const double words = SparDlCost(p, d, kN, 0.01).bytes / 4;
      const double lower = 2.0 * (p * d + p - 2 * d) / (p * d) * k;
      const double upper = 2.0 * (d * d + 2 * p - 3 * d) / p * k;
      EXPECT_GE(words, lower * (1 - 1e-12)) << "P=" << p << " d=" << d;
      EXPECT_LE(words, upper * (1 + 1e-12)) << "P=" << p << " d=" << d;
    }
  }
}

TEST(CostModelTest, ModelSecondsIsAlphaRoundsPlusBetaBytes) {
  EXPECT_DOUBLE_EQ(ModelSeconds({.rounds = 4, .bytes = 1e6},
                                {.alpha_s = 1e-5, .beta_s_per_byte = 1e-9}),
                   4e-5 + 1e-3);
}

TEST(CostModelTest, FitRecoversExactAlphaAndBeta) {
  const LinkModel truth{.alpha_s = 3e-5, .beta_s_per_byte = 2e-9};
  std::vector<LinkSample> samples;
  for (auto [rounds, bytes] : std::vector<std::pair<int, double>>{
           {2, 1e5}, {4, 3e5}, {3, 5e4}, {6, 2e6}}) {
    samples.push_back({.rounds = rounds,
                       .bytes = bytes,
                       .seconds = ModelSeconds({rounds, bytes}, truth)});
  }
  const LinkModel fitted = FitLinkModel(samples, LinkModel{});
  EXPECT_NEAR(fitted.alpha_s, truth.alpha_s, 1e-9 * truth.alpha_s);
  EXPECT_NEAR(fitted.beta_s_per_byte, truth.beta_s_per_byte,
              1e-9 * truth.beta_s_per_byte);
}

TEST(CostModelTest, FitFallsBackOnDegenerateInput) {
  const LinkModel fallback{.alpha_s = 7e-6, .beta_s_per_byte = 5e-10};
  auto is_fallback = [&](const LinkModel& m) {
    return m.alpha_s == fallback.alpha_s &&
           m.beta_s_per_byte == fallback.beta_s_per_byte;
  };
  EXPECT_TRUE(is_fallback(FitLinkModel({}, fallback)));
  // One direction only: (2, 1e5) and (4, 2e5) are parallel.
  const std::vector<LinkSample> parallel = {{2, 1e5, 1e-3}, {4, 2e5, 2e-3}};
  EXPECT_TRUE(is_fallback(FitLinkModel(parallel, fallback)));
  // No bytes at all.
  const std::vector<LinkSample> no_bytes = {{2, 0, 1e-3}, {4, 0, 2e-3}};
  EXPECT_TRUE(is_fallback(FitLinkModel(no_bytes, fallback)));
  // Exact data from a negative alpha: fitted, but refused.
  const LinkModel negative{.alpha_s = -1e-5, .beta_s_per_byte = 1e-9};
  std::vector<LinkSample> samples;
  for (auto [rounds, bytes] :
       std::vector<std::pair<int, double>>{{2, 1e5}, {4, 3e5}, {3, 5e4}}) {
    samples.push_back({rounds, bytes, ModelSeconds({rounds, bytes}, negative)});
  }
  EXPECT_TRUE(is_fallback(FitLinkModel(samples, fallback)));
}

// ---- Membership and epochs ----

TEST(CoordinatorTest, JoinsPublishEpochsWithRanksSortedByNodeId) {
  Coordinator coordinator({.algorithm = "dense"}, kTimeout);
  EXPECT_EQ(coordinator.view().epoch, 0u);
  EXPECT_THAT(coordinator.view().members, IsEmpty());

  absl::StatusOr<View> view = coordinator.Join(Node("c"), kT0);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 1u);
  ASSERT_TRUE(coordinator.Join(Node("a"), kT0).ok());
  view = coordinator.Join(Node("b"), kT0);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 3u);
  EXPECT_THAT(Ids(*view), ElementsAre("a", "b", "c"));
  EXPECT_EQ(view->members[2].address, "c:7000");
  EXPECT_EQ(view->plan.algorithm, "dense");
  EXPECT_EQ(view->plan.teams, 1);
  EXPECT_FALSE(view->plan.autotuning);
  EXPECT_EQ(Ids(coordinator.view()), Ids(*view));
}

TEST(CoordinatorTest, EveryPlanFieldOfTheConfigIsPublished) {
  Coordinator coordinator({.algorithm = "topkdsa",
                           .density = 0.2,
                           .encoding = "auto",
                           .values = "fp16",
                           .quantize_bits = 4,
                           .oktopk_tau = 7,
                           .oktopk_tau_prime = 3,
                           .seed = 99,
                           .exact_below = 77,
                           .warmup_steps = 9,
                           .fusion = "after_fusion",
                           .chunk_bytes = 4096,
                           .teams = 1},
                          kTimeout);
  absl::StatusOr<View> view = coordinator.Join(Node("a"), kT0);
  ASSERT_TRUE(view.ok()) << view.status();
  const Plan& plan = view->plan;
  EXPECT_EQ(plan.algorithm, "topkdsa");
  EXPECT_EQ(plan.density, 0.2);
  EXPECT_EQ(plan.encoding, "auto");
  EXPECT_EQ(plan.values, "fp16");
  EXPECT_EQ(plan.quantize_bits, 4);
  EXPECT_EQ(plan.oktopk_tau, 7);
  EXPECT_EQ(plan.oktopk_tau_prime, 3);
  EXPECT_EQ(plan.seed, 99u);
  EXPECT_EQ(plan.exact_below, 77u);
  EXPECT_EQ(plan.warmup_steps, 9u);
  EXPECT_EQ(plan.fusion, "after_fusion");
  EXPECT_EQ(plan.chunk_bytes, 4096u);
}

TEST(CoordinatorTest, ConfigsTheAlgorithmRejectsAreRefused) {
  // Quantization belongs to TopkDSA, in 2, 4 or 8 bits; Ok-Topk's periods
  // are positive.
  for (const PlanConfig& config :
       {PlanConfig{.algorithm = "spardl", .quantize_bits = 4},
        PlanConfig{.algorithm = "topkdsa", .quantize_bits = 3},
        PlanConfig{.algorithm = "oktopk", .oktopk_tau = 0},
        PlanConfig{.fusion = "per_layer"}}) {
    Coordinator coordinator(config, kTimeout);
    EXPECT_TRUE(
        absl::IsInvalidArgument(coordinator.Join(Node("a"), kT0).status()))
        << config.algorithm;
  }
}

TEST(CoordinatorTest, LeaveRemovesAndUnknownIsNotFound) {
  Coordinator coordinator({}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c"});
  ASSERT_TRUE(coordinator.Leave("b").ok());
  EXPECT_EQ(coordinator.view().epoch, 4u);
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("a", "c"));
  EXPECT_EQ(coordinator.Leave("b").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator.view().epoch, 4u);
}

TEST(CoordinatorTest, RejoinWithTheSameNodeIdReplaces) {
  Coordinator coordinator({}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  MemberInfo again = Node("a");
  again.address = "10.0.0.9:7001";
  absl::StatusOr<View> view = coordinator.Join(again, kT0 + absl::Seconds(1));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 3u);
  EXPECT_THAT(Ids(*view), ElementsAre("a", "b"));
  EXPECT_EQ(view->members[0].address, "10.0.0.9:7001");
}

// A restarted coordinator takes over the view its members run: no new
// epoch, no rejoin storm; members that never come back are removed later.
TEST(CoordinatorTest, ARestartedCoordinatorAdoptsTheViewItsMembersRun) {
  const PlanConfig config{.teams = 1};
  Coordinator before(config, kTimeout);
  JoinAll(before, {"a", "b", "c"});
  const View known = before.view();
  ASSERT_EQ(known.epoch, 3u);

  Coordinator after(config, kTimeout);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  absl::StatusOr<View> view = after.Join(Node("b"), t1, &known);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->epoch, 3u);
  EXPECT_THAT(Ids(*view), ElementsAre("a", "b", "c"));
  EXPECT_TRUE(after.Heartbeat("b", t1 + absl::Seconds(2)).ok());
  EXPECT_TRUE(after.Heartbeat("c", t1 + absl::Seconds(2)).ok());
  // c rejoins knowing the current epoch (it lost contact): nothing changes.
  ASSERT_TRUE(after.Join(Node("c"), t1 + absl::Seconds(3), &known).ok());
  EXPECT_EQ(after.view().epoch, 3u);
  // a never comes back: removed after the timeout, in a newer epoch.
  after.Tick(t1 + kTimeout + absl::Seconds(1));
  EXPECT_EQ(after.view().epoch, 4u);
  EXPECT_THAT(Ids(after.view()), ElementsAre("b", "c"));
  // A new member still makes a new epoch.
  view = after.Join(Node("d"), t1 + kTimeout + absl::Seconds(2));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 5u);
}

// Epochs only grow across restarts: a known epoch the coordinator cannot
// adopt (it does not list the sender, or another came first) still raises
// the next one past it.
TEST(CoordinatorTest, KnownEpochsRaiseTheNextOne) {
  Coordinator coordinator({.teams = 1}, kTimeout);
  View stranger;
  stranger.epoch = 7;
  stranger.members = {Node("z")};
  absl::StatusOr<View> view = coordinator.Join(Node("x"), kT0, &stranger);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 8u);
  View later = *view;
  later.epoch = 12;
  view = coordinator.Join(Node("y"), kT0, &later);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 13u);
  EXPECT_THAT(Ids(*view), ElementsAre("x", "y"));
}

// A known epoch can raise the epoch only so far that the epochs published
// after it stay ones that Joins may carry: a worker evicted later can still
// rejoin with its view, and a restarted coordinator can still adopt it.
TEST(CoordinatorTest, AKnownEpochLeavesRoomForTheEpochsAfterIt) {
  constexpr uint64_t k53 = uint64_t{1} << 53;
  Coordinator coordinator({.teams = 1}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  View pushed = coordinator.view();
  pushed.epoch = k53;
  EXPECT_TRUE(absl::IsInvalidArgument(
      coordinator.Join(Node("c"), kT0, &pushed).status()));
  EXPECT_EQ(coordinator.view().epoch, 2u);

  // The highest raise accepted, then two changes past it.
  pushed.epoch = Coordinator::kMaxRaisedEpoch;
  ASSERT_TRUE(coordinator.Join(Node("c"), kT0, &pushed).ok());
  ASSERT_TRUE(coordinator.Heartbeat("a", kT0 + absl::Seconds(5)).ok());
  ASSERT_TRUE(coordinator.Heartbeat("b", kT0 + absl::Seconds(5)).ok());
  const View with_c = coordinator.view();
  coordinator.Tick(kT0 + kTimeout + absl::Seconds(1));  // c is evicted
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("a", "b"));
  absl::StatusOr<View> view =
      coordinator.Join(Node("c"), kT0 + absl::Seconds(12), &with_c);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_GT(view->epoch, Coordinator::kMaxRaisedEpoch + 1);

  // A restarted coordinator adopts that view, and changes go on.
  Coordinator restarted({.teams = 1}, kTimeout);
  view = restarted.Join(Node("a"), kT0, &*view);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_THAT(Ids(*view), ElementsAre("a", "b", "c"));
  ASSERT_TRUE(restarted.Leave("b").ok());
  EXPECT_LT(restarted.view().epoch, k53);
  // Adoption has its own limit, above the raise's.
  View far = restarted.view();
  far.epoch = k53;
  Coordinator fresh({.teams = 1}, kTimeout);
  EXPECT_TRUE(
      absl::IsInvalidArgument(fresh.Join(Node("a"), kT0, &far).status()));
  // A view that does not list its sender is not adopted: past the raise's
  // limit it is refused, and changes nothing.
  View without_sender = restarted.view();
  without_sender.epoch = Coordinator::kMaxRaisedEpoch + 1;
  EXPECT_TRUE(absl::IsInvalidArgument(
      fresh.Join(Node("z"), kT0, &without_sender).status()));
  EXPECT_EQ(fresh.view().epoch, 0u);
}

// An adopted plan stays when this config would run it (an autotuned d
// included); an autotune trial in progress, or another config, starts over.
TEST(CoordinatorTest, AdoptedPlansStayOnlyWhereTheConfigRunsThem) {
  Coordinator before({.autotune_window = 1}, kTimeout);
  JoinAll(before, {"a", "b", "c", "d"});
  View known = before.view();
  ASSERT_TRUE(known.plan.autotuning);
  known.plan.autotuning = false;
  known.plan.teams = 2;
  known.plan.note = "autotune chose d=2";
  {
    Coordinator after({.autotune_window = 1}, kTimeout);
    absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->epoch, known.epoch);
    EXPECT_EQ(view->plan.teams, 2);
    EXPECT_EQ(view->plan.note, "autotune chose d=2");
  }
  {
    Coordinator after({.density = 0.05}, kTimeout);
    absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->epoch, known.epoch + 1);
    EXPECT_EQ(view->plan.density, 0.05);
    EXPECT_THAT(Ids(*view), ElementsAre("a", "b", "c", "d"));
  }
  {  // fusion as well
    Coordinator after({.fusion = "after_fusion", .autotune_window = 1},
                      kTimeout);
    absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->epoch, known.epoch + 1);
    EXPECT_EQ(view->plan.fusion, "after_fusion");
  }
  {  // every plan field of the config counts, exact_below as well
    Coordinator after({.exact_below = 7, .autotune_window = 1}, kTimeout);
    absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->epoch, known.epoch + 1);
    EXPECT_EQ(view->plan.exact_below, 7u);
  }
  {  // and the warm-up
    Coordinator after({.warmup_steps = 5, .autotune_window = 1}, kTimeout);
    absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->epoch, known.epoch + 1);
    EXPECT_EQ(view->plan.warmup_steps, 5u);
  }
  known.plan.autotuning = true;
  Coordinator after({.autotune_window = 1}, kTimeout);
  absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, known.epoch + 1);
  EXPECT_TRUE(view->plan.autotuning);
}

TEST(CoordinatorTest, RejectsBadInput) {
  Coordinator coordinator({}, kTimeout);
  EXPECT_EQ(coordinator.Join(Node(""), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  MemberInfo no_address = Node("a");
  no_address.address.clear();
  EXPECT_EQ(coordinator.Join(no_address, kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator.view().epoch, 0u);
  EXPECT_EQ(coordinator.Heartbeat("ghost", kT0).code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(coordinator.Join(Node("a"), kT0).ok());
  for (double seconds :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(
        coordinator.Report({.node_id = "a", .epoch = 1, .seconds = seconds})
            .code(),
        absl::StatusCode::kInvalidArgument)
        << seconds;
    EXPECT_EQ(coordinator
                  .Report({.node_id = "a",
                           .epoch = 1,
                           .seconds = 0.1,
                           .period_seconds = seconds})
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << "period " << seconds;
  }
  EXPECT_THAT(coordinator.last_iteration_seconds(), IsEmpty());
}

TEST(CoordinatorTest, UnusableConfigFailsEveryJoin) {
  const std::vector<PlanConfig> bad = {
      {.algorithm = "allgather-magic"},
      {.density = 0},
      {.density = 1.5},
      {.encoding = "zip"},
      {.chunk_bytes = 0},
      {.teams = -1},
      {.autotune_window = 0},
      {.retune_factor = 1},
      {.retune_factor = -2},
      {.retune_steps = 0},
      {.retune_steps = 100001},
      {.skip_factor = 0.5},
  };
  for (const PlanConfig& config : bad) {
    Coordinator coordinator(config, kTimeout);
    EXPECT_EQ(coordinator.Join(Node("a"), kT0).status().code(),
              absl::StatusCode::kInvalidArgument)
        << config.algorithm << " " << config.density;
    EXPECT_EQ(coordinator.view().epoch, 0u);
  }
  Coordinator no_timeout({}, absl::ZeroDuration());
  EXPECT_EQ(no_timeout.Join(Node("a"), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, TickRemovesSilentMembersAfterTheTimeout) {
  Coordinator coordinator({}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c"});
  ASSERT_TRUE(coordinator.Heartbeat("c", kT0 + absl::Seconds(8)).ok());

  // Exactly heartbeat_timeout old: still alive.
  coordinator.Tick(kT0 + kTimeout);
  EXPECT_EQ(coordinator.view().epoch, 3u);
  EXPECT_EQ(coordinator.view().members.size(), 3u);

  // One nanosecond later a and b go, in one epoch; c heartbeat at +8 s.
  coordinator.Tick(kT0 + kTimeout + absl::Nanoseconds(1));
  EXPECT_EQ(coordinator.view().epoch, 4u);
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("c"));

  // Nothing more to remove: no epoch.
  coordinator.Tick(kT0 + absl::Seconds(18));
  EXPECT_EQ(coordinator.view().epoch, 4u);

  // The removed worker learns it from its heartbeat and joins the next epoch.
  const absl::Time later = kT0 + absl::Seconds(12);
  EXPECT_EQ(coordinator.Heartbeat("a", later).code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<View> view = coordinator.Join(Node("a"), later);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 5u);
  EXPECT_THAT(Ids(*view), ElementsAre("a", "c"));
  // Its join counts as seen: c (last seen at +8 s) goes first.
  coordinator.Tick(kT0 + absl::Seconds(19));
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("a"));
  EXPECT_EQ(coordinator.view().epoch, 6u);
}

// A member that the others report they cannot reach (a black-holed link;
// it still heartbeats) is removed once the reports have stood a heartbeat
// timeout, in one epoch; the node may not join again for the quarantine,
// whatever its process, and the reports do not outlive the change.
TEST(CoordinatorTest, AMemberTheOthersCannotReachIsRemovedAndKeptOut) {
  constexpr absl::Duration kQuarantine = absl::Seconds(30);
  Coordinator coordinator({}, kTimeout, kQuarantine);
  JoinAll(coordinator, {"a", "b"});
  // A report made before a membership change does not survive it: kept,
  // a's would date from kT0 and remove b at kT0 + kTimeout.
  ASSERT_TRUE(coordinator.Heartbeat("a", kT0, {"b"}).ok());
  ASSERT_TRUE(coordinator.Join(Node("c"), kT0).ok());
  const uint64_t epoch = coordinator.view().epoch;
  const absl::Time t1 = kT0 + absl::Seconds(1);
  ASSERT_TRUE(coordinator.Heartbeat("a", t1, {"b", "nobody"}).ok());
  ASSERT_TRUE(coordinator.Heartbeat("b", t1).ok());
  ASSERT_TRUE(coordinator.Heartbeat("c", t1).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      coordinator.Heartbeat("c", t1, {"a", "b", "c", "d"})));
  EXPECT_EQ(coordinator.Tick(kT0 + kTimeout), std::nullopt);
  EXPECT_EQ(coordinator.view().epoch, epoch);
  // c's report comes later: nothing until it has stood the timeout too.
  const absl::Time t2 = kT0 + kTimeout;
  ASSERT_TRUE(coordinator.Heartbeat("c", t2, {"b"}).ok());
  EXPECT_EQ(coordinator.Tick(t1 + kTimeout), std::nullopt);
  const absl::Time t3 = t2 + kTimeout - absl::Seconds(1);
  ASSERT_TRUE(coordinator.Heartbeat("a", t3, {"b"}).ok());
  ASSERT_TRUE(coordinator.Heartbeat("b", t3).ok());
  ASSERT_TRUE(coordinator.Heartbeat("c", t3, {"b"}).ok());
  const std::optional<Coordinator::LinkRemoval> removed =
      coordinator.Tick(t2 + kTimeout);
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->node_id, "b");
  EXPECT_THAT(removed->reporters, ElementsAre("a", "c"));
  EXPECT_EQ(removed->kept_out, kQuarantine);
  EXPECT_EQ(coordinator.view().epoch, epoch + 1);
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("a", "c"));

  const absl::Time later = t2 + kTimeout + absl::Seconds(1);
  EXPECT_TRUE(absl::IsNotFound(coordinator.Heartbeat("b", later)));
  EXPECT_TRUE(absl::IsUnavailable(coordinator.Join(Node("b"), later).status()));
  MemberInfo restarted = Node("b");
  restarted.incarnation = 2;
  EXPECT_TRUE(absl::IsUnavailable(coordinator.Join(restarted, later).status()));
  EXPECT_EQ(coordinator.view().epoch, epoch + 1);
  const absl::Time back = t2 + kTimeout + kQuarantine;
  // It joins having reached every member of the view it watched.
  const View watched = coordinator.view();
  ASSERT_TRUE(
      coordinator.Join(restarted, back, &watched, std::vector<std::string>{})
          .ok());
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("a", "b", "c"));
  // The reports of a and c about b were about the old view: named again,
  // they start over (kept, they would date from t1 and t2, and remove b).
  ASSERT_TRUE(coordinator.Heartbeat("a", back, {"b"}).ok());
  ASSERT_TRUE(coordinator.Heartbeat("c", back, {"b"}).ok());
  EXPECT_EQ(coordinator.Tick(back + absl::Seconds(1)), std::nullopt);
}

// A node removed for its link comes back after its quarantine only if it
// reaches every member as it joins (issue: a link still bad when the
// quarantine ended cut the others' steps again until reported once more).
TEST(CoordinatorTest, ANodeRemovedForItsLinkReturnsOnlyOnceItReachesEveryone) {
  constexpr absl::Duration kQuarantine = absl::Seconds(30);
  using Names = std::vector<std::string>;
  Coordinator coordinator({}, kTimeout, kQuarantine);
  JoinAll(coordinator, {"a", "b", "c"});
  const View before = coordinator.view();
  const absl::Time t = kT0 + absl::Seconds(1);
  ASSERT_TRUE(coordinator.Heartbeat("a", t, {"b"}).ok());
  ASSERT_TRUE(coordinator.Heartbeat("c", t, {"b"}).ok());
  ASSERT_TRUE(coordinator.Heartbeat("b", t).ok());
  ASSERT_TRUE(coordinator.Tick(t + kTimeout).has_value());
  const View after = coordinator.view();  // what b sees through its watch
  const uint64_t epoch = after.epoch;

  const absl::Time back = t + kTimeout + kQuarantine;
  // It must have called the members of a view that lists every member: a
  // new process without a view, or a join without a probe, is sent back.
  EXPECT_TRUE(
      absl::IsFailedPrecondition(coordinator.Join(Node("b"), back).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      coordinator.Join(Node("b"), back, &after).status()));
  View partial = after;
  partial.members.pop_back();
  EXPECT_TRUE(absl::IsFailedPrecondition(
      coordinator.Join(Node("b"), back, &partial, Names{}).status()));
  const absl::Status still_cut =
      coordinator.Join(Node("b"), back, &after, Names{"a", "d"}).status();
  EXPECT_TRUE(absl::IsUnavailable(still_cut)) << still_cut;
  EXPECT_THAT(still_cut.message(), HasSubstr("still cannot reach a:"));
  EXPECT_EQ(coordinator.view().epoch, epoch);
  // Naming only itself, or nodes that are no members, keeps nobody out.
  ASSERT_TRUE(coordinator.Join(Node("b"), back, &after, Names{"b", "d"}).ok());
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("a", "b", "c"));

  // A node never removed joins whatever it names (its peers may be dead and
  // not yet noticed); more names than its view has are refused.
  ASSERT_TRUE(coordinator.Join(Node("e"), back, &before, Names{"a"}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      coordinator.Join(Node("f"), back, &before, Names{"a", "b", "c", "d"})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      coordinator.Join(Node("f"), back, nullptr, Names{"a"}).status()));
}

// A node back from its quarantine is on probation: the views list it so
// (a zero length), and a restarted coordinator that adopts one keeps it
// on probation, so that a new process of it must reach every member first
// (before: the restarted coordinator let it in without a probe).
TEST(CoordinatorTest, ARestartedCoordinatorKeepsTheProbationOfTheView) {
  constexpr absl::Duration kQuarantine = absl::Seconds(30);
  const PlanConfig fixed{.algorithm = "spardl", .teams = 1};
  Coordinator first(fixed, kTimeout, kQuarantine);
  JoinAll(first, {"a", "b", "c"});
  const absl::Time t = kT0 + absl::Seconds(1);
  ASSERT_TRUE(first.Heartbeat("a", t, {"b"}).ok());
  ASSERT_TRUE(first.Heartbeat("c", t, {"b"}).ok());
  ASSERT_TRUE(first.Heartbeat("b", t).ok());
  ASSERT_TRUE(first.Tick(t + kTimeout).has_value());
  const View after = first.view();
  const absl::Time back = t + kTimeout + kQuarantine;
  ASSERT_TRUE(
      first.Join(Node("b"), back, &after, std::vector<std::string>{}).ok());
  const View rejoined = first.view();
  EXPECT_THAT(Ids(rejoined), ElementsAre("a", "b", "c"));
  ASSERT_EQ(rejoined.kept_out.size(), 1u);
  EXPECT_EQ(rejoined.kept_out[0],
            (LinkReports::Quarantine{
                .node_id = "b", .length = absl::ZeroDuration(), .strikes = 1}));

  Coordinator restarted(fixed, kTimeout, kQuarantine);
  const absl::Time later = back + absl::Seconds(5);
  ASSERT_TRUE(restarted.Join(Node("a"), later, &rejoined).ok());
  EXPECT_THAT(Ids(restarted.view()), ElementsAre("a", "b", "c"));
  MemberInfo b = Node("b");
  b.incarnation = 7;  // a new process of b, with no view
  EXPECT_TRUE(absl::IsFailedPrecondition(restarted.Join(b, later).status()));
  EXPECT_TRUE(
      restarted.Join(b, later, &rejoined, std::vector<std::string>{}).ok());
}

// The views list the nodes kept out, and a restarted coordinator keeps them
// out for their whole quarantine, whether a survivor or the removed node
// joins it first (issue: a restarted coordinator let the node back at once).
TEST(CoordinatorTest, ARestartedCoordinatorKeepsTheQuarantinesOfTheView) {
  constexpr absl::Duration kQuarantine = absl::Seconds(30);
  // A fixed plan: a coordinator that adopts a view republishes nothing.
  const PlanConfig fixed{.algorithm = "spardl", .teams = 1};
  Coordinator first(fixed, kTimeout, kQuarantine);
  JoinAll(first, {"a", "b", "c"});
  const View before = first.view();  // what b still runs
  const absl::Time t = kT0 + absl::Seconds(1);
  ASSERT_TRUE(first.Heartbeat("a", t, {"b"}).ok());
  ASSERT_TRUE(first.Heartbeat("c", t, {"b"}).ok());
  ASSERT_TRUE(first.Heartbeat("b", t).ok());
  ASSERT_TRUE(first.Tick(t + kTimeout).has_value());
  const View after = first.view();  // what a and c run
  EXPECT_THAT(Ids(after), ElementsAre("a", "c"));
  ASSERT_EQ(after.kept_out.size(), 1u);
  EXPECT_EQ(after.kept_out[0],
            (LinkReports::Quarantine{
                .node_id = "b", .length = kQuarantine, .strikes = 1}));

  // A survivor joins the restarted coordinator first: b stays out.
  const absl::Time restart = t + kTimeout + absl::Seconds(5);
  Coordinator survivor_first({}, kTimeout, kQuarantine);
  ASSERT_TRUE(survivor_first.Join(Node("a"), restart, &after).ok());
  EXPECT_TRUE(absl::IsUnavailable(
      survivor_first.Join(Node("b"), restart, &before).status()));
  EXPECT_THAT(Ids(survivor_first.view()), ElementsAre("a", "c"));
  EXPECT_TRUE(survivor_first
                  .Join(Node("b"), restart + kQuarantine, &after,
                        std::vector<std::string>{})
                  .ok());

  // b joins first with its older view, which lists it, and the coordinator
  // adopts that: a survivor's heartbeat, from a newer epoch, is answered
  // NotFound, and its Join brings the newer view; b is removed in a new
  // epoch past every one the members run.
  Coordinator removed_first(fixed, kTimeout, kQuarantine);
  ASSERT_TRUE(removed_first.Join(Node("b"), restart, &before).ok());
  EXPECT_THAT(Ids(removed_first.view()), ElementsAre("a", "b", "c"));
  EXPECT_EQ(removed_first.view().epoch, before.epoch);
  EXPECT_TRUE(
      absl::IsNotFound(removed_first.Heartbeat("a", restart, {}, after.epoch)));
  EXPECT_TRUE(removed_first.Heartbeat("c", restart, {}, before.epoch).ok());
  const absl::StatusOr<View> joined =
      removed_first.Join(Node("a"), restart, &after);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_THAT(Ids(*joined), ElementsAre("a", "c"));
  EXPECT_GT(joined->epoch, after.epoch);
  EXPECT_TRUE(absl::IsUnavailable(
      removed_first.Join(Node("b"), restart, &before).status()));

  // Heartbeats naming another coordinator's view at the current epoch are
  // sent to join again too (adopting b's view may republish it at the very
  // epoch the survivors run: equal epochs, different views); once they hold
  // this coordinator's view, they are not.
  Coordinator adopted(fixed, kTimeout, kQuarantine);
  ASSERT_TRUE(adopted.Join(Node("a"), restart, &after).ok());
  const View ours = adopted.view();
  ASSERT_EQ(ours.epoch, after.epoch);
  EXPECT_TRUE(absl::IsNotFound(
      adopted.Heartbeat("c", restart, {}, after.epoch, after.incarnation)));
  EXPECT_TRUE(
      adopted.Heartbeat("c", restart, {}, ours.epoch, ours.incarnation).ok());

  // A view of this coordinator's own epoch adds nothing (a member that lost
  // contact joins again): its list does not restart a quarantine.
  Coordinator running({}, kTimeout, kQuarantine);
  ASSERT_TRUE(running.Join(Node("a"), restart, &after).ok());
  const View own = running.view();
  ASSERT_TRUE(running.Join(Node("a"), restart + kQuarantine, &own).ok());
  EXPECT_TRUE(running
                  .Join(Node("b"), restart + kQuarantine, &own,
                        std::vector<std::string>{})
                  .ok());

  // A view keeping out more nodes than any cluster has is refused.
  View crowded = after;
  crowded.kept_out.assign(Coordinator::kMaxKeptOut + 1, after.kept_out[0]);
  Coordinator fresh({}, kTimeout, kQuarantine);
  EXPECT_TRUE(absl::IsInvalidArgument(
      fresh.Join(Node("a"), restart, &crowded).status()));
  EXPECT_EQ(fresh.view().epoch, 0u);
}

// A coordinator paused (SIGSTOP, a starved VM) heard no heartbeats while it
// was: that silence is excused, and only the silence it watched counts.
TEST(CoordinatorTest, SilenceTheCoordinatorDidNotWatchIsExcused) {
  Coordinator coordinator({}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  ASSERT_TRUE(coordinator.Heartbeat("b", kT0 + absl::Seconds(4)).ok());
  const absl::Duration paused = absl::Seconds(30);
  const absl::Time resumed = kT0 + absl::Seconds(6) + paused;
  coordinator.Excuse(paused, resumed);
  coordinator.Tick(resumed);
  EXPECT_EQ(coordinator.view().members.size(), 2u);
  // a was last seen at kT0, 6 s of watched silence before the pause.
  coordinator.Tick(kT0 + paused + kTimeout);
  EXPECT_EQ(coordinator.view().members.size(), 2u);
  coordinator.Tick(kT0 + paused + kTimeout + absl::Nanoseconds(1));
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("b"));
  // Never into the future: an excuse longer than the time since a member's
  // heartbeat leaves it seen at `now`.
  coordinator.Excuse(absl::Hours(1), resumed + absl::Seconds(1));
  coordinator.Tick(resumed + absl::Seconds(1) + kTimeout);
  EXPECT_THAT(Ids(coordinator.view()), ElementsAre("b"));
  coordinator.Tick(resumed + absl::Seconds(1) + kTimeout +
                   absl::Nanoseconds(1));
  EXPECT_TRUE(coordinator.view().members.empty());
}

TEST(CoordinatorTest, WaitForViewWakesOnAChangeFromAnotherThread) {
  Coordinator coordinator({}, kTimeout);
  JoinAll(coordinator, {"a"});
  std::thread joiner([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(coordinator.Join(Node("b"), kT0).ok());
  });
  const absl::Time start = absl::Now();
  const View view = coordinator.WaitForView(1, start + absl::Seconds(30));
  joiner.join();
  EXPECT_EQ(view.epoch, 2u);
  EXPECT_THAT(Ids(view), ElementsAre("a", "b"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(CoordinatorTest, WaitForViewReturnsAtTheDeadline) {
  Coordinator coordinator({}, kTimeout);
  JoinAll(coordinator, {"a"});
  const absl::Time start = absl::Now();
  const View view = coordinator.WaitForView(1, start + absl::Milliseconds(30));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  EXPECT_EQ(view.epoch, 1u);
  // An epoch already past returns at once.
  EXPECT_EQ(coordinator.WaitForView(0, absl::InfiniteFuture()).epoch, 1u);
}

TEST(CoordinatorTest, ReportsFeedLastIterationSeconds) {
  Coordinator coordinator({.algorithm = "dense"}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  ASSERT_TRUE(
      coordinator.Report({.node_id = "a", .epoch = 2, .seconds = 0.5}).ok());
  // Stale epoch and non-member: ignored without error.
  ASSERT_TRUE(
      coordinator.Report({.node_id = "b", .epoch = 1, .seconds = 0.7}).ok());
  ASSERT_TRUE(
      coordinator.Report({.node_id = "z", .epoch = 2, .seconds = 0.9}).ok());
  const auto seconds = coordinator.last_iteration_seconds();
  ASSERT_EQ(seconds.size(), 1u);
  EXPECT_EQ(seconds.at("a"), 0.5);
  // A member that leaves takes its figures along.
  ASSERT_TRUE(coordinator.Leave("a").ok());
  EXPECT_THAT(coordinator.last_iteration_seconds(), IsEmpty());
}

// ---- Plan ----

TEST(PlanTest, OtherAlgorithmsUseOneTeamAndNoAutotune) {
  Coordinator coordinator(
      {.algorithm = "topka", .density = 0.05, .encoding = "auto"}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c", "d"});
  const View view = coordinator.view();
  EXPECT_EQ(view.epoch, 4u);
  EXPECT_EQ(view.plan.algorithm, "topka");
  EXPECT_EQ(view.plan.density, 0.05);
  EXPECT_EQ(view.plan.encoding, "auto");
  EXPECT_EQ(view.plan.teams, 1);
  EXPECT_FALSE(view.plan.autotuning);
  EXPECT_THAT(coordinator.trials(), IsEmpty());
}

TEST(PlanTest, FixedTeamsApplyWhereTheyDivideP) {
  Coordinator coordinator({.teams = 2}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c"});
  EXPECT_EQ(coordinator.view().plan.teams, 1);
  EXPECT_THAT(coordinator.view().plan.note, HasSubstr("does not divide P=3"));
  JoinAll(coordinator, {"d"});
  EXPECT_EQ(coordinator.view().plan.teams, 2);
  EXPECT_FALSE(coordinator.view().plan.autotuning);
  EXPECT_EQ(coordinator.view().plan.note, "");
  EXPECT_THAT(coordinator.trials(), IsEmpty());
}

TEST(PlanTest, SingleMemberNeedsNoAutotune) {
  Coordinator coordinator({}, kTimeout);
  JoinAll(coordinator, {"a"});
  EXPECT_EQ(coordinator.view().plan.teams, 1);
  EXPECT_FALSE(coordinator.view().plan.autotuning);
  EXPECT_THAT(coordinator.trials(), IsEmpty());
}

// ---- Autotune ----

// With the default teams margin (1.25), d=4 at 1.2 ms wins over d=2 at
// 1.0 ms: the larger d, close enough to the fastest.
TEST(AutotuneTest, KeepsTheLargestDWithinTheTeamsMargin) {
  constexpr int kWindow = 2;
  Coordinator coordinator({.autotune_window = kWindow}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c", "d"});
  ASSERT_THAT(TrialTeams(coordinator), ElementsAre(4, 2, 1));
  for (double seconds : {1.2e-3, 1e-3, 2e-3}) {
    RunTrial(coordinator, kWindow, seconds);
  }
  const View view = coordinator.view();
  EXPECT_FALSE(view.plan.autotuning);
  EXPECT_EQ(view.plan.teams, 4);
  EXPECT_THAT(view.plan.note,
              HasSubstr("the largest d within 1.25x of the fastest, d=2"));
}

TEST(AutotuneTest, TriesEachDivisorOnceAndKeepsTheFastest) {
  constexpr int kWindow = 3;
  Coordinator coordinator({.autotune_window = kWindow}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c", "d"});
  const uint64_t start = coordinator.view().epoch;
  ASSERT_EQ(start, 4u);
  // n unknown: ranked by rounds, d=4 (2 rounds), d=2 (3), d=1 (4).
  EXPECT_THAT(TrialTeams(coordinator), ElementsAre(4, 2, 1));

  const std::vector<std::pair<int, double>> expected = {
      {4, 3e-3}, {2, 1e-3}, {1, 2e-3}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const View view = coordinator.view();
    EXPECT_EQ(view.epoch, start + i);
    EXPECT_EQ(view.plan.teams, expected[i].first);
    EXPECT_TRUE(view.plan.autotuning);
    RunTrial(coordinator, kWindow, expected[i].second);
  }

  const View final_view = coordinator.view();
  EXPECT_EQ(final_view.epoch, start + 3);
  EXPECT_EQ(final_view.plan.teams, 2);
  EXPECT_FALSE(final_view.plan.autotuning);
  EXPECT_EQ(final_view.plan.note,
            "autotune chose d=2 (1.000 ms) over d=4 (3.000 ms), "
            "d=1 (2.000 ms)");
  const std::vector<Trial> trials = coordinator.trials();
  ASSERT_EQ(trials.size(), 3u);
  for (size_t i = 0; i < trials.size(); ++i) {
    EXPECT_EQ(trials[i].iterations, kWindow);
    EXPECT_DOUBLE_EQ(trials[i].mean_seconds, expected[i].second);
    EXPECT_FALSE(trials[i].skipped);
  }
  // Reports after the round change nothing.
  RunTrial(coordinator, kWindow, 1.0);
  EXPECT_EQ(coordinator.view().epoch, start + 3);
}

// Membership views apply at once; a plan change of the same members starts
// switch_lead_steps past the highest step reported, and the first step each
// trial completes is its warm-up, whatever its number.
TEST(AutotuneTest, PlanChangesStartAfterTheHighestReportedStep) {
  Coordinator coordinator({.autotune_window = 2, .switch_lead_steps = 3},
                          kTimeout);
  JoinAll(coordinator, {"a", "b"});
  EXPECT_EQ(coordinator.view().start_step, 0u);
  const uint64_t epoch = coordinator.view().epoch;
  // Steps 40 (warm-up), 41 and 42 make the first trial.
  for (uint64_t step = 40; step <= 42; ++step) {
    EXPECT_EQ(coordinator.view().epoch, epoch);
    ReportOperation(coordinator, step, 1e-3);
  }
  View next = coordinator.view();
  EXPECT_EQ(next.epoch, epoch + 1);
  EXPECT_EQ(next.start_step, 45u);
  // The next trial's warm-up is its first completed step (45), not step 0.
  for (uint64_t step = 45; step <= 46; ++step) {
    ReportOperation(coordinator, step, 2e-3);
  }
  EXPECT_EQ(coordinator.view().epoch, epoch + 1);
  ReportOperation(coordinator, 47, 2e-3);
  next = coordinator.view();
  EXPECT_EQ(next.epoch, epoch + 2);
  EXPECT_FALSE(next.plan.autotuning);
  EXPECT_EQ(next.start_step, 50u);
  // A membership change applies at once.
  ASSERT_TRUE(coordinator.Join(Node("c"), kT0).ok());
  EXPECT_EQ(coordinator.view().start_step, 0u);
}

TEST(AutotuneTest, MeanIsOverTheSlowestMemberOfEachOperation) {
  Coordinator coordinator({.autotune_window = 2}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  ReportOperation(coordinator, 0, 100.0);  // warm-up: not counted
  ReportOperation(coordinator, 1, 2e-3);
  ReportOperation(coordinator, 2, 4e-3);
  ASSERT_EQ(coordinator.trials().size(), 2u);
  EXPECT_DOUBLE_EQ(coordinator.trials()[0].mean_seconds, 3e-3);
}

TEST(AutotuneTest, StaleEpochAndIncompleteOperationsDoNotCount) {
  constexpr int kWindow = 2;
  Coordinator coordinator({.autotune_window = kWindow}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  const uint64_t epoch = coordinator.view().epoch;

  // Reports for the previous epoch (P = 1) are ignored.
  for (uint64_t op = 0; op <= kWindow; ++op) {
    for (const char* id : {"a", "b"}) {
      ASSERT_TRUE(coordinator
                      .Report({.node_id = id,
                               .epoch = epoch - 1,
                               .operation = op,
                               .seconds = 1e-3})
                      .ok());
    }
  }
  EXPECT_EQ(coordinator.view().epoch, epoch);
  EXPECT_EQ(coordinator.trials()[0].iterations, 0);
  EXPECT_THAT(coordinator.last_iteration_seconds(), IsEmpty());

  // Only a reports: no operation completes while b may still report it.
  for (uint64_t op = 0; op <= 7; ++op) {
    ASSERT_TRUE(coordinator
                    .Report({.node_id = "a",
                             .epoch = epoch,
                             .operation = op,
                             .seconds = 1e-3})
                    .ok());
  }
  EXPECT_EQ(coordinator.view().epoch, epoch);
  EXPECT_EQ(coordinator.trials()[0].iterations, 0);

  // b completes operation 0 (warm-up) and 1: one counted.
  for (uint64_t op : {0, 1}) {
    ASSERT_TRUE(coordinator
                    .Report({.node_id = "b",
                             .epoch = epoch,
                             .operation = op,
                             .seconds = 5e-3})
                    .ok());
  }
  EXPECT_EQ(coordinator.trials()[0].iterations, 1);
  // A repeated report of a completed operation counts nothing.
  ASSERT_TRUE(
      coordinator
          .Report(
              {.node_id = "b", .epoch = epoch, .operation = 1, .seconds = 5e-3})
          .ok());
  EXPECT_EQ(coordinator.trials()[0].iterations, 1);
  EXPECT_EQ(coordinator.view().epoch, epoch);

  ASSERT_TRUE(
      coordinator
          .Report(
              {.node_id = "b", .epoch = epoch, .operation = 2, .seconds = 5e-3})
          .ok());
  EXPECT_EQ(coordinator.view().epoch, epoch + 1);
  EXPECT_EQ(coordinator.trials()[0].iterations, kWindow);
  EXPECT_DOUBLE_EQ(coordinator.trials()[0].mean_seconds, 5e-3);
}

// A member's reports come in order: its report of a later step says that
// its report of an earlier one was lost, which then counts without it.
TEST(AutotuneTest, AReportLostBeforeALaterOneCountsWithoutIt) {
  Coordinator coordinator({.autotune_window = 2}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  const uint64_t epoch = coordinator.view().epoch;
  auto report = [&](const char* node, uint64_t op, double seconds) {
    ASSERT_TRUE(coordinator
                    .Report({.node_id = node,
                             .epoch = epoch,
                             .operation = op,
                             .seconds = seconds})
                    .ok());
  };
  report("a", 0, 1e-3);
  report("b", 0, 1e-3);  // 0 warms up
  report("a", 1, 4e-3);  // b's report of 1 is lost
  EXPECT_EQ(coordinator.trials()[0].iterations, 0);
  report("b", 2, 2e-3);  // ... as b's report of 2 shows: 1 counts
  EXPECT_EQ(coordinator.trials()[0].iterations, 1);
  report("a", 2, 2e-3);
  EXPECT_EQ(coordinator.view().epoch, epoch + 1);
  EXPECT_DOUBLE_EQ(coordinator.trials()[0].mean_seconds, 3e-3);
}

// Reports are best effort: b's never arrive, and the trial still ends, each
// operation counted with a's report once a step 8 later is reported.
TEST(AutotuneTest, LostReportsDoNotStallTheTrial) {
  constexpr int kWindow = 2;
  Coordinator coordinator({.autotune_window = kWindow}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  const uint64_t epoch = coordinator.view().epoch;
  auto report_a = [&](uint64_t op) {
    ASSERT_TRUE(coordinator
                    .Report({.node_id = "a",
                             .epoch = epoch,
                             .operation = op,
                             .seconds = 2e-3})
                    .ok());
  };
  for (uint64_t op = 0; op <= 9; ++op) report_a(op);
  // 0 warmed up, 1 counted.
  EXPECT_EQ(coordinator.trials()[0].iterations, 1);
  EXPECT_EQ(coordinator.view().epoch, epoch);
  report_a(10);
  EXPECT_EQ(coordinator.view().epoch, epoch + 1);
  EXPECT_EQ(coordinator.trials()[0].iterations, kWindow);
  EXPECT_DOUBLE_EQ(coordinator.trials()[0].mean_seconds, 2e-3);
}

TEST(AutotuneTest, MembershipChangeRestartsTheRound) {
  constexpr int kWindow = 2;
  Coordinator coordinator({.autotune_window = kWindow}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c", "d"});
  RunTrial(coordinator, kWindow, 1e-3);  // d=4 done
  ReportOperation(coordinator, 0, 1e-3);
  ReportOperation(coordinator, 1, 1e-3);  // d=2 half done
  const uint64_t epoch = coordinator.view().epoch;
  EXPECT_EQ(coordinator.trials()[1].iterations, 1);

  ASSERT_TRUE(coordinator.Leave("d").ok());
  const View view = coordinator.view();
  EXPECT_EQ(view.epoch, epoch + 1);
  EXPECT_TRUE(view.plan.autotuning);
  // P = 3: d in {1, 3}; n is known now, so the model ranks them.
  const std::vector<Trial> trials = coordinator.trials();
  ASSERT_EQ(trials.size(), 2u);
  for (const Trial& trial : trials) EXPECT_EQ(trial.iterations, 0);
  EXPECT_EQ(view.plan.teams, trials[0].teams);
  EXPECT_LE(trials[0].modeled_seconds, trials[1].modeled_seconds);

  RunTrial(coordinator, kWindow, 2e-3);
  RunTrial(coordinator, kWindow, 1e-3);
  EXPECT_EQ(coordinator.view().epoch, epoch + 3);
  EXPECT_EQ(coordinator.view().plan.teams, trials[1].teams);
  EXPECT_FALSE(coordinator.view().plan.autotuning);

  // A new member starts a new round.
  JoinAll(coordinator, {"e"});
  EXPECT_TRUE(coordinator.view().plan.autotuning);
  EXPECT_THAT(TrialTeams(coordinator),
              ::testing::UnorderedElementsAre(1, 2, 4));
}

TEST(AutotuneTest, SkipsCandidatesModeledHopelesslySlow) {
  // Bandwidth only: P = 8 receives 14k (d=1, d=2), 16k (d=4) and 24k (d=8)
  // values' worth of bytes; 24/14 > 1.5 > 16/14.
  constexpr int kWindow = 1;
  Coordinator coordinator({.autotune_window = kWindow,
                           .skip_factor = 1.5,
                           .link = {.alpha_s = 0, .beta_s_per_byte = 1e-9}},
                          kTimeout);
  // n becomes known while alone.
  JoinAll(coordinator, {"a"});
  ReportOperation(coordinator, 0, 1e-3);
  JoinAll(coordinator, {"b", "c", "d", "e", "f", "g", "h"});

  const std::vector<Trial> trials = coordinator.trials();
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials.back().teams, 8);
  EXPECT_TRUE(trials.back().skipped);
  EXPECT_DOUBLE_EQ(trials.back().modeled_seconds,
                   ModelSeconds(SparDlCost(8, 8, kN, 0.01),
                                {.alpha_s = 0, .beta_s_per_byte = 1e-9}));
  for (size_t i = 0; i + 1 < trials.size(); ++i) {
    EXPECT_FALSE(trials[i].skipped);
    EXPECT_LE(trials[i].modeled_seconds, trials[i + 1].modeled_seconds);
  }
  EXPECT_THAT(TrialTeams(coordinator), ElementsAre(1, 2, 4, 8));

  const uint64_t start = coordinator.view().epoch;
  std::vector<int> tried;
  while (coordinator.view().plan.autotuning) {
    tried.push_back(coordinator.view().plan.teams);
    RunTrial(coordinator, kWindow, tried.size() * 1e-3);
  }
  EXPECT_THAT(tried, ElementsAre(1, 2, 4));
  EXPECT_EQ(coordinator.view().epoch, start + 3);
  EXPECT_EQ(coordinator.view().plan.teams, 1);
  EXPECT_THAT(coordinator.view().plan.note,
              HasSubstr("; skipped d=8 (modeled over 1.5x the best)"));
}

TEST(AutotuneTest, RanksUntriedCandidatesOnceTheFirstTrialTellsN) {
  // n unknown: d=8 (3 rounds) goes first. Its reports tell n, and then d=4
  // (16k against 14k, over 1.1x) is skipped.
  constexpr int kWindow = 1;
  Coordinator coordinator({.autotune_window = kWindow,
                           .skip_factor = 1.1,
                           .link = {.alpha_s = 0, .beta_s_per_byte = 1e-9}},
                          kTimeout);
  JoinAll(coordinator, {"a", "b", "c", "d", "e", "f", "g", "h"});
  EXPECT_THAT(TrialTeams(coordinator), ElementsAre(8, 4, 2, 1));
  for (const Trial& trial : coordinator.trials()) EXPECT_FALSE(trial.skipped);

  RunTrial(coordinator, kWindow, 1e-3);
  EXPECT_THAT(TrialTeams(coordinator), ElementsAre(8, 1, 2, 4));
  EXPECT_TRUE(coordinator.trials()[3].skipped);
  EXPECT_EQ(coordinator.view().plan.teams, 1);
}

TEST(AutotuneTest, RefitsTheLinkModelFromReports) {
  // Reports whose seconds follow alpha = 20 us, beta = 1 ns/byte exactly.
  const LinkModel truth{.alpha_s = 2e-5, .beta_s_per_byte = 1e-9};
  constexpr int kWindow = 2;
  Coordinator coordinator({.autotune_window = kWindow}, kTimeout);
  JoinAll(coordinator, {"a", "b", "c", "d"});
  EXPECT_EQ(coordinator.link().alpha_s, PlanConfig{}.link.alpha_s);
  while (coordinator.view().plan.autotuning) {
    const View view = coordinator.view();
    const CommCost cost = SparDlCost(4, view.plan.teams, kN, 0.01);
    for (uint64_t op = 0; op <= kWindow; ++op) {
      for (const MemberInfo& member : view.members) {
        // Members receive slightly different amounts; seconds follow them.
        const double bytes = std::floor(cost.bytes) + member.node_id[0] * 100;
        ASSERT_TRUE(
            coordinator
                .Report({.node_id = member.node_id,
                         .epoch = view.epoch,
                         .operation = op,
                         .seconds = ModelSeconds({cost.rounds, bytes}, truth),
                         .rounds = cost.rounds,
                         .bytes_received = static_cast<uint64_t>(bytes),
                         .values = kN})
                .ok());
      }
    }
  }
  const LinkModel fitted = coordinator.link();
  EXPECT_NEAR(fitted.alpha_s, truth.alpha_s, 1e-6 * truth.alpha_s);
  EXPECT_NEAR(fitted.beta_s_per_byte, truth.beta_s_per_byte,
              1e-6 * truth.beta_s_per_byte);
}

// ---- The algorithm per bucket size (`auto`) ----

// Every member reports a bucket of kN values and one of kSmall at `step`.
void ReportTwoBuckets(Coordinator& coordinator, uint64_t step, double large,
                      double small) {
  constexpr uint64_t kSmall = 50'000;
  const View view = coordinator.view();
  for (const MemberInfo& member : view.members) {
    for (const auto& [n, seconds] : {std::pair{kN, large}, {kSmall, small}}) {
      ASSERT_TRUE(coordinator
                      .Report({.node_id = member.node_id,
                               .epoch = view.epoch,
                               .operation = step,
                               .seconds = seconds,
                               .rounds = 2,
                               .bytes_received = 1000,
                               .values = n})
                      .ok());
    }
  }
}

TEST(AutoTest, TriesEachDThenTheDenseRingAndPublishesThePerSizeChoice) {
  Coordinator coordinator({.algorithm = "auto", .autotune_window = 2},
                          kTimeout);
  JoinAll(coordinator, {"a", "b"});
  // Trials: d=2 and d=1 (ranked by rounds before n is known, then by the
  // model), then the dense ring (large 30 ms, small 1 ms).
  struct Step {
    std::string algorithm;
    double large, small;
  };
  uint64_t step = 0;
  for (const Step& trial :
       {Step{"spardl", 10e-3, 0.9e-3}, Step{"spardl", 12e-3, 0.8e-3},
        Step{"dense", 30e-3, 1e-3}}) {
    const View view = coordinator.view();
    ASSERT_TRUE(view.plan.autotuning);
    EXPECT_EQ(view.plan.algorithm, trial.algorithm);
    for (int i = 0; i < 3; ++i) {
      ReportTwoBuckets(coordinator, step++, trial.large, trial.small);
    }
    step = std::max(step, coordinator.view().start_step);
  }
  const View chosen = coordinator.view();
  EXPECT_FALSE(chosen.plan.autotuning);
  EXPECT_EQ(chosen.plan.algorithm, "spardl");
  EXPECT_THAT(chosen.plan.dense_sizes, ElementsAre(50'000u));
  EXPECT_THAT(chosen.plan.note, HasSubstr("auto chose spardl d="));
  ASSERT_EQ(coordinator.trials().size(), 3u);
  EXPECT_EQ(coordinator.trials()[2].algorithm, "dense");
}

// Runs a round of `auto` on the current members (d=2, d=1, the dense ring)
// from `*step`, the large bucket's all-reduce taking `spardl` and `dense`
// seconds (the small one 1 ms in every trial: dense).
void RunAutoRound(Coordinator& coordinator, uint64_t* step, double spardl,
                  double dense) {
  for (double large : {spardl, spardl, dense}) {
    *step = std::max(*step, coordinator.view().start_step);
    ASSERT_TRUE(coordinator.view().plan.autotuning);
    for (int i = 0; i < 3; ++i) {
      ReportTwoBuckets(coordinator, (*step)++, large, 1e-3);
    }
  }
  *step = std::max(*step, coordinator.view().start_step);
}

// A choice that stops fitting the link (the large bucket's all-reduce 3.5x
// its trial's time over retune_steps) starts a new round on the same
// members; the same time within the factor, a few slow steps, or a faster
// all-reduce do not.
TEST(AutoTest, AChangedLinkStartsANewRoundOnTheSameMembers) {
  Coordinator coordinator(
      {.algorithm = "auto", .autotune_window = 2, .retune_steps = 5}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  uint64_t step = 0;
  RunAutoRound(coordinator, &step, 30e-3, 10e-3);  // a fast link: dense
  const View dense = coordinator.view();
  ASSERT_FALSE(dense.plan.autotuning);
  ASSERT_EQ(dense.plan.algorithm, "dense");

  // 1.5x the trial's time, and one step at 100x: the median is 15 ms.
  for (int i = 0; i < 10; ++i) {
    ReportTwoBuckets(coordinator, step++, i == 3 ? 1.0 : 15e-3, 1e-3);
  }
  EXPECT_EQ(coordinator.view().epoch, dense.epoch);

  // The link slows: 35 ms a step, and a new round begins.
  for (int i = 0; i < 5; ++i) {
    ReportTwoBuckets(coordinator, step++, 35e-3, 1e-3);
  }
  const View again = coordinator.view();
  EXPECT_EQ(again.epoch, dense.epoch + 1);
  EXPECT_EQ(again.membership_epoch, dense.membership_epoch);
  EXPECT_EQ(Ids(again), Ids(dense));
  EXPECT_TRUE(again.plan.autotuning);
  EXPECT_EQ(again.start_step, step - 1 + 3);
  EXPECT_THAT(again.plan.note,
              HasSubstr("tuning again: the all-reduce of 1000000 values took "
                        "3.50x its trial's 10.000 ms (median of the last 5 "
                        "steps)"));

  RunAutoRound(coordinator, &step, 12e-3, 35e-3);  // now SparDL pays
  const View sparse = coordinator.view();
  EXPECT_FALSE(sparse.plan.autotuning);
  EXPECT_EQ(sparse.plan.algorithm, "spardl");
  EXPECT_THAT(sparse.plan.dense_sizes, ElementsAre(50'000u));
  EXPECT_THAT(sparse.plan.note, HasSubstr("; tuned again: the all-reduce"));

  // SparDL's 12 ms become 4 ms (a faster link, or its trial's warm-up):
  // no round, the choice stands.
  for (int i = 0; i < 5; ++i) {
    ReportTwoBuckets(coordinator, step++, 4e-3, 1e-3);
  }
  EXPECT_EQ(coordinator.view().epoch, sparse.epoch);
}

// A round the watch started that chose what the last one had: the next
// watch weighs twice the steps, so that rounds do not follow one another.
TEST(AutoTest, ARetuneThatChoosesTheSameWatchesLongerNextTime) {
  Coordinator coordinator(
      {.algorithm = "auto", .autotune_window = 2, .retune_steps = 5}, kTimeout);
  JoinAll(coordinator, {"a", "b"});
  uint64_t step = 0;
  RunAutoRound(coordinator, &step, 30e-3, 10e-3);
  for (int i = 0; i < 5; ++i) {  // over SparDL's 30 ms trial too
    ReportTwoBuckets(coordinator, step++, 35e-3, 1e-3);
  }
  ASSERT_TRUE(coordinator.view().plan.autotuning);
  RunAutoRound(coordinator, &step, 75e-3, 25e-3);  // dense again
  const View same = coordinator.view();
  ASSERT_EQ(same.plan.algorithm, "dense");
  for (int i = 0; i < 5; ++i) {
    ReportTwoBuckets(coordinator, step++, 80e-3, 1e-3);
  }
  EXPECT_EQ(coordinator.view().epoch, same.epoch);  // 5 steps: not yet
  for (int i = 0; i < 5; ++i) {
    ReportTwoBuckets(coordinator, step++, 80e-3, 1e-3);
  }
  EXPECT_TRUE(coordinator.view().plan.autotuning);
  EXPECT_THAT(coordinator.view().plan.note, HasSubstr("the last 10 steps"));
}

// Two buckets of one size on each of two members: a step counts once
// every member reported it, at its slowest report (b's 40 ms: 4x), not
// once two reports came (a's, 10 ms each); a late report of a counted step
// is ignored.
TEST(RetuneWatchTest, AStepIsEveryMembersSlowestReport) {
  RetuneWatch watch({{100, 10e-3}}, 2, {.factor = 2, .steps = 3});
  std::optional<std::string> why;
  for (uint64_t step = 0; step < 3 && !why.has_value(); ++step) {
    for (const auto& [node, seconds] :
         std::vector<std::pair<std::string, double>>{
             {"a", 10e-3}, {"a", 10e-3}, {"b", 40e-3}, {"b", 40e-3}}) {
      if (!why.has_value()) why = watch.Add(node, 100, step, seconds);
    }
    EXPECT_EQ(why.has_value(), step == 2) << step;
  }
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("took 4.00x its trial's 10.000 ms"));

  RetuneWatch late({{100, 10e-3}}, 2, {.factor = 2, .steps = 2});
  EXPECT_FALSE(late.Add("a", 100, 0, 10e-3).has_value());
  EXPECT_FALSE(late.Add("b", 100, 0, 10e-3).has_value());  // step 0 counted
  EXPECT_FALSE(late.Add("b", 100, 0, 90e-3).has_value());  // late: ignored
  EXPECT_FALSE(late.Add("a", 100, 1, 10e-3).has_value());
  EXPECT_FALSE(late.Add("b", 100, 1, 10e-3).has_value());  // median 10 ms
}

// A sum of a fraction of a millisecond that triples has not seen the link
// change; a faster sum does not count; sizes the round did not time are not
// watched.
TEST(RetuneWatchTest, SmallChangesSpeedUpsAndUntimedSizesDoNotCount) {
  RetuneWatch watch({{200, 0.2e-3}, {300, 30e-3}}, 1,
                    {.factor = 2, .steps = 1});
  EXPECT_FALSE(watch.Add("a", 200, 0, 0.6e-3).has_value());
  EXPECT_FALSE(watch.Add("a", 300, 0, 3e-3).has_value());
  EXPECT_FALSE(watch.Add("a", 999, 1, 10.0).has_value());
  EXPECT_TRUE(watch.Add("a", 200, 2, 5e-3).has_value());
}

// A choice slower than its trial by the factor, but not slower than the
// fastest other trial: no other choice would be faster, no round.
TEST(RetuneWatchTest, NoRoundWhileTheChoiceBeatsEveryOtherTrial) {
  RetuneWatch watch({{100, 3e-3}}, 1, {.factor = 2, .steps = 1},
                    {{100, 480e-3}});
  EXPECT_FALSE(watch.Add("a", 100, 0, 9e-3).has_value());
  EXPECT_TRUE(watch.Add("a", 100, 1, 500e-3).has_value());
}

TEST(AutoTest, RetuneFactorZeroKeepsTheChoiceWhateverTheTimes) {
  Coordinator coordinator({.algorithm = "auto",
                           .autotune_window = 2,
                           .retune_factor = 0,
                           .retune_steps = 1},
                          kTimeout);
  JoinAll(coordinator, {"a", "b"});
  uint64_t step = 0;
  RunAutoRound(coordinator, &step, 30e-3, 10e-3);
  const uint64_t epoch = coordinator.view().epoch;
  for (int i = 0; i < 10; ++i) {
    ReportTwoBuckets(coordinator, step++, 1.0, 1.0);
  }
  EXPECT_EQ(coordinator.view().epoch, epoch);
}

TEST(AutoTest, OneMemberRunsTheDenseRing) {
  Coordinator coordinator({.algorithm = "auto"}, kTimeout);
  JoinAll(coordinator, {"a"});
  EXPECT_EQ(coordinator.view().plan.algorithm, "dense");
  EXPECT_FALSE(coordinator.view().plan.autotuning);
}

TEST(AutoTest, RejectsAMarginBelowOne) {
  Coordinator coordinator({.algorithm = "auto", .sparse_margin = 0.5},
                          kTimeout);
  const absl::StatusOr<View> view = coordinator.Join(Node("a"), kT0);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(view.status().message(), HasSubstr("sparse_margin"));
}

TEST(AutoTest, RejectsATeamsMarginBelowOne) {
  Coordinator coordinator({.algorithm = "spardl", .teams_margin = 0.9},
                          kTimeout);
  const absl::StatusOr<View> view = coordinator.Join(Node("a"), kT0);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(view.status().message(), HasSubstr("teams_margin"));
}

TEST(AutoTest, AdoptsOnlyThePlansAutoWouldRun) {
  View known{.epoch = 9, .members = {Node("a"), Node("b")}};
  known.plan.algorithm = "spardl";
  known.plan.teams = 2;
  known.plan.dense_sizes = {50'000};
  known.plan.exact_below = PlanConfig().exact_below;
  {
    Coordinator after({.algorithm = "auto"}, kTimeout);
    absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->epoch, 9u);
    EXPECT_THAT(view->plan.dense_sizes, ElementsAre(50'000u));
  }
  {  // SparDL alone never runs dense sizes: a new round
    Coordinator after({}, kTimeout);
    absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->epoch, 10u);
    EXPECT_THAT(view->plan.dense_sizes, IsEmpty());
  }
  known.plan =
      Plan{.algorithm = "dense", .exact_below = PlanConfig().exact_below};
  Coordinator after({.algorithm = "auto"}, kTimeout);
  absl::StatusOr<View> view = after.Join(Node("a"), kT0, &known);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->epoch, 9u);
  EXPECT_EQ(view->plan.algorithm, "dense");
}

}  // namespace
}  // namespace gradmesh::server

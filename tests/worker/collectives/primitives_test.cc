#include "worker/collectives/primitives.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "worker/collectives/schedule.h"
#include "worker/transport/loopback.h"

namespace gradmesh::collectives {
namespace {

using ::gradmesh::testing::RunRanks;

// Payloads of different sizes, one of them empty, so that none can stand in
// for another.
std::string PayloadOf(int rank) {
  if (rank == 1) return "";
  return absl::StrCat("rank-", rank, "-", std::string(rank * 7, 'x'));
}

struct Gathered {
  bool member = false;
  std::vector<std::string> payloads;
  OpStats stats;
};

// Runs the all-gather of `ranks` (in position order) on a loopback network
// of `world` ranks; the ranks outside the group send and receive nothing.
std::vector<Gathered> GatherOnEveryRank(int world,
                                        const std::vector<int>& ranks,
                                        AllGatherKind kind) {
  transport::LoopbackNetwork net(world);
  std::vector<Gathered> out(world);
  RunRanks(net, [&](int r, transport::Transport* t) {
    const auto at = std::find(ranks.begin(), ranks.end(), r);
    if (at == ranks.end()) return;
    const Group group{.ranks = ranks,
                      .position = static_cast<int>(at - ranks.begin())};
    const OpContext context{.transport = t,
                            .operation = 7,
                            .deadline = absl::Now() + absl::Seconds(20)};
    StepRunner runner(context, &out[r].stats);
    auto all = AllGather(runner, PhaseStep(0), group, PayloadOf(r), kind);
    ASSERT_TRUE(all.ok()) << all.status();
    out[r].member = true;
    out[r].payloads = *std::move(all);
  });
  return out;
}

// Every member ends with every member's payload at its position, in
// ceil(log2 p) rounds, having received each other payload once.
void ExpectGathered(int world, const std::vector<int>& ranks,
                    AllGatherKind kind) {
  const int p = static_cast<int>(ranks.size());
  std::vector<std::string> expected;
  uint64_t total_bytes = 0;
  for (int r : ranks) {
    expected.push_back(PayloadOf(r));
    total_bytes += PayloadOf(r).size();
  }
  const std::vector<Gathered> gathered = GatherOnEveryRank(world, ranks, kind);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const bool member = std::find(ranks.begin(), ranks.end(), r) != ranks.end();
    ASSERT_EQ(gathered[r].member, member);
    if (!member) continue;
    EXPECT_EQ(gathered[r].payloads, expected);
    const OpStats& stats = gathered[r].stats;
    EXPECT_EQ(stats.rounds, CeilLog2(p));
    EXPECT_EQ(stats.messages_received, static_cast<uint64_t>(p - 1));
    EXPECT_EQ(stats.bytes_received, total_bytes - PayloadOf(r).size());
  }
}

class AllGatherTest
    : public ::testing::TestWithParam<std::tuple<int, AllGatherKind>> {};

TEST_P(AllGatherTest, EveryMemberGetsEveryPayloadByPosition) {
  const auto [p, kind] = GetParam();
  std::vector<int> world;
  for (int r = 0; r < p; ++r) world.push_back(r);
  ExpectGathered(p, world, kind);
}

// A group of some ranks of a larger world (SparDL's teams): positions name
// ranks, and the ranks outside take no part.
TEST_P(AllGatherTest, AGroupOfSomeRanksGathersByPosition) {
  const auto [p, kind] = GetParam();
  std::vector<int> strided, reversed;
  for (int i = 0; i < p; ++i) {
    strided.push_back(2 * i + 1);
    reversed.push_back(2 * (p - 1 - i));
  }
  ExpectGathered(2 * p, strided, kind);
  ExpectGathered(2 * p, reversed, kind);
}

std::string KindName(AllGatherKind kind) {
  return kind == AllGatherKind::kBruck ? "bruck" : "recursive_doubling";
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<int, AllGatherKind>>& info) {
  return absl::StrCat(KindName(std::get<1>(info.param)), "_P",
                      std::get<0>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Bruck, AllGatherTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 8, 12, 14, 16, 17),
                       ::testing::Values(AllGatherKind::kBruck)),
    ParamName);
// Powers of two only.
INSTANTIATE_TEST_SUITE_P(
    RecursiveDoubling, AllGatherTest,
    ::testing::Combine(::testing::Values(1, 2, 4, 8, 16),
                       ::testing::Values(AllGatherKind::kRecursiveDoubling)),
    ParamName);

TEST(PreferredAllGatherTest, RecursiveDoublingForPowersOfTwoOnly) {
  for (int p : {1, 2, 4, 8, 1024}) {
    EXPECT_EQ(PreferredAllGather(p), AllGatherKind::kRecursiveDoubling) << p;
  }
  for (int p : {3, 5, 6, 12, 1023}) {
    EXPECT_EQ(PreferredAllGather(p), AllGatherKind::kBruck) << p;
  }
}

}  // namespace
}  // namespace gradmesh::collectives

#include "worker/collectives/primitives.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
  return rank == 1 ? std::string() : absl::StrCat("rank-", rank, "-",
                                                  std::string(rank * 7, 'x'));
}

struct Gathered {
  std::vector<std::string> payloads;
  OpStats stats;
};

std::vector<Gathered> GatherOnEveryRank(int p, AllGatherKind kind) {
  transport::LoopbackNetwork net(p);
  std::vector<Gathered> out(p);
  RunRanks(net, [&](int r, transport::Transport* t) {
    const OpContext context{.transport = t,
                            .operation = 7,
                            .deadline = absl::Now() + absl::Seconds(20)};
    StepRunner runner(context, &out[r].stats);
    auto all = AllGather(runner, PhaseStep(0), Group::World(p, r),
                         PayloadOf(r), kind);
    ASSERT_TRUE(all.ok()) << all.status();
    out[r].payloads = *std::move(all);
  });
  return out;
}

class AllGatherTest
    : public ::testing::TestWithParam<std::tuple<int, AllGatherKind>> {};

// Every member ends with every member's payload at its position, in
// ceil(log2 p) rounds.
TEST_P(AllGatherTest, EveryMemberGetsEveryPayloadByPosition) {
  const auto [p, kind] = GetParam();
  std::vector<std::string> expected;
  for (int r = 0; r < p; ++r) expected.push_back(PayloadOf(r));
  const std::vector<Gathered> gathered = GatherOnEveryRank(p, kind);
  for (int r = 0; r < p; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(gathered[r].payloads, expected);
    EXPECT_EQ(gathered[r].stats.rounds, CeilLog2(p));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Bruck, AllGatherTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 8, 12, 14, 16, 17),
                       ::testing::Values(AllGatherKind::kBruck)));
// Powers of two only.
INSTANTIATE_TEST_SUITE_P(
    RecursiveDoubling, AllGatherTest,
    ::testing::Combine(::testing::Values(1, 2, 4, 8, 16),
                       ::testing::Values(AllGatherKind::kRecursiveDoubling)));

}  // namespace
}  // namespace gradmesh::collectives

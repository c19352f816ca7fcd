// Steps of the wall clock under a running cluster (root with CAP_SYS_TIME;
// skipped otherwise).
// Failure detection and the heartbeat loops run on the steady clock, so a
// step forward evicts nobody and a step back does not keep a dead worker.
// The step moves every process's clock: CTest runs this binary alone
// (RUN_SERIAL), and the clock is put back where it would have been.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tools/gradmesh/local_cluster.h"

namespace gradmesh::tools {
namespace {

// Moves CLOCK_REALTIME; the destructor restores the undisturbed time.
class WallClockStep {
 public:
  WallClockStep()
      : wall_(absl::Now()), steady_(std::chrono::steady_clock::now()) {}
  ~WallClockStep() { Set(Undisturbed()); }

  // Sets the wall clock `offset` away from the undisturbed time.
  bool Step(absl::Duration offset) { return Set(Undisturbed() + offset); }

 private:
  absl::Time Undisturbed() const {
    return wall_ + absl::FromChrono(std::chrono::steady_clock::now() - steady_);
  }
  static bool Set(absl::Time time) {
    const timespec ts = absl::ToTimespec(time);
    return clock_settime(CLOCK_REALTIME, &ts) == 0;
  }

  const absl::Time wall_;
  const std::chrono::steady_clock::time_point steady_;
};

// The epoch every worker runs; 0 unless all three agree.
uint64_t CommonEpoch(LocalCluster& cluster) {
  uint64_t epoch = 0;
  for (int w = 0; w < cluster.size(); ++w) {
    if (!cluster.alive(w)) continue;
    auto plan = cluster.GetPlan(w);
    if (!plan.ok() || (epoch != 0 && plan->epoch != epoch)) return 0;
    epoch = plan->epoch;
  }
  return epoch;
}

TEST(ClockStepTest, AWallClockStepEvictsNobodyAndKeepsNobody) {
  // Setting the clock to what it reads checks the right to (CAP_SYS_TIME).
  const timespec now = absl::ToTimespec(absl::Now());
  if (clock_settime(CLOCK_REALTIME, &now) != 0) {
    GTEST_SKIP() << "cannot set the clock here (needs CAP_SYS_TIME)";
  }
  auto cluster = LocalCluster::Start(
      {.workers = 3,
       .coordinator_flags = {{"heartbeat_timeout_ms", "2000"}},
       .worker_flags = {{"heartbeat_interval_ms", "250"}}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForView(3, absl::Seconds(30)).ok());
  const uint64_t epoch = CommonEpoch(**cluster);
  ASSERT_NE(epoch, 0u);

  WallClockStep clock;
  ASSERT_TRUE(clock.Step(absl::Minutes(1)));
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(CommonEpoch(**cluster), epoch) << "a step forward evicted";
  ASSERT_TRUE(clock.Step(-absl::Minutes(1)));
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(CommonEpoch(**cluster), epoch) << "a step back evicted";

  // With the clock a minute behind, a dead worker goes within the timeout.
  (*cluster)->Kill(2, SIGKILL);
  EXPECT_TRUE((*cluster)->WaitForView(2, absl::Seconds(8)).ok());
}

}  // namespace
}  // namespace gradmesh::tools

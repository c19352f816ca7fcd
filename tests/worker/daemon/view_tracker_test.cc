#include "worker/daemon/view_tracker.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::daemon {
namespace {

using ::testing::HasSubstr;

// Time that moves only when told; waits poll it.
class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) const override {
    while (!condition.Eval()) {
      if (Now() >= deadline) return false;
      mu->AwaitWithTimeout(condition, absl::Milliseconds(1));
    }
    return true;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

ViewInfo View(uint64_t epoch, std::vector<std::string> members,
              uint64_t start_step = 0, std::string algorithm = "spardl") {
  ViewInfo view{.epoch = epoch,
                .member_ids = members,
                .addresses = members,
                .start_step = start_step};
  view.plan.algorithm = algorithm;
  return view;
}

// Groups as the daemon makes them, minus the transport: "me" is rank r
// where it appears; an algorithm named "broken" can't run.
std::shared_ptr<Group> MakeGroup(const ViewInfo& view) {
  auto group = std::make_shared<Group>();
  group->view = view;
  for (int r = 0; r < group->size(); ++r) {
    if (view.member_ids[r] == "me") group->rank = r;
  }
  if (view.plan.algorithm == "broken") {
    group->error = absl::InvalidArgumentError("no such algorithm");
  }
  return group;
}

class ViewTrackerTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  ViewTracker views_{MakeGroup, &clock_};

  uint64_t EpochFor(std::optional<uint64_t> step) {
    auto group = views_.Acquire(step, clock_.Now());
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? (*group)->view.epoch : 0;
  }
};

TEST_F(ViewTrackerTest, WaitsForTheFirstViewUntilTheDeadline) {
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(views_.Acquire(0, clock_.Now()).status()));
  // A waiter gives up when the clock passes its deadline (taken before the
  // thread starts: a thread scheduled after the Advance would otherwise wait
  // on a fake clock that never reaches its deadline)...
  const absl::Time deadline = clock_.Now() + absl::Seconds(5);
  std::thread waiter([&] {
    EXPECT_TRUE(absl::IsDeadlineExceeded(views_.Acquire(0, deadline).status()));
  });
  absl::SleepFor(absl::Milliseconds(20));
  clock_.Advance(absl::Seconds(6));
  waiter.join();
  // ...and another is woken by the first view.
  std::thread woken([&] {
    auto group = views_.Acquire(0, clock_.Now() + absl::Seconds(5));
    ASSERT_TRUE(group.ok()) << group.status();
    EXPECT_EQ((*group)->view.epoch, 3u);
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(views_.Install(View(3, {"a", "me"})).has_value());
  woken.join();
}

TEST_F(ViewTrackerTest, MembershipChangeAppliesAtOnceAndHandsBackTheOld) {
  auto first = views_.Install(View(1, {"a", "me"}));
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->replaced.empty());
  EXPECT_EQ(EpochFor(7), 1u);
  auto second = views_.Install(View(2, {"me"}));
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ(second->replaced.size(), 1u);
  EXPECT_EQ(second->replaced[0]->view.epoch, 1u);
  EXPECT_EQ(EpochFor(8), 2u);
  EXPECT_EQ((*views_.Acquire(8, clock_.Now()))->rank, 0);
  // Not newer: ignored.
  EXPECT_FALSE(views_.Install(View(2, {"a", "me"})).has_value());
  EXPECT_FALSE(views_.Install(View(1, {"a", "me"})).has_value());
  EXPECT_EQ(views_.latest_epoch(), 2u);
}

// Replaced groups are destroyed only by ReleaseRetired, and only once no
// operation holds them: never at Install or Acquire, under the lock.
TEST_F(ViewTrackerTest, RetiredGroupsDieOnlyInReleaseRetired) {
  ASSERT_TRUE(views_.Install(View(1, {"a", "me"})).has_value());
  std::weak_ptr<Group> first = *views_.Acquire(0, clock_.Now());
  auto held = views_.Acquire(0, clock_.Now());  // an operation in flight
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(views_.Install(View(2, {"me"})).has_value());
  EXPECT_FALSE(first.expired());  // retired, not destroyed
  views_.ReleaseRetired();
  EXPECT_FALSE(first.expired());  // the operation still holds it
  held->reset();                  // its last reference: not destroyed here
  EXPECT_FALSE(first.expired());
  views_.ReleaseRetired();
  EXPECT_TRUE(first.expired());
  // A plan change retires the previous group once the next one applies.
  ASSERT_TRUE(views_.Install(View(3, {"me"}, /*start_step=*/5)).has_value());
  std::weak_ptr<Group> second = *views_.Acquire(4, clock_.Now());
  EXPECT_EQ(EpochFor(5), 3u);  // epoch 2 becomes previous
  ASSERT_TRUE(views_.Install(View(4, {"me"}, /*start_step=*/9)).has_value());
  EXPECT_EQ(EpochFor(9), 4u);  // epoch 3 previous, epoch 2 retired
  EXPECT_FALSE(second.expired());
  views_.ReleaseRetired();
  EXPECT_TRUE(second.expired());
  EXPECT_EQ(views_.Stop().size(), 2u);  // current and previous
}

TEST_F(ViewTrackerTest, PlanChangeAppliesFromItsStartStep) {
  ASSERT_TRUE(views_.Install(View(1, {"a", "me"})).has_value());
  EXPECT_EQ(EpochFor(3), 1u);
  auto change = views_.Install(View(2, {"a", "me"}, /*start_step=*/5));
  ASSERT_TRUE(change.has_value());
  EXPECT_FALSE(change->late);
  EXPECT_TRUE(change->replaced.empty());  // the same members: nothing aborts
  EXPECT_EQ(EpochFor(4), 1u);
  EXPECT_EQ(EpochFor(5), 2u);
  // A bucket of an earlier step still in flight keeps the old plan.
  EXPECT_EQ(EpochFor(4), 1u);
  EXPECT_EQ(EpochFor(6), 2u);
  EXPECT_EQ(EpochFor(std::nullopt), 2u);
}

// Operations on the group kept for steps before a plan switch are aborted
// by a membership change too, not left to their timeout.
TEST_F(ViewTrackerTest, AMembershipChangeDisplacesEveryGroupOfThePlanSwitch) {
  ASSERT_TRUE(views_.Install(View(1, {"a", "me"})).has_value());
  EXPECT_EQ(EpochFor(3), 1u);
  ASSERT_TRUE(
      views_.Install(View(2, {"a", "me"}, /*start_step=*/5)).has_value());
  EXPECT_EQ(EpochFor(5), 2u);  // epoch 1 kept for steps before 5
  auto change = views_.Install(View(3, {"me"}));
  ASSERT_TRUE(change.has_value());
  std::vector<uint64_t> epochs;
  for (const auto& g : change->replaced) epochs.push_back(g->view.epoch);
  std::sort(epochs.begin(), epochs.end());
  EXPECT_EQ(epochs, (std::vector<uint64_t>{1, 2}));
}

// A member restarted within the heartbeat timeout keeps its node id: the
// coordinator's next view has the same ids but a new incarnation (and a new
// membership epoch). That is a membership change, not a plan change: the
// new process holds none of the old group's registrations or streams.
TEST_F(ViewTrackerTest, ANewIncarnationOfAMemberIsAMembershipChange) {
  ViewInfo first = View(1, {"a", "me"});
  first.incarnations = {10, 20};
  first.membership_epoch = 1;
  ASSERT_TRUE(views_.Install(first).has_value());
  EXPECT_EQ(EpochFor(3), 1u);
  ViewInfo restarted = View(2, {"a", "me"});
  restarted.incarnations = {11, 20};
  restarted.membership_epoch = 2;
  auto change = views_.Install(restarted);
  ASSERT_TRUE(change.has_value());
  EXPECT_FALSE(change->late);
  ASSERT_EQ(change->replaced.size(), 1u);
  EXPECT_EQ(change->replaced[0]->view.epoch, 1u);
  EXPECT_THAT(change->description, HasSubstr("membership"));
  EXPECT_EQ(EpochFor(2), 2u);  // at once, even for an earlier step
  // A plan change of those members stays one.
  ViewInfo plan = restarted;
  plan.epoch = 3;
  plan.start_step = 9;
  change = views_.Install(plan);
  ASSERT_TRUE(change.has_value());
  EXPECT_TRUE(change->replaced.empty());
  EXPECT_EQ(EpochFor(8), 2u);
}

TEST_F(ViewTrackerTest, LatePlanAppliesAtOnce) {
  ASSERT_TRUE(views_.Install(View(1, {"a", "me"})).has_value());
  EXPECT_EQ(EpochFor(9), 1u);
  auto change = views_.Install(View(2, {"a", "me"}, /*start_step=*/9));
  ASSERT_TRUE(change.has_value());
  EXPECT_TRUE(change->late);
  EXPECT_EQ(EpochFor(10), 2u);
}

TEST_F(ViewTrackerTest, RefusesWhatCannotRun) {
  ASSERT_TRUE(views_.Install(View(1, {"a", "b"})).has_value());
  EXPECT_TRUE(absl::IsUnavailable(views_.Acquire(0, clock_.Now()).status()));
  ASSERT_TRUE(views_.Install(View(2, {"me"}, 0, "broken")).has_value());
  EXPECT_TRUE(
      absl::IsFailedPrecondition(views_.Acquire(0, clock_.Now()).status()));
}

TEST_F(ViewTrackerTest, StopFailsWaitersAndReturnsTheGroups) {
  ASSERT_TRUE(views_.Install(View(1, {"me"})).has_value());
  ASSERT_TRUE(views_.Install(View(2, {"me"}, 50)).has_value());
  const auto groups = views_.Stop();
  EXPECT_EQ(groups.size(), 2u);  // current and pending
  EXPECT_TRUE(absl::IsUnavailable(
      views_.Acquire(0, clock_.Now() + absl::Hours(1)).status()));
  EXPECT_FALSE(views_.Install(View(3, {"me"})).has_value());
}

// The same view delivered twice at once (a watch and a heartbeat) makes
// one group: a second transport of the epoch would close it on the first
// one's peer service when discarded.
TEST(ViewTrackerInstallTest, ConcurrentInstallsOfOneViewMakeOneGroup) {
  FakeClock clock;
  absl::Mutex mu;
  int made = 0;
  ViewTracker views(
      [&](const ViewInfo& view) {
        {
          absl::MutexLock lock(&mu);
          ++made;
        }
        absl::SleepFor(absl::Milliseconds(50));  // dialing peers
        return MakeGroup(view);
      },
      &clock);
  std::thread other([&] { views.Install(View(6, {"me", "b"})); });
  views.Install(View(6, {"me", "b"}));
  other.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(made, 1);
}

}  // namespace
}  // namespace gradmesh::daemon

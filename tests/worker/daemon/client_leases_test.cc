#include "worker/daemon/client_leases.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kGrace = absl::Milliseconds(100);

// Records the clients expired.
class Expired {
 public:
  std::function<void(const std::string&)> Hook() {
    return [this](const std::string& id) {
      absl::MutexLock lock(&mu_);
      ids_.push_back(id);
    };
  }
  std::vector<std::string> ids() {
    absl::MutexLock lock(&mu_);
    return ids_;
  }
  // Waits up to `timeout` for `count` expiries; the ids then.
  std::vector<std::string> WaitFor(size_t count, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return ids_.size() >= count;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return ids_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> ids_ ABSL_GUARDED_BY(mu_);
};

TEST(ClientLeasesTest, AClientGoneForTheGraceExpiresOnce) {
  Expired expired;
  ClientLeases leases(kGrace, expired.Hook());
  ASSERT_TRUE(leases.Attach("a").ok());
  ASSERT_TRUE(leases.Attach("b").ok());
  const absl::Time detached = absl::Now();
  leases.Detach("a");
  EXPECT_THAT(expired.WaitFor(1, absl::Seconds(10)), ElementsAre("a"));
  EXPECT_GE(absl::Now() - detached, kGrace);
  absl::SleepFor(3 * kGrace);
  EXPECT_THAT(expired.ids(), ElementsAre("a"));  // b is still attached
}

TEST(ClientLeasesTest, AttachingAgainWithinTheGraceKeepsTheClient) {
  Expired expired;
  ClientLeases leases(kGrace, expired.Hook());
  ASSERT_TRUE(leases.Attach("a").ok());
  ASSERT_TRUE(
      leases.Attach("a").ok());  // two streams: one ending leaves the other
  leases.Detach("a");
  leases.Detach("a");
  ASSERT_TRUE(leases.Attach("a").ok());
  absl::SleepFor(3 * kGrace);
  EXPECT_THAT(expired.ids(), IsEmpty());
  leases.Detach("a");
  EXPECT_THAT(expired.WaitFor(1, absl::Seconds(10)), ElementsAre("a"));
}

TEST(ClientLeasesTest, UnknownClientsAndAZeroGraceExpireNobody) {
  Expired expired;
  {
    ClientLeases off(absl::ZeroDuration(), expired.Hook());
    ASSERT_TRUE(off.Attach("a").ok());
    off.Detach("a");
    ClientLeases leases(kGrace, expired.Hook());
    leases.Detach("never-attached");
    absl::SleepFor(3 * kGrace);
  }
  EXPECT_THAT(expired.ids(), IsEmpty());
}

TEST(ClientLeasesTest, OneClientHoldsAtMostKMaxStreams) {
  Expired expired;
  ClientLeases leases(kGrace, expired.Hook());
  for (int i = 0; i < ClientLeases::kMaxStreams; ++i) {
    ASSERT_TRUE(leases.Attach("a").ok()) << i;
  }
  EXPECT_TRUE(absl::IsResourceExhausted(leases.Attach("a")));
  EXPECT_TRUE(leases.Attach("b").ok());
  leases.Detach("a");
  EXPECT_TRUE(leases.Attach("a").ok());
}

TEST(ClientLeasesTest, StopEndsTheWaitAndNobodyExpiresAfter) {
  Expired expired;
  ClientLeases leases(absl::Seconds(3600), expired.Hook());
  ASSERT_TRUE(leases.Attach("a").ok());
  leases.Detach("a");
  const absl::Time start = absl::Now();
  leases.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(expired.ids(), IsEmpty());
}

}  // namespace
}  // namespace gradmesh::daemon

#include "worker/transport/loopback.h"

#include <string>
#include <thread>

#include "common/steady_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/transport/fault_injection.h"

namespace gradmesh::transport {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

TEST(LoopbackTest, DeliversByPeerAndTagInOrder) {
  LoopbackNetwork net(3);
  const Tag a{.epoch = 1, .operation = 2, .step = 0};
  const Tag b{.epoch = 1, .operation = 2, .step = 1};
  ASSERT_TRUE(net.endpoint(0)->Send(1, b, "b").ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, a, "a1").ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, a, "a2").ok());
  ASSERT_TRUE(net.endpoint(2)->Send(1, a, "from2").ok());
  EXPECT_EQ(*net.endpoint(1)->Recv(0, a, Soon()), "a1");
  EXPECT_EQ(*net.endpoint(1)->Recv(2, a, Soon()), "from2");
  EXPECT_EQ(*net.endpoint(1)->Recv(0, a, Soon()), "a2");
  EXPECT_EQ(*net.endpoint(1)->Recv(0, b, Soon()), "b");

  const Counters sender = net.endpoint(0)->counters();
  EXPECT_EQ(sender.messages_sent, 3u);
  EXPECT_EQ(sender.bytes_sent, 5u);
  EXPECT_EQ(sender.bytes_sent_to[1], 5u);
  const Counters receiver = net.endpoint(1)->counters();
  EXPECT_EQ(receiver.messages_received, 4u);
  EXPECT_EQ(receiver.bytes_received, 10u);
  EXPECT_EQ(receiver.bytes_received_from[2], 5u);
}

TEST(LoopbackTest, RecvWaitsForALaterSend) {
  LoopbackNetwork net(2);
  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(net.endpoint(1)->Send(0, {}, "late").ok());
  });
  EXPECT_EQ(*net.endpoint(0)->Recv(1, {}, Soon()), "late");
  sender.join();
}

TEST(LoopbackTest, DeadlinePassesWithDeadlineExceeded) {
  LoopbackNetwork net(2);
  const absl::Time start = absl::Now();
  auto r = net.endpoint(0)->Recv(1, {}, start + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
}

TEST(LoopbackTest, AbortFailsOwnCallsAndWakesWaitingPeers) {
  LoopbackNetwork net(3);
  std::thread waiter([&] {
    auto r = net.endpoint(0)->Recv(1, {}, absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), ::testing::HasSubstr("peer 1"));
  });
  absl::SleepFor(absl::Milliseconds(20));
  net.endpoint(1)->Abort(absl::CancelledError("shutting down"));
  waiter.join();
  EXPECT_TRUE(absl::IsCancelled(net.endpoint(1)->Send(0, {}, "x")));
  EXPECT_TRUE(absl::IsCancelled(net.endpoint(1)->Recv(2, {}, Soon()).status()));
  // Unaffected pairs keep working.
  ASSERT_TRUE(net.endpoint(2)->Send(0, {}, "ok").ok());
  EXPECT_EQ(*net.endpoint(0)->Recv(2, {}, Soon()), "ok");
}

TEST(LoopbackTest, AnEndedOperationsMessagesAreDroppedLateOnesToo) {
  LoopbackNetwork net(2);
  const Tag ended{.epoch = 1, .operation = 3, .step = 0};
  const Tag other{.epoch = 1, .operation = 4, .step = 0};
  const Tag same_op_other_epoch{.epoch = 2, .operation = 3, .step = 0};
  ASSERT_TRUE(net.endpoint(0)->Send(1, ended, "waiting").ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, other, "kept").ok());
  { const OperationScope scope(net.endpoint(1), 1, 3); }
  ASSERT_TRUE(net.endpoint(0)->Send(1, ended, "late").ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, same_op_other_epoch, "new").ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      net.endpoint(1)->Recv(0, ended, absl::Now()).status()));
  EXPECT_EQ(*net.endpoint(1)->Recv(0, other, Soon()), "kept");
  EXPECT_EQ(*net.endpoint(1)->Recv(0, same_op_other_epoch, Soon()), "new");
  // Only the receiver ended it: rank 0 still receives operation 3.
  ASSERT_TRUE(net.endpoint(1)->Send(0, ended, "back").ok());
  EXPECT_EQ(*net.endpoint(0)->Recv(1, ended, Soon()), "back");
}

// Peers' messages of an operation this rank has not started tell since when
// they wait (the step-join watch reads it); starting or ending it clears it.
TEST(LoopbackTest, TellsSinceWhenPeersRunAnOperationNotStartedHere) {
  LoopbackNetwork net(3);
  Transport* me = net.endpoint(0);
  const Tag op{.epoch = 1, .operation = 7, .step = 0};
  EXPECT_FALSE(me->UnclaimedSince(1, 7).has_value());
  const absl::Time before = SteadyNow();
  ASSERT_TRUE(net.endpoint(1)->Send(0, op, "a").ok());
  const absl::Time after = SteadyNow();
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(net.endpoint(2)->Send(0, op, "b").ok());
  const std::optional<absl::Time> since = me->UnclaimedSince(1, 7);
  ASSERT_TRUE(since.has_value());
  EXPECT_GE(*since, before);
  EXPECT_LE(*since, after);                            // the first message's
  EXPECT_FALSE(me->UnclaimedSince(2, 7).has_value());  // by epoch
  EXPECT_EQ(*me->Recv(1, op, Soon()), "a");
  EXPECT_FALSE(me->UnclaimedSince(1, 7).has_value());  // started here
  ASSERT_TRUE(net.endpoint(1)->Send(0, op, "c").ok());
  EXPECT_FALSE(me->UnclaimedSince(1, 7).has_value());
  const Tag next{.epoch = 1, .operation = 8, .step = 0};
  ASSERT_TRUE(net.endpoint(1)->Send(0, next, "d").ok());
  ASSERT_TRUE(me->UnclaimedSince(1, 8).has_value());
  { const OperationScope scope(me, 1, 8); }
  EXPECT_FALSE(me->UnclaimedSince(1, 8).has_value());  // ended here
}

TEST(FaultInjectionTest, CrashesAfterNSends) {
  LoopbackNetwork net(2);
  FaultInjectingTransport faulty(net.endpoint(0));
  faulty.CrashAfterSends(1, absl::UnavailableError("killed"));
  EXPECT_TRUE(faulty.Send(1, {}, "one").ok());
  EXPECT_TRUE(absl::IsUnavailable(faulty.Send(1, {}, "two")));
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {}, Soon()), "one");
  EXPECT_TRUE(
      absl::IsUnavailable(net.endpoint(1)->Recv(0, {}, Soon()).status()));
}

TEST(FaultInjectionTest, DropsSendsToAPeer) {
  LoopbackNetwork net(3);
  FaultInjectingTransport faulty(net.endpoint(0));
  faulty.DropSendsTo(1);
  EXPECT_TRUE(faulty.Send(1, {}, "lost").ok());
  EXPECT_TRUE(faulty.Send(2, {}, "kept").ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      net.endpoint(1)
          ->Recv(0, {}, absl::Now() + absl::Milliseconds(20))
          .status()));
  EXPECT_EQ(*net.endpoint(2)->Recv(0, {}, Soon()), "kept");
}

}  // namespace
}  // namespace gradmesh::transport

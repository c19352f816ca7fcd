#include "worker/transport/simulated.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::transport {
namespace {

using ::testing::DoubleNear;

// alpha 1 ms, beta 1 us a byte: a message of b bytes takes 1 ms + b us.
constexpr SimLink kLink{.alpha_s = 1e-3, .beta_s_per_byte = 1e-6};
constexpr double kTolerance = 1e-12;

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

std::string Bytes(size_t n) { return std::string(n, 'x'); }

// Runs body(rank, transport) on one thread per rank between Start and
// Finish; returns each rank's times.
std::vector<SimTimes> RunRanks(
    SimulatedNetwork& net, const std::function<void(int, Transport*)>& body) {
  std::vector<SimTimes> times(net.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < net.size(); ++r) {
    threads.emplace_back([&, r] {
      net.Start(r);
      body(r, net.endpoint(r));
      times[r] = net.Finish(r);
    });
  }
  for (std::thread& t : threads) t.join();
  return times;
}

void Receive(Transport* t, int peer, const Tag& tag) {
  ASSERT_TRUE(t->Recv(peer, tag, Soon()).ok());
}

// A message of an operation its receiver ended is dropped with its arrival
// time; a failed send after that (the sender aborted) leaves nothing behind.
TEST(SimulatedNetworkTest, AnEndedOperationsMessagesAreDropped) {
  SimulatedNetwork net(2, {.link = kLink});
  const Tag ended{.operation = 5}, other{.operation = 6};
  net.endpoint(1)->EndOperation(0, 5);
  ASSERT_TRUE(net.endpoint(0)->Send(1, ended, Bytes(10)).ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, other, Bytes(10)).ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      net.endpoint(1)->Recv(0, ended, absl::Now()).status()));
  Receive(net.endpoint(1), 0, other);
  net.endpoint(0)->Abort(absl::UnavailableError("gone"));
  EXPECT_FALSE(net.endpoint(0)->Send(1, other, Bytes(10)).ok());
}

TEST(SimulatedNetworkTest, TwoMessagesShareTheSendersLink) {
  SimulatedNetwork net(3, {.link = kLink});
  const Tag tag{.operation = 1};
  const std::vector<SimTimes> times = RunRanks(net, [&](int r, Transport* t) {
    if (r == 0) {
      ASSERT_TRUE(t->Send(1, tag, Bytes(1000)).ok());
      ASSERT_TRUE(t->Send(2, tag, Bytes(3000)).ok());
    } else {
      Receive(t, 0, tag);
    }
  });
  // The first: 1000 us + 1 ms. The second leaves after the first's bytes:
  // 1000 us + 3000 us + 1 ms.
  EXPECT_THAT(times[1].seconds, DoubleNear(2e-3, kTolerance));
  EXPECT_THAT(times[2].seconds, DoubleNear(5e-3, kTolerance));
  EXPECT_EQ(times[0].seconds, 0);  // sending only queues
}

TEST(SimulatedNetworkTest, ReceivesFromSeveralSendersAtOnce) {
  SimulatedNetwork net(3, {.link = kLink});
  const Tag tag{.operation = 1};
  const std::vector<SimTimes> times = RunRanks(net, [&](int r, Transport* t) {
    if (r == 0) {
      Receive(t, 1, tag);
      Receive(t, 2, tag);
    } else {
      ASSERT_TRUE(t->Send(0, tag, Bytes(1000 * r)).ok());
    }
  });
  // Two links in parallel: the later arrival, 1 ms + 2000 us.
  EXPECT_THAT(times[0].seconds, DoubleNear(3e-3, kTolerance));
}

// A ring of 3, two steps; rank 0 computes 1000 selected values (1 us each)
// before the second.
TEST(SimulatedNetworkTest, ARingOfThreeWithComputeOnOneRank) {
  SimulatedNetwork net(
      3, {.link = kLink, .compute = {.select_s_per_value = 1e-6}});
  const std::vector<SimTimes> times = RunRanks(net, [&](int r, Transport* t) {
    for (uint32_t step = 0; step < 2; ++step) {
      const Tag tag{.operation = 1, .step = step};
      if (r == 0 && step == 1) CountSelected(1000);
      ASSERT_TRUE(t->Send((r + 1) % 3, tag, Bytes(500)).ok());
      Receive(t, (r + 2) % 3, tag);
    }
  });
  // Step 1: every rank sends at 0 and receives at 1.5 ms.
  // Step 2: rank 0 sends at 2.5 ms, arriving at rank 1 at 4 ms; ranks 1 and
  // 2 send at 1.5 ms, arriving at 3 ms. Rank 0 is already at 2.5 ms.
  EXPECT_THAT(times[0].seconds, DoubleNear(3e-3, kTolerance));
  EXPECT_THAT(times[1].seconds, DoubleNear(4e-3, kTolerance));
  EXPECT_THAT(times[2].seconds, DoubleNear(3e-3, kTolerance));
  EXPECT_THAT(times[0].compute_seconds, DoubleNear(1e-3, kTolerance));
  EXPECT_EQ(times[1].compute_seconds, 0);
}

TEST(SimulatedNetworkTest, ScaleMultipliesBytesAndWorkNotLatency) {
  SimulatedNetwork net(
      2, {.link = kLink, .compute = {.merge_s_per_value = 1e-6}, .scale = 10});
  const Tag tag{.operation = 1};
  const std::vector<SimTimes> times = RunRanks(net, [&](int r, Transport* t) {
    if (r == 0) {
      CountMerged(100);  // 100 x 10 x 1 us = 1 ms
      ASSERT_TRUE(t->Send(1, tag, Bytes(100)).ok());
    } else {
      Receive(t, 0, tag);
    }
  });
  // Sent at 1 ms: + 1 ms + 100 x 10 x 1 us.
  EXPECT_THAT(times[1].seconds, DoubleNear(3e-3, kTolerance));
  EXPECT_THAT(times[0].seconds, DoubleNear(1e-3, kTolerance));
  EXPECT_EQ(net.endpoint(1)->counters().bytes_received, 100u);  // real bytes
}

TEST(SimulatedNetworkTest, StartResetsTheClockAndLink) {
  SimulatedNetwork net(2, {.link = kLink});
  // Op 1: 1000 bytes, 2 ms. Op 2: 500 bytes, 1.5 ms, earlier than op 1's
  // clocks and link: they must start again from 0.
  for (uint64_t op = 1; op <= 2; ++op) {
    const Tag tag{.operation = op};
    const size_t bytes = op == 1 ? 1000 : 500;
    const std::vector<SimTimes> times = RunRanks(net, [&](int r, Transport* t) {
      if (r == 0) {
        ASSERT_TRUE(t->Send(1, tag, Bytes(bytes)).ok());
      } else {
        Receive(t, 0, tag);
      }
    });
    EXPECT_THAT(times[1].seconds,
                DoubleNear(op == 1 ? 2e-3 : 1.5e-3, kTolerance))
        << op;
  }
}

// A Recv that timed out takes no arrival; two messages under one tag keep
// their own arrivals.
TEST(SimulatedNetworkTest, ArrivalsFollowTheirMessages) {
  SimulatedNetwork net(2, {.link = kLink});
  const Tag tag{.operation = 1};
  std::vector<SimTimes> times = RunRanks(net, [&](int r, Transport* t) {
    if (r == 1) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(
          t->Recv(0, tag, absl::Now() + absl::Milliseconds(1)).status()));
    }
  });
  EXPECT_EQ(times[1].seconds, 0);
  times = RunRanks(net, [&](int r, Transport* t) {
    if (r == 0) {
      ASSERT_TRUE(t->Send(1, tag, Bytes(1000)).ok());  // arrives at 2 ms
      ASSERT_TRUE(t->Send(1, tag, Bytes(2000)).ok());  // arrives at 4 ms
    } else {
      Receive(t, 0, tag);
      EXPECT_THAT(net.Finish(1).seconds, DoubleNear(2e-3, kTolerance));
      Receive(t, 0, tag);
    }
  });
  EXPECT_THAT(times[1].seconds, DoubleNear(4e-3, kTolerance));
}

TEST(SimulatedNetworkTest, WorkBeforeStartIsNotCharged) {
  SimulatedNetwork net(1, {.compute = {.select_s_per_value = 1}});
  CountSelected(5);
  net.Start(0);
  CountSelected(2);
  EXPECT_EQ(net.Finish(0).seconds, 2);
}

TEST(SimulatedNetworkTest, AbortReachesPeersAsLoopbackDoes) {
  SimulatedNetwork net(2, {});
  net.endpoint(0)->Abort(absl::CancelledError("stop"));
  EXPECT_TRUE(
      absl::IsUnavailable(net.endpoint(1)->Recv(0, Tag{}, Soon()).status()));
  EXPECT_TRUE(absl::IsCancelled(net.endpoint(0)->Send(1, Tag{}, "x")));
}

}  // namespace
}  // namespace gradmesh::transport

// NodeLink over loopback: the launchers of three nodes, each in a thread.
#include "tools/gradmesh/node_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/support/free_port.h"
#include "tests/support/no_signals.h"

namespace gradmesh::tools {
namespace {

using ::gradmesh::testing::FreePort;
using ::gradmesh::testing::NoSignals;

using Link = std::unique_ptr<NodeLink>;

// Node 0's link on `port`, waiting for the nodes of `shape`.
absl::StatusOr<Link> Serve(int port, const NodeLink::Shape& shape,
                           absl::Time deadline,
                           absl::Duration last_call = absl::Seconds(5)) {
  absl::StatusOr<Link> link = NodeLink::Listen(port);
  if (!link.ok()) return link.status();
  if (absl::Status joined =
          (*link)->AwaitNodes(shape, "the-job", deadline, last_call);
      !joined.ok()) {
    return joined;
  }
  return link;
}

NodeLink::Shape Nodes(int nodes, int min_copies = 0, int min_nodes = 0) {
  return {.nodes = nodes,
          .per_node = 2,
          .min_copies = min_copies,
          .min_nodes = min_nodes};
}

// Node 0 serving `nodes` on `port`, and nodes 1.. joining, all at once.
std::vector<Link> Connect(int port, int nodes, int min_copies = 0,
                          int min_nodes = 0) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const NodeLink::Shape shape = Nodes(nodes, min_copies, min_nodes);
  auto zero = std::async(std::launch::async,
                         [&] { return Serve(port, shape, deadline); });
  std::vector<std::future<absl::StatusOr<Link>>> others;
  for (int n = 1; n < nodes; ++n) {
    others.push_back(std::async(std::launch::async, [&, n] {
      return NodeLink::Join("127.0.0.1", port, n, shape, deadline);
    }));
  }
  std::vector<Link> links;
  absl::StatusOr<Link> served = zero.get();
  EXPECT_TRUE(served.ok()) << served.status();
  links.push_back(served.ok() ? *std::move(served) : nullptr);
  for (auto& other : others) {
    absl::StatusOr<Link> joined = other.get();
    EXPECT_TRUE(joined.ok()) << joined.status();
    links.push_back(joined.ok() ? *std::move(joined) : nullptr);
  }
  return links;
}

// The first line node 0 answers to `hello` on a connection of its own.
std::string AnswerTo(NodeLink& zero, int port, const std::string& hello) {
  const absl::StatusOr<int> fd = ConnectTcp("127.0.0.1", port);
  if (!fd.ok()) return fd.status().ToString();
  const std::string line = hello + "\n";
  std::string answer;
  if (write(*fd, line.data(), line.size()) ==
      static_cast<ssize_t>(line.size())) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    char c = 0;
    while (c != '\n' && absl::Now() < deadline) {
      EXPECT_EQ(zero.Poll(), std::nullopt);
      while (c != '\n' && read(*fd, &c, 1) == 1) {
        if (c != '\n') answer += c;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  close(*fd);
  return answer;
}

// Node `node` joining a running job: node 0 admits it in Poll, which
// reports no stop meanwhile.
absl::StatusOr<Link> JoinLate(NodeLink& zero, int port, int node,
                              const NodeLink::Shape& shape) {
  auto joined = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, node, shape,
                          absl::Now() + absl::Seconds(5));
  });
  while (joined.wait_for(std::chrono::milliseconds(10)) !=
         std::future_status::ready) {
    EXPECT_EQ(zero.Poll(), std::nullopt);
  }
  return joined.get();
}

// Polls `link` until it reports a stop (or 5 s pass).
std::optional<NodeLink::Stop> AwaitStop(NodeLink& link) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    if (std::optional<NodeLink::Stop> stop = link.Poll()) return stop;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return std::nullopt;
}

// Every node's Finish(code) at once; the job's exit status on each.
std::vector<int> FinishAll(std::vector<Link>& links, int code) {
  NoSignals signals;
  std::vector<std::future<int>> ends;
  for (Link& link : links) {
    ends.push_back(std::async(std::launch::async, [&link, &signals, code] {
      return link->Finish(code, signals.fd());
    }));
  }
  std::vector<int> codes;
  for (auto& end : ends) codes.push_back(end.get());
  return codes;
}

TEST(NodeLinkTest, EveryNodeLearnsTheJobAndAllEndWithZero) {
  std::vector<Link> links = Connect(FreePort(), 3);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  for (const Link& link : links) EXPECT_EQ(link->job(), "the-job");
  for (int code : FinishAll(links, 0)) EXPECT_EQ(code, 0);
}

TEST(NodeLinkTest, AFailureOnOneNodeStopsTheOthersWithItsStatus) {
  std::vector<Link> links = Connect(FreePort(), 3);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[2]->Failed(3);
  for (int n : {0, 1}) {
    const std::optional<NodeLink::Stop> stop = AwaitStop(*links[n]);
    ASSERT_TRUE(stop.has_value()) << "node " << n;
    EXPECT_EQ(stop->code, 3);
    EXPECT_NE(stop->why.find("node 2's processes failed (its exit status 3)"),
              std::string::npos)
        << stop->why;
  }
  EXPECT_EQ(links[2]->Poll(), std::nullopt);  // its own failure: no stop
  NoSignals signals;
  std::vector<std::future<int>> ends;
  for (int n = 0; n < 3; ++n) {
    // Nodes 0 and 1 stopped their copies (killed: 143); node 2's exited 3.
    const int code = n == 2 ? 3 : 143;
    ends.push_back(std::async(std::launch::async, [&, n, code] {
      return links[n]->Finish(code, signals.fd());
    }));
  }
  for (auto& end : ends) EXPECT_EQ(end.get(), 3);  // the first failure's
}

// A launcher stopped by a signal, node 0's or another's where every node
// is needed, stops the job with 130 and is named as interrupted, not as
// processes that failed: it may have started none.
TEST(NodeLinkTest, AnInterruptedNodeIsNamedSo) {
  for (int interrupted : {0, 1}) {
    std::vector<Link> links = Connect(FreePort(), 3);
    ASSERT_TRUE(links[0] && links[1] && links[2]);
    links[interrupted]->Leave();
    for (int n = 0; n < 3; ++n) {  // node 0 first: it tells the others
      if (n == interrupted) continue;
      const std::optional<NodeLink::Stop> stop = AwaitStop(*links[n]);
      ASSERT_TRUE(stop.has_value()) << "node " << n;
      EXPECT_EQ(stop->code, 130);
      EXPECT_NE(stop->why.find(
                    absl::StrCat("node ", interrupted, " was interrupted")),
                std::string::npos)
          << stop->why;
    }
    for (int code : FinishAll(links, 130)) EXPECT_EQ(code, 130);
  }
}

// Where nodes may be lost, a launcher stopped by a signal (a host drained)
// leaves at once; node 0 counts it lost and the job goes on, until a second
// one leaves below --min-nodes.
TEST(NodeLinkTest, AStoppedLauncherLeavesAJobThatMayLoseNodes) {
  std::vector<Link> links = Connect(FreePort(), 3, 0, /*min_nodes=*/2);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[2]->Leave();
  NoSignals signals;
  auto left = std::async(std::launch::async,
                         [&] { return links[2]->Finish(130, signals.fd()); });
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  while (absl::Now() < deadline) {
    EXPECT_EQ(links[0]->Poll(), std::nullopt);
    EXPECT_EQ(links[1]->Poll(), std::nullopt);
    absl::SleepFor(absl::Milliseconds(10));
  }
  // Node 2 ended without waiting for node 0's verdict.
  EXPECT_EQ(left.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  links[1]->Leave();
  const std::optional<NodeLink::Stop> stop = AwaitStop(*links[0]);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->code, 1);
  EXPECT_NE(stop->why.find("node 1 left (its launcher was stopped): 1 of the "
                           "job's 3 nodes are left (2 lost)"),
            std::string::npos)
      << stop->why;
  EXPECT_EQ(links[0]->Finish(0, signals.fd()), 1);
  EXPECT_EQ(left.get(), 130);
}

// A node that leaves, or loses copies, while the others' copies wait for
// the first view lowers the view they wait for (else they would wait for
// workers that never come, up to the start timeout), also on a node that
// joined the running job since.
TEST(NodeLinkTest, LossesLowerTheViewEveryNodeAwaits) {
  const int port = FreePort();
  std::vector<Link> links = Connect(port, 3, 0, /*min_nodes=*/1);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  ASSERT_EQ(links[1]->members(), 6);
  // Polls node 0 and `node` until `node` expects `members` (or 5 s pass).
  auto await = [&](NodeLink& node, int members) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (node.members() != members && absl::Now() < deadline) {
      EXPECT_EQ(links[0]->Poll(), std::nullopt);
      EXPECT_EQ(node.Poll(), std::nullopt);
      absl::SleepFor(absl::Milliseconds(10));
    }
    return node.members();
  };
  links[2]->Leave();
  EXPECT_EQ(await(*links[1], 4), 4);
  EXPECT_EQ(links[0]->members(), 4);
  absl::StatusOr<Link> back = JoinLate(*links[0], port, 2, Nodes(3, 0, 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->members(), 6);
  links[1]->Lost(1);  // told node 0, which tells the others
  EXPECT_EQ(await(**back, 5), 5);
  links[1]->Leave();
  EXPECT_EQ(await(**back, 4), 4);
  links[0]->Lost(1);
  EXPECT_EQ(await(**back, 3), 3);
  EXPECT_EQ(links[0]->members(), 3);
}

// Node 0 sending to a node that said "leaving" and closed its end (the
// send fails with EPIPE or ECONNRESET) still reads that line: the node is
// named as left, not as gone.
TEST(NodeLinkTest, ALineBeforeTheCloseOutlivesAFailedSend) {
  std::vector<Link> links =
      Connect(FreePort(), 3, /*min_copies=*/4, /*min_nodes=*/1);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[2]->Leave();
  absl::SleepFor(absl::Milliseconds(100));
  links[0]->Lost(1);  // "members 5" to node 2, answered by a reset
  absl::SleepFor(absl::Milliseconds(100));
  links[1]->Lost(1);  // node 0's next Poll sends "members 4": it fails
  absl::SleepFor(absl::Milliseconds(100));
  const std::optional<NodeLink::Stop> stop = AwaitStop(*links[0]);
  ASSERT_TRUE(stop.has_value());
  EXPECT_TRUE(absl::StartsWith(stop->why,
                               "node 2 left (its launcher was stopped): 2 of "
                               "the job's 6 processes are left"))
      << stop->why;
}

TEST(NodeLinkTest, ALauncherThatDiesCountsAsItsNodeFailing) {
  std::vector<Link> links = Connect(FreePort(), 3);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[1].reset();  // its connection closes without "done"
  const std::optional<NodeLink::Stop> at_zero = AwaitStop(*links[0]);
  ASSERT_TRUE(at_zero.has_value());
  EXPECT_NE(at_zero->why.find("node 1"), std::string::npos) << at_zero->why;
  const std::optional<NodeLink::Stop> stop = AwaitStop(*links[2]);
  ASSERT_TRUE(stop.has_value());  // passed on by node 0
  EXPECT_EQ(stop->code, 1);
}

TEST(NodeLinkTest, NodeZeroGoneEndsTheOthersWithAFailure) {
  std::vector<Link> links = Connect(FreePort(), 2);
  ASSERT_TRUE(links[0] && links[1]);
  links[0].reset();
  NoSignals signals;
  EXPECT_EQ(links[1]->Finish(0, signals.fd()), 1);
}

TEST(NodeLinkTest, ANodeThatNeverJoinsIsNamedByTheDeadline) {
  const int port = FreePort();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  auto one = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1, Nodes(3),
                          deadline + absl::Seconds(20));
  });
  const absl::StatusOr<Link> zero = Serve(port, Nodes(3), deadline);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(zero.status())) << zero.status();
  EXPECT_NE(zero.status().message().find("node 2 of 3"), std::string::npos)
      << zero.status();
  // Node 1 is told to stop, not left waiting for its own deadline.
  const absl::StatusOr<Link> joined = one.get();
  EXPECT_TRUE(absl::IsFailedPrecondition(joined.status())) << joined.status();
  EXPECT_LT(absl::Now() - deadline, absl::Seconds(3));
}

TEST(NodeLinkTest, ARankTakenTwiceIsRefused) {
  const int port = FreePort();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto join = [&](int node) {
    return std::async(std::launch::async, [&, node] {
      return NodeLink::Join("127.0.0.1", port, node, Nodes(3), deadline);
    });
  };
  auto zero = std::async(std::launch::async,
                         [&] { return Serve(port, Nodes(3), deadline); });
  auto first = join(1), second = join(1);
  // The one refused answers at once; the other waits for node 2.
  auto ready = [](auto& f) {
    return f.wait_for(std::chrono::milliseconds(10)) ==
           std::future_status::ready;
  };
  while (!ready(first) && !ready(second) && absl::Now() < deadline) {
  }
  auto& refused = ready(first) ? first : second;
  auto& accepted = ready(first) ? second : first;
  const absl::Status why = refused.get().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(why)) << why;
  auto two = join(2);
  EXPECT_TRUE(zero.get().ok());
  EXPECT_TRUE(accepted.get().ok());
  EXPECT_TRUE(two.get().ok());
}

TEST(NodeLinkTest, NodesOfAnotherShapeAreRefusedWithBothShapes) {
  const int port = FreePort();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto one = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1,
                          {.nodes = 2, .per_node = 4, .min_copies = 3},
                          deadline);
  });
  const absl::StatusOr<Link> zero = Serve(port, Nodes(2), deadline);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(zero.status())) << zero.status();
  EXPECT_NE(zero.status().message().find("--nproc_per_node=4 --min-np=3"),
            std::string::npos)
      << zero.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(one.get().status()));
}

TEST(NodeLinkTest, NodesThatDisagreeOnTheMinimumOfNodesAreRefused) {
  const int port = FreePort();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto one = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1, Nodes(2, 0, 1), deadline);
  });
  const absl::StatusOr<Link> zero = Serve(port, Nodes(2), deadline);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("--min-nodes=1, node 0 with"),
            std::string::npos)
      << zero.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(one.get().status()));
}

// With --min-nodes=2 of 3, node 1's launcher gone (its host died) leaves the
// job: nobody is stopped, and the other two end with 0.
TEST(NodeLinkTest, AHostGoneLeavesTheJobWhileEnoughNodesAreLeft) {
  std::vector<Link> links = Connect(FreePort(), 3, 0, /*min_nodes=*/2);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  EXPECT_TRUE(links[0]->nodes_may_be_lost());
  EXPECT_TRUE(links[2]->nodes_may_be_lost());
  links[1].reset();
  absl::SleepFor(absl::Milliseconds(300));
  for (int n : {0, 2}) EXPECT_EQ(links[n]->Poll(), std::nullopt) << n;
  links.erase(links.begin() + 1);
  for (int code : FinishAll(links, 0)) EXPECT_EQ(code, 0);
}

// Without --min-nodes every node is needed, as before: a node whose copies
// are all lost stops the job.
TEST(NodeLinkTest, EveryNodeIsNeededByDefault) {
  std::vector<Link> links = Connect(FreePort(), 2);
  ASSERT_TRUE(links[0] && links[1]);
  EXPECT_FALSE(links[0]->nodes_may_be_lost());
  EXPECT_FALSE(links[1]->nodes_may_be_lost());
  links[1]->Lost(2);
  const std::optional<NodeLink::Stop> stop = AwaitStop(*links[0]);
  ASSERT_TRUE(stop.has_value());
  EXPECT_NE(stop->why.find("fewer than --min-nodes=2"), std::string::npos)
      << stop->why;
}

// A node whose copies are all lost counts as lost; a second lost node (its
// launcher gone) leaves 1 of 3, fewer than --min-nodes=2: every node left
// stops with status 1, saying why.
TEST(NodeLinkTest, FewerNodesThanTheMinimumStopEveryNode) {
  std::vector<Link> links = Connect(FreePort(), 3, 0, /*min_nodes=*/2);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[1]->Lost(2);
  absl::SleepFor(absl::Milliseconds(300));
  for (Link& link : links) EXPECT_EQ(link->Poll(), std::nullopt);
  links[2].reset();
  for (int n : {0, 1}) {
    const std::optional<NodeLink::Stop> stop = AwaitStop(*links[n]);
    ASSERT_TRUE(stop.has_value()) << "node " << n;
    EXPECT_EQ(stop->code, 1);
    EXPECT_NE(stop->why.find("1 of the job's 3 nodes are left (2 lost), "
                             "fewer than --min-nodes=2"),
              std::string::npos)
        << stop->why;
  }
}

// A node counts once: node 1's copies lost, then its launcher gone, is one
// lost node of 3 (--min-nodes=2: the job goes on); node 0's own copies all
// lost is the second: 1 node left stops every node.
TEST(NodeLinkTest, ANodeLostTwiceCountsOnceAndNodeZeroCountsToo) {
  std::vector<Link> links = Connect(FreePort(), 3, 0, /*min_nodes=*/2);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[1]->Lost(2);
  links[1].reset();
  absl::SleepFor(absl::Milliseconds(300));
  for (int n : {0, 2}) EXPECT_EQ(links[n]->Poll(), std::nullopt) << n;
  links[0]->Lost(2);
  for (int n : {0, 2}) {
    const std::optional<NodeLink::Stop> stop = AwaitStop(*links[n]);
    ASSERT_TRUE(stop.has_value()) << "node " << n;
    EXPECT_NE(stop->why.find("1 of the job's 3 nodes are left (2 lost)"),
              std::string::npos)
        << stop->why;
  }
}

// A node of another version (its hello has other fields) is named at once,
// not waited for until the deadline.
TEST(NodeLinkTest, ANodeOfAnotherVersionIsRefusedAtOnce) {
  const int port = FreePort();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto zero = std::async(std::launch::async,
                         [&] { return Serve(port, Nodes(2), deadline); });
  absl::StatusOr<int> fd = ConnectTcp("127.0.0.1", port);
  while (!fd.ok() && absl::Now() < deadline) fd = ConnectTcp("127.0.0.1", port);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const std::string hello = "node 1 2 2 0\n";  // before --min-nodes
  ASSERT_EQ(write(*fd, hello.data(), hello.size()),
            static_cast<ssize_t>(hello.size()));
  const absl::StatusOr<Link> served = zero.get();
  EXPECT_TRUE(absl::IsInvalidArgument(served.status())) << served.status();
  EXPECT_NE(served.status().message().find("another version"),
            std::string::npos)
      << served.status();
  EXPECT_LT(absl::Now() + absl::Seconds(8), deadline);
  close(*fd);
}

TEST(NodeLinkTest, AnInterruptEndsTheWaitAndStopsTheOthers) {
  std::vector<Link> links = Connect(FreePort(), 2);
  ASSERT_TRUE(links[0] && links[1]);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  const int fd = signalfd(-1, &usr1, SFD_NONBLOCK | SFD_CLOEXEC);
  kill(getpid(), SIGUSR1);
  EXPECT_EQ(links[0]->Finish(0, fd), 130);  // node 1 is still running
  const std::optional<NodeLink::Stop> stop = AwaitStop(*links[1]);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->code, 130);
  close(fd);
}

// 3 nodes of 2 copies with --min-np=5: one copy lost leaves 5 and the
// job goes on; a second, on another node, leaves 4 and stops every node,
// the ones that lost them too, with status 1 and the reason.
TEST(NodeLinkTest, FewerCopiesThanTheMinimumStopEveryNode) {
  std::vector<Link> links = Connect(FreePort(), 3, /*min_copies=*/5);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[1]->Lost(1);
  absl::SleepFor(absl::Milliseconds(300));
  for (Link& link : links) EXPECT_EQ(link->Poll(), std::nullopt);
  links[2]->Lost(1);
  for (int n : {0, 1, 2}) {
    const std::optional<NodeLink::Stop> stop = AwaitStop(*links[n]);
    ASSERT_TRUE(stop.has_value()) << "node " << n;
    EXPECT_EQ(stop->code, 1);
    EXPECT_NE(stop->why.find("4 of the job's 6 processes are left"),
              std::string::npos)
        << stop->why;
    EXPECT_NE(stop->why.find("--min-np=5"), std::string::npos) << stop->why;
  }
  for (int code : FinishAll(links, 1)) EXPECT_EQ(code, 1);
}

TEST(NodeLinkTest, NodeZerosOwnLossCountsToo) {
  std::vector<Link> links = Connect(FreePort(), 2, /*min_copies=*/4);
  ASSERT_TRUE(links[0] && links[1]);
  links[0]->Lost(1);
  for (int n : {0, 1}) {
    const std::optional<NodeLink::Stop> stop = AwaitStop(*links[n]);
    ASSERT_TRUE(stop.has_value()) << "node " << n;
    EXPECT_EQ(stop->code, 1);
    EXPECT_NE(stop->why.find("3 of the job's 4 processes are left"),
              std::string::npos)
        << stop->why;
  }
  EXPECT_NE(links[1]->why().find("--min-np=4"), std::string::npos);
}

// A node's count of lost copies only grows, and never past its copies.
TEST(NodeLinkTest, LossCountsOnlyGrowWithinANodesCopies) {
  std::vector<Link> links = Connect(FreePort(), 3, /*min_copies=*/3,
                                    /*min_nodes=*/1);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[1]->Lost(50);  // counts as its 2
  links[1]->Lost(0);   // stale: still 2
  absl::SleepFor(absl::Milliseconds(300));
  for (Link& link : links) EXPECT_EQ(link->Poll(), std::nullopt);
  links[2]->Lost(2);  // 2 left of 6
  const std::optional<NodeLink::Stop> stop = AwaitStop(*links[0]);
  ASSERT_TRUE(stop.has_value());
  EXPECT_NE(stop->why.find("2 of the job's 6"), std::string::npos) << stop->why;
}

// Once a copy exited 0 the job is over: losses stop nothing.
TEST(NodeLinkTest, LossesAfterACopyEndedWellStopNothing) {
  std::vector<Link> links = Connect(FreePort(), 2, /*min_copies=*/4);
  ASSERT_TRUE(links[0] && links[1]);
  links[1]->Ended();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!links[0]->ended() && absl::Now() < deadline) {
    EXPECT_EQ(links[0]->Poll(), std::nullopt);
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(links[0]->ended());
  links[1]->Lost(1);
  links[0]->Lost(1);
  absl::SleepFor(absl::Milliseconds(300));
  for (Link& link : links) EXPECT_EQ(link->Poll(), std::nullopt);
}

// A copy that exited 0 on one node is known on every node, so that none
// starts a failed copy again to wait for peers that are gone.
TEST(NodeLinkTest, ACopyThatEndedWellIsKnownOnEveryNode) {
  std::vector<Link> links = Connect(FreePort(), 3);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  for (Link& link : links) EXPECT_FALSE(link->ended());
  links[2]->Ended();
  EXPECT_TRUE(links[2]->ended());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!(links[0]->ended() && links[1]->ended()) && absl::Now() < deadline) {
    for (Link& link : links) EXPECT_EQ(link->Poll(), std::nullopt);
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(links[0]->ended());
  EXPECT_TRUE(links[1]->ended());
}

// --nnodes=2:3: node 0 and node 1 start the job once the last call has
// passed without node 2; both expect the 4 workers of 2 nodes.
TEST(NodeLinkTest, TheJobStartsWithTheMinimumAfterTheLastCall) {
  const int port = FreePort();
  const NodeLink::Shape shape = Nodes(3, 0, /*min_nodes=*/2);
  const absl::Time start = absl::Now();
  auto one = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1, shape,
                          start + absl::Seconds(10));
  });
  const absl::StatusOr<Link> zero =
      Serve(port, shape, start + absl::Seconds(10), absl::Milliseconds(500));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const absl::StatusOr<Link> joined = one.get();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ((*zero)->members(), 4);
  EXPECT_EQ((*joined)->members(), 4);
}

// Fewer nodes than --min-nodes by the deadline: the missing are named.
TEST(NodeLinkTest, FewerNodesThanTheMinimumByTheDeadlineAreNamed) {
  const absl::StatusOr<Link> zero =
      Serve(FreePort(), Nodes(3, 0, /*min_nodes=*/2),
            absl::Now() + absl::Milliseconds(300), absl::Milliseconds(100));
  ASSERT_TRUE(absl::IsDeadlineExceeded(zero.status())) << zero.status();
  EXPECT_NE(zero.status().message().find("node 1, 2 of 3 did not join"),
            std::string::npos)
      << zero.status();
  EXPECT_NE(zero.status().message().find("starts with 2 nodes"),
            std::string::npos)
      << zero.status();
}

// Node 0 of --nnodes=1:2 (--min-nodes=1), started alone after a short last
// call.
class NodeLinkAloneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Link> zero = Serve(
        port_, shape_, absl::Now() + absl::Seconds(5), absl::Milliseconds(100));
    ASSERT_TRUE(zero.ok()) << zero.status();
    zero_ = *std::move(zero);
  }
  absl::StatusOr<Link> JoinNodeOne() {
    return JoinLate(*zero_, port_, 1, shape_);
  }

  const int port_ = FreePort();
  const NodeLink::Shape shape_ = Nodes(2, 0, /*min_nodes=*/1);
  Link zero_;
};

// --nnodes=1:2: node 0 starts alone; node 1 joins the running job and
// expects the workers of both; its failure is then the job's.
TEST_F(NodeLinkAloneTest, ANodeThatComesLaterJoinsTheRunningJob) {
  EXPECT_EQ(zero_->members(), 2);
  absl::StatusOr<Link> one = JoinNodeOne();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->job(), "the-job");
  EXPECT_EQ((*one)->members(), 4);
  (*one)->Failed(3);  // it is in the job: its failure is everyone's
  const std::optional<NodeLink::Stop> stop = AwaitStop(*zero_);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->code, 3);
}

// With --min-nodes=2 of 3, node 1's host is lost and comes back (its
// launcher started again): it is in the job again, so that node 2's loss
// then leaves 2 nodes, enough to go on.
TEST(NodeLinkTest, ALostNodeWhoseLauncherStartsAgainIsBackInTheJob) {
  const int port = FreePort();
  std::vector<Link> links = Connect(port, 3, 0, /*min_nodes=*/2);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  links[1].reset();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(links[0]->Poll(), std::nullopt);  // lost: 2 of 3 left
  absl::StatusOr<Link> again =
      JoinLate(*links[0], port, 1, Nodes(3, 0, /*min_nodes=*/2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->members(), 6);
  links[1] = *std::move(again);
  links[2].reset();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(links[0]->Poll(), std::nullopt);
  links.pop_back();
  for (int code : FinishAll(links, 0)) EXPECT_EQ(code, 0);
}

// A node whose rank is in the job is answered "busy" (it tries again); one
// that comes once a copy ended well is refused; the job goes on.
TEST(NodeLinkTest, NoNodeJoinsTwiceOrAJobThatIsOver) {
  const int port = FreePort();
  const NodeLink::Shape shape = Nodes(3, 0, /*min_nodes=*/2);
  std::vector<Link> links = Connect(port, 3, 0, /*min_nodes=*/2);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  EXPECT_EQ(AnswerTo(*links[0], port, "node 2 3 2 0 2 2"), "busy");
  links[2].reset();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(links[0]->Poll(), std::nullopt);  // node 2 is lost
  links[1]->Ended();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!links[0]->ended() && absl::Now() < deadline) {
    EXPECT_EQ(links[0]->Poll(), std::nullopt);
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::StatusOr<Link> late = JoinLate(*links[0], port, 2, shape);
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
  links.pop_back();
  for (int code : FinishAll(links, 0)) EXPECT_EQ(code, 0);
}

// A node that comes after a failure is refused.
TEST_F(NodeLinkAloneTest, NoNodeJoinsAJobThatFailed) {
  zero_->Failed(3);
  absl::StatusOr<Link> late = JoinNodeOne();
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
}

// A node that joins after copies were lost expects only the workers left:
// node 0's 2 less the one lost, and its own 2.
TEST_F(NodeLinkAloneTest, ALateNodeExpectsOnlyTheWorkersLeft) {
  zero_->Lost(1);
  absl::StatusOr<Link> one = JoinNodeOne();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->members(), 3);
}

// A launcher started again while node 0 still links its old one (not yet
// noticed gone) is told "busy" and gets in once the old link ends.
TEST(NodeLinkTest, ANodeStartedAgainBeforeItsOldLinkEndedGetsIn) {
  const int port = FreePort();
  const NodeLink::Shape shape = Nodes(3, 0, /*min_nodes=*/2);
  std::vector<Link> links = Connect(port, 3, 0, /*min_nodes=*/2);
  ASSERT_TRUE(links[0] && links[1] && links[2]);
  auto again = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1, shape,
                          absl::Now() + absl::Seconds(10));
  });
  const absl::Time old_ends = absl::Now() + absl::Milliseconds(1500);
  while (again.wait_for(std::chrono::milliseconds(10)) !=
         std::future_status::ready) {
    if (links[1] && absl::Now() >= old_ends) links[1].reset();
    EXPECT_EQ(links[0]->Poll(), std::nullopt);
  }
  EXPECT_EQ(links[1], nullptr);  // it got in only after the old one ended
  absl::StatusOr<Link> joined = again.get();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ((*joined)->members(), 6);
}

// Before the start, a second launcher with a linked node's rank is answered
// "busy", and the first one, still waiting for the job, is left alone.
TEST(NodeLinkTest, ASecondLauncherOfANodeBeforeTheStartLeavesTheFirstAlone) {
  const int port = FreePort();
  const NodeLink::Shape shape = Nodes(3, 0, /*min_nodes=*/2);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto zero = std::async(std::launch::async, [&] {
    return Serve(port, shape, deadline, /*last_call=*/absl::Seconds(2));
  });
  auto first = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1, shape, deadline);
  });
  absl::SleepFor(absl::Seconds(1));  // the first is linked
  const absl::StatusOr<Link> second = NodeLink::Join(
      "127.0.0.1", port, 1, shape, absl::Now() + absl::Milliseconds(1500));
  EXPECT_FALSE(second.ok());  // busy until its deadline
  const absl::StatusOr<Link> started = zero.get();
  ASSERT_TRUE(started.ok()) << started.status();
  const absl::StatusOr<Link> joined = first.get();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ((*joined)->members(), 4);
}

// This process's socket connected to `port` (the first found), else -1.
int SocketConnectedTo(int port) {
  for (int fd = 3; fd < 1024; ++fd) {
    sockaddr_in peer{};
    socklen_t size = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) == 0 &&
        peer.sin_family == AF_INET && ntohs(peer.sin_port) == port) {
      return fd;
    }
  }
  return -1;
}

// A launcher started again on a host that restarted (its old link vanished
// without a word) gets in at its next try: node 0 probes the old link when
// it answers "busy", and the host's reset ends it (keepalive takes 30 s).
TEST(NodeLinkTest, ANodeWhoseHostRestartedGetsInAtItsNextTry) {
  const int port = FreePort();
  const NodeLink::Shape shape = Nodes(2, 0, /*min_nodes=*/1);
  std::vector<Link> links = Connect(port, 2, 0, /*min_nodes=*/1);
  ASSERT_TRUE(links[0] && links[1]);
  const int old = SocketConnectedTo(port);  // node 1's: node 0's is accepted
  ASSERT_GE(old, 0);
  const int on = 1;
  if (setsockopt(old, IPPROTO_TCP, TCP_REPAIR, &on, sizeof(on)) != 0) {
    GTEST_SKIP() << "TCP_REPAIR needs CAP_NET_ADMIN: " << std::strerror(errno);
  }
  links[1].reset();  // closed in repair mode: gone with no FIN and no reset
  const absl::Time start = absl::Now();
  auto again = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1, shape,
                          absl::Now() + absl::Seconds(10));
  });
  while (again.wait_for(std::chrono::milliseconds(10)) !=
         std::future_status::ready) {
    EXPECT_EQ(links[0]->Poll(), std::nullopt);
  }
  absl::StatusOr<Link> joined = again.get();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Without a minimum of nodes (--nnodes=N), nothing joins after the start.
TEST(NodeLinkTest, EveryNodeNeededMeansNoneJoinsLater) {
  const int port = FreePort();
  std::vector<Link> links = Connect(port, 2);
  ASSERT_TRUE(links[0] && links[1]);
  const absl::StatusOr<Link> late = NodeLink::Join(
      "127.0.0.1", port, 1, Nodes(2), absl::Now() + absl::Milliseconds(500));
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status();
}

TEST(NodeLinkTest, CodesOutOfRangeAndStrayWordsFail) {
  std::vector<Link> links = Connect(FreePort(), 2);
  ASSERT_TRUE(links[0] && links[1]);
  links[1]->Failed(256);  // would exit 0 as a status
  const std::optional<NodeLink::Stop> stop = AwaitStop(*links[0]);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->code, 1);
}

}  // namespace
}  // namespace gradmesh::tools

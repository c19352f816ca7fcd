// Supervisor with shell copies and a stand-in for the workers: what a copy
// whose worker is gone ends in, with and without restarts.
#include "tools/gradmesh/supervisor.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/support/free_port.h"
#include "tests/support/no_signals.h"

namespace gradmesh::tools {
namespace {

using ::gradmesh::testing::FreePort;
using ::gradmesh::testing::NoSignals;

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/supervisor-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Two copies, ranks 0 and 1: rank 1 fails the first time (its worker is
  // gone, Rank1Gone, and `then` follows: by default it exits with status 3)
  // and writes "again" when started again; rank 0 waits up to 20 s for
  // that, so that rank 1 is decided while it runs. Returns the supervisor's
  // exit code.
  int RunTwo(Supervisor& supervisor, const std::string& then = "exit 3") {
    const std::string script =
        "if [ \"$R\" = 1 ]; then "
        "  if [ -f \"$D/failed\" ]; then touch \"$D/again\"; exit 0; fi; "
        "  touch \"$D/failed\"; " +
        then +
        "; "
        "fi; "
        "for i in $(seq 200); do "
        "  [ -f \"$D/again\" ] && exit 0; "
        "  [ -f \"$D/failed\" ] && [ -f \"$D/decided\" ] && exit 0; "
        "  sleep 0.1; "
        "done; exit 0";
    supervisor.StartAll("/bin/sh", {"/bin/sh", "-c", script},
                        {{"PATH=/usr/bin:/bin", "R=0", "D=" + dir_},
                         {"PATH=/usr/bin:/bin", "R=1", "D=" + dir_}});
    supervisor.Wait();
    return supervisor.exit_code();
  }
  // Lets rank 0 end without rank 1 started again (once decided lost).
  void Decided() { std::ofstream(dir_ + "/decided"); }
  bool StartedAgain() const { return std::filesystem::exists(dir_ + "/again"); }
  // A stand-in for a worker's restart: records the index and succeeds.
  static std::function<absl::Status(int)> Record(std::vector<int>* restarted) {
    return [restarted](int index) {
      restarted->push_back(index);
      return absl::OkStatus();
    };
  }
  // Stand-ins for the workers: a copy's is gone once the copy wrote
  // "started-R" (R its rank, and index).
  std::function<bool(int)> Started() const {
    return [dir = dir_](int index) {
      return std::filesystem::exists(absl::StrCat(dir, "/started-", index));
    };
  }
  // Rank 1's is gone once rank 1 failed.
  std::function<bool(int)> Rank1Gone() const {
    return [failed = dir_ + "/failed"](int index) {
      return index == 1 && std::filesystem::exists(failed);
    };
  }

  NoSignals signals_;
  std::string dir_;
};

TEST_F(SupervisorTest, AGoneWorkerIsStartedAgainThenItsCopy) {
  std::vector<int> restarted;
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone(), nullptr,
                        {.max_restarts = 1}, Record(&restarted));
  EXPECT_EQ(RunTwo(supervisor), 0);
  EXPECT_EQ(restarted, std::vector<int>{1});
  EXPECT_TRUE(StartedAgain());
  EXPECT_TRUE(supervisor.lost().empty());
  EXPECT_FALSE(supervisor.failed());
}

// Rank 1's worker is gone while rank 1 runs on for a minute (a long
// evaluation between two calls to its worker): the launcher does not wait
// for it to fail, but kills it and starts its worker and it again.
TEST_F(SupervisorTest, ACopyWhoseWorkerIsGoneWhileItRunsIsStartedAgainAtOnce) {
  std::vector<int> restarted;
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone(), nullptr,
                        {.max_restarts = 1}, Record(&restarted));
  EXPECT_EQ(RunTwo(supervisor, /*then=*/"sleep 60; exit 0"), 0);
  EXPECT_EQ(restarted, std::vector<int>{1});
  EXPECT_TRUE(StartedAgain());  // else rank 0 ends first: no restart
  EXPECT_FALSE(supervisor.failed());
}

// With no restart left, a copy whose worker is gone runs on: it may no
// longer need its worker, and ends as it will.
TEST_F(SupervisorTest, WithNoRestartLeftACopyWhoseWorkerIsGoneRunsOn) {
  std::vector<int> restarted;
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone(), nullptr,
                        {.max_restarts = 0}, Record(&restarted));
  EXPECT_EQ(RunTwo(supervisor,
                   /*then=*/"sleep 1; touch \"$D/decided\"; exit 0"),
            0);
  EXPECT_TRUE(restarted.empty());
  EXPECT_TRUE(supervisor.lost().empty());
  EXPECT_FALSE(supervisor.failed());
}

// Both workers gone at once with one restart left: one copy is stopped and
// started again, the other runs on (stopping it too would leave it lost).
TEST_F(SupervisorTest, CopiesAreStoppedOnlyForTheRestartsLeft) {
  std::vector<int> restarted;
  Supervisor supervisor(signals_.fd(), {0, 1}, Started(), nullptr,
                        {.max_restarts = 1}, Record(&restarted));
  supervisor.StartAll(
      "/bin/sh",
      {"/bin/sh", "-c",
       "if [ -f \"$D/started-$R\" ]; then touch \"$D/again-$R\"; exit 0; fi; "
       "touch \"$D/started-$R\"; sleep 3; exit 0"},
      {{"PATH=/usr/bin:/bin", "R=0", "D=" + dir_},
       {"PATH=/usr/bin:/bin", "R=1", "D=" + dir_}});
  supervisor.Wait();
  EXPECT_EQ(supervisor.exit_code(), 0);
  EXPECT_EQ(restarted, std::vector<int>{0});
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/again-0"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/again-1"));
  EXPECT_TRUE(supervisor.lost().empty());
}

// A copy stopped for its gone worker that ignores SIGTERM gets SIGKILL after
// the grace (5 s), and one that exits 0 on SIGTERM (a checkpoint saved)
// has not finished the job: both are started again.
TEST_F(SupervisorTest, ACopyStoppedForItsWorkerIsStartedAgainHoweverItEnds) {
  for (const std::string on_term : {"''", "'exit 0'"}) {
    SCOPED_TRACE(on_term);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directory(dir_);
    std::vector<int> restarted;
    Supervisor supervisor(signals_.fd(), {0, 1}, Started(), nullptr,
                          {.max_restarts = 1}, Record(&restarted));
    const absl::Time start = absl::Now();
    supervisor.StartAll(
        "/bin/sh",
        {"/bin/sh", "-c",
         "if [ \"$R\" = 0 ]; then "
         "  for i in $(seq 200); do [ -f \"$D/again\" ] && exit 0; "
         "  sleep 0.1; done; exit 0; "
         "fi; "
         "if [ -f \"$D/started-1\" ]; then touch \"$D/again\"; exit 0; fi; "
         "trap " +
             on_term +
             " TERM; touch \"$D/started-1\"; "
             "sleep 60 & wait; exit 0"},
        {{"PATH=/usr/bin:/bin", "R=0", "D=" + dir_},
         {"PATH=/usr/bin:/bin", "R=1", "D=" + dir_}});
    supervisor.Wait();
    EXPECT_EQ(supervisor.exit_code(), 0);
    EXPECT_EQ(restarted, std::vector<int>{1});
    EXPECT_TRUE(StartedAgain());
    if (on_term == "''") {  // SIGKILL only after the grace
      EXPECT_GE(absl::Now() - start, absl::Seconds(5));
    }
  }
}

TEST_F(SupervisorTest, WithNoRestartLeftACopyWhoseWorkerIsGoneIsLost) {
  std::vector<int> restarted;
  Decided();
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone(), nullptr,
                        {.max_restarts = 0}, Record(&restarted));
  EXPECT_EQ(RunTwo(supervisor), 0);
  EXPECT_TRUE(restarted.empty());
  EXPECT_FALSE(StartedAgain());
  EXPECT_EQ(supervisor.lost(), std::vector<int>{1});
}

TEST_F(SupervisorTest, AWorkerThatDoesNotStartAgainLeavesItsCopyLost) {
  int tries = 0;
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone(), nullptr,
                        {.max_restarts = 1}, [&](int) {
                          ++tries;
                          Decided();
                          return absl::UnavailableError("no port file");
                        });
  EXPECT_EQ(RunTwo(supervisor), 0);
  EXPECT_EQ(tries, 1);
  EXPECT_FALSE(StartedAgain());
  EXPECT_EQ(supervisor.lost(), std::vector<int>{1});
  EXPECT_FALSE(supervisor.failed());
}

TEST_F(SupervisorTest, FewerCopiesThanTheMinimumFailTheJob) {
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone(), nullptr,
                        {.max_restarts = 0, .min_copies = 2});
  EXPECT_EQ(RunTwo(supervisor), 1);
  EXPECT_TRUE(supervisor.failed());
  EXPECT_EQ(supervisor.lost(), std::vector<int>{1});
  EXPECT_NE(supervisor.failure().find("fewer than --min-np=2"),
            std::string::npos)
      << supervisor.failure();
}

// Node 0 and node 1 of a job of 2 nodes of one copy each, linked.
std::pair<std::unique_ptr<NodeLink>, std::unique_ptr<NodeLink>> TwoNodes(
    int min_nodes) {
  const int port = FreePort();
  const NodeLink::Shape shape = {
      .nodes = 2, .per_node = 1, .min_nodes = min_nodes};
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<NodeLink>> zero = NodeLink::Listen(port);
  EXPECT_TRUE(zero.ok()) << zero.status();
  if (!zero.ok()) return {};
  auto joining = std::async(std::launch::async, [&] {
    return NodeLink::Join("127.0.0.1", port, 1, shape, deadline);
  });
  EXPECT_TRUE(
      (*zero)->AwaitNodes(shape, "job", deadline, absl::Seconds(10)).ok());
  absl::StatusOr<std::unique_ptr<NodeLink>> one = joining.get();
  EXPECT_TRUE(one.ok()) << one.status();
  if (!one.ok()) return {};
  return {*std::move(zero), *std::move(one)};
}

// Node 1's copy fails while its worker runs, with a restart left, after a
// copy of node 0 exited 0: it is not started again (its peers would be
// gone) and the job fails with its status.
TEST_F(SupervisorTest, NoCopyStartsAgainOnceOneEndedWellOnAnotherNode) {
  auto [zero, one] = TwoNodes(/*min_nodes=*/0);
  ASSERT_TRUE(zero && one);
  zero->Ended();  // a copy of node 0 exited 0
  Supervisor supervisor(signals_.fd(), {1}, [](int) { return false; },
                        one.get(), {.max_restarts = 1});
  supervisor.StartAll(
      "/bin/sh",
      {"/bin/sh", "-c",
       "[ -f \"$D/failed\" ] && touch \"$D/again\"; touch \"$D/failed\"; "
       "exit 3"},
      {{"PATH=/usr/bin:/bin", "D=" + dir_}});
  supervisor.Wait();
  EXPECT_FALSE(StartedAgain());
  EXPECT_TRUE(supervisor.failed());
  EXPECT_EQ(supervisor.exit_code(), 3);
}

// Node 1's only copy exits 3 and its worker is gone (at once, or 300 ms
// later: within the grace): with --min-nodes=1 the copy is lost, node 1
// leaves the job and both launchers end with 0 (node 0's copy ended well);
// with every node needed it fails the job with 3.
TEST_F(SupervisorTest, ANodesLastCopyIsLostWhenTheJobMayGoOnWithoutIt) {
  for (const int min_nodes : {1, 0}) {
    for (const auto gone_after :
         {absl::ZeroDuration(), absl::Milliseconds(300)}) {
      SCOPED_TRACE(absl::StrCat("min_nodes ", min_nodes, ", worker gone after ",
                                absl::FormatDuration(gone_after)));
      auto [zero, one] = TwoNodes(min_nodes);
      ASSERT_TRUE(zero && one);
      const absl::Time start = absl::Now();
      Supervisor supervisor(
          signals_.fd(), {1},
          [&](int) { return absl::Now() - start >= gone_after; }, one.get(),
          {.max_restarts = 0});
      supervisor.StartAll("/bin/sh", {"/bin/sh", "-c", "exit 3"},
                          {{"PATH=/usr/bin:/bin"}});
      supervisor.Wait();
      auto ended_one = std::async(std::launch::async, [&] {
        return one->Finish(supervisor.exit_code(), signals_.fd());
      });
      const int job = zero->Finish(0, signals_.fd());
      if (min_nodes == 1) {
        EXPECT_FALSE(supervisor.failed());
        EXPECT_EQ(supervisor.lost(), std::vector<int>{0});
        EXPECT_EQ(job, 0);
      } else {
        EXPECT_TRUE(supervisor.failed());
        EXPECT_EQ(supervisor.exit_code(), 3);
        EXPECT_EQ(job, 3);
      }
      EXPECT_EQ(ended_one.get(), job);
    }
  }
}

TEST_F(SupervisorTest, TheLastCopyWhoseWorkerDoesNotStartAgainFailsTheJob) {
  // Rank 1 alone, its worker gone while it runs: stopped to start both
  // again, and with no other copy left it cannot be lost; the job fails with
  // status 1 (not the signal's).
  Supervisor supervisor(
      signals_.fd(), {1}, [](int) { return true; }, nullptr,
      {.max_restarts = 1},
      [](int) { return absl::UnavailableError("no port file"); });
  supervisor.StartAll("/bin/sh", {"/bin/sh", "-c", "sleep 60"},
                      {{"PATH=/usr/bin:/bin"}});
  supervisor.Wait();
  EXPECT_TRUE(supervisor.failed());
  EXPECT_EQ(supervisor.exit_code(), 1);
  EXPECT_NE(supervisor.failure().find("stopped by gradmesh run"),
            std::string::npos)
      << supervisor.failure();
}

}  // namespace
}  // namespace gradmesh::tools

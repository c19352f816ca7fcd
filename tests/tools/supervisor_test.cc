// Supervisor with shell copies and a stand-in for the workers: what a copy
// whose worker is gone ends in, with and without restarts.
#include "tools/gradmesh/supervisor.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace gradmesh::tools {
namespace {

// A signalfd that never fires (nothing is blocked or sent).
class NoSignals {
 public:
  NoSignals() {
    sigset_t none;
    sigemptyset(&none);
    fd_ = signalfd(-1, &none, SFD_NONBLOCK | SFD_CLOEXEC);
  }
  ~NoSignals() { close(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_;
};

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/supervisor-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Two copies, ranks 0 and 1: rank 1 fails with status 3 the first time
  // (its worker then counts as gone); rank 0 runs long enough for rank 1
  // to be decided while it runs. Returns the supervisor's exit code.
  int RunTwo(Supervisor& supervisor) {
    const std::string script =
        "if [ \"$R\" = 1 ] && [ ! -f \"$D/failed\" ]; then "
        "touch \"$D/failed\"; exit 3; fi; sleep 1.5; exit 0";
    supervisor.StartAll("/bin/sh", {"/bin/sh", "-c", script},
                        {{"PATH=/usr/bin:/bin", "R=0", "D=" + dir_},
                         {"PATH=/usr/bin:/bin", "R=1", "D=" + dir_}});
    supervisor.Wait();
    return supervisor.exit_code();
  }

  NoSignals signals_;
  std::string dir_;
};

bool Rank1Gone(int index) { return index == 1; }

TEST_F(SupervisorTest, AGoneWorkerIsStartedAgainThenItsCopy) {
  std::vector<int> restarted;
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone, nullptr,
                        /*max_restarts=*/1, [&](int index) {
                          restarted.push_back(index);
                          return absl::OkStatus();
                        });
  EXPECT_EQ(RunTwo(supervisor), 0);
  EXPECT_EQ(restarted, std::vector<int>{1});
  EXPECT_TRUE(supervisor.lost().empty());
  EXPECT_FALSE(supervisor.failed());
}

TEST_F(SupervisorTest, WithNoRestartLeftACopyWhoseWorkerIsGoneIsLost) {
  int restarts = 0;
  Supervisor supervisor(signals_.fd(), {0, 1}, Rank1Gone, nullptr,
                        /*max_restarts=*/0, [&](int) {
                          ++restarts;
                          return absl::OkStatus();
                        });
  EXPECT_EQ(RunTwo(supervisor), 0);
  EXPECT_EQ(restarts, 0);
  EXPECT_EQ(supervisor.lost(), std::vector<int>{1});
}

TEST_F(SupervisorTest, AWorkerThatDoesNotStartAgainLeavesItsCopyLost) {
  Supervisor supervisor(
      signals_.fd(), {0, 1}, Rank1Gone, nullptr, /*max_restarts=*/1,
      [](int) { return absl::UnavailableError("no port file"); });
  EXPECT_EQ(RunTwo(supervisor), 0);
  EXPECT_EQ(supervisor.lost(), std::vector<int>{1});
  EXPECT_FALSE(supervisor.failed());
}

}  // namespace
}  // namespace gradmesh::tools

#include "common/shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradmesh {
namespace {

TEST(SharedSegmentTest, BothSidesSeeTheSamePages) {
  const std::string name = SharedSegment::UniqueName("pages");
  auto created = SharedSegment::Create(name, 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  auto opened = SharedSegment::Open(name, 4096);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(SharedSegment::Unlink(name).ok());
  ASSERT_TRUE(SharedSegment::Unlink(name).ok());  // already gone: fine
  created->at<float>(8)[0] = 3.5f;
  EXPECT_EQ(opened->at<float>(8)[0], 3.5f);
  // The mapping outlives its name and moves with the object.
  SharedSegment moved = *std::move(opened);
  EXPECT_EQ(moved.at<float>(8)[0], 3.5f);
  EXPECT_EQ(moved.size(), 4096u);
}

TEST(SharedSegmentTest, RefusesWhatAnotherProcessCouldGetWrong) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      SharedSegment::Create("/etc-passwd", 16).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SharedSegment::Open("/gradmesh-a/b", 16).status()));
  EXPECT_TRUE(absl::IsNotFound(
      SharedSegment::Open("/gradmesh-missing-x", 16).status()));
  const std::string name = SharedSegment::UniqueName("checks");
  auto created = SharedSegment::Create(name, 64);
  ASSERT_TRUE(created.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(SharedSegment::Create(name, 64).status()));
  // The size comes from the other side: it must match exactly.
  EXPECT_TRUE(absl::IsInvalidArgument(SharedSegment::Open(name, 65).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(SharedSegment::Open(name, 32).status()));
  // Readable by others: refused.
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0644), 0);
  close(fd);
  EXPECT_TRUE(absl::IsPermissionDenied(SharedSegment::Open(name, 64).status()));
  ASSERT_TRUE(SharedSegment::Unlink(name).ok());
}

// The daemon learns that the SDK's process is gone from the lock it held:
// destroying the creator's segment (as exiting does) drops it.
TEST(SharedSegmentTest, AbandonedOnceTheLockHolderLetsGo) {
  const std::string name = SharedSegment::UniqueName("lock");
  auto created = SharedSegment::Create(name, 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  auto opened = SharedSegment::Open(name, 4096);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const int other = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(other, 0);
  ASSERT_TRUE(SharedSegment::Unlink(name).ok());
  EXPECT_TRUE(opened->Abandoned()) << "nobody holds a lock yet";
  // Asking does not keep the lock it tried.
  EXPECT_EQ(flock(other, LOCK_SH | LOCK_NB), 0);
  flock(other, LOCK_UN);
  close(other);
  ASSERT_TRUE(created->HoldLock().ok());
  EXPECT_FALSE(opened->Abandoned());
  SharedSegment moved = *std::move(created);  // the lock moves with it
  EXPECT_FALSE(opened->Abandoned());
  moved = SharedSegment();
  EXPECT_TRUE(opened->Abandoned());
  EXPECT_FALSE(SharedSegment().Abandoned());
  EXPECT_FALSE(SharedSegment().HoldLock().ok());
}

// A process that ends without a word (kill -9) lets go of its lock too.
TEST(SharedSegmentTest, AbandonedWhenTheHolderIsKilled) {
  const std::string name = SharedSegment::UniqueName("killed");
  auto opened = [&]() -> absl::StatusOr<SharedSegment> {
    const pid_t child = fork();
    if (child == 0) {
      auto created = SharedSegment::Create(name, 4096);
      if (!created.ok() || !created->HoldLock().ok()) _exit(1);
      pause();  // killed here
      _exit(2);
    }
    for (int i = 0; i < 500; ++i) {
      auto segment = SharedSegment::Open(name, 4096);
      if (segment.ok() && !segment->Abandoned()) {
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
        return segment;
      }
      usleep(10000);
    }
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return absl::DeadlineExceededError("the child never held its lock");
  }();
  SharedSegment::Unlink(name).IgnoreError();
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->Abandoned());
}

// Another local user who guesses the names a process will use and creates
// them first must not stop it from registering: names are not guessable.
TEST(SharedSegmentTest, NamesCannotBeGuessedAndTakenFirst) {
  std::vector<std::string> taken;
  for (int i = 0; i < 100; ++i) {
    // The names a process id and a counter would give.
    taken.push_back("/gradmesh-" + std::to_string(getpid()) + "-" +
                    std::to_string(i) + "-g");
    const int fd = shm_open(taken.back().c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  const std::string name = SharedSegment::UniqueName("g");
  auto segment = SharedSegment::Create(name, 4096);
  EXPECT_TRUE(segment.ok()) << segment.status();
  EXPECT_NE(SharedSegment::UniqueName("g"), SharedSegment::UniqueName("g"));
  SharedSegment::Unlink(name).IgnoreError();
  for (const std::string& t : taken) shm_unlink(t.c_str());
}

TEST(SharedSegmentTest, LayoutHasFourRegionsOfNValues) {
  const SegmentLayout layout(10);
  EXPECT_EQ(layout.values, 0u);
  EXPECT_EQ(layout.indices, 40u);
  EXPECT_EQ(layout.sparse_values, 80u);
  EXPECT_EQ(layout.residual, 120u);
  EXPECT_EQ(layout.bytes, 160u);
  EXPECT_NE(SharedSegment::UniqueName("a"), SharedSegment::UniqueName("a"));
}

}  // namespace
}  // namespace gradmesh

#include "common/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

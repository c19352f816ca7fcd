// The SDK on its own, without a worker: what a user gets wrong first.
#include "gradmesh/client.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace gradmesh {
namespace {

TEST(ClientTest, SaysWhenNoWorkerIsGiven) {
  unsetenv("GRADMESH_WORKER");
  auto client = Client::Connect();
  EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << client.status();
  EXPECT_NE(client.status().message().find("GRADMESH_WORKER"),
            absl::string_view::npos);
}

TEST(ClientTest, GivesUpOnAWorkerThatIsNotThere) {
  const absl::Time start = absl::Now();
  auto client = Client::Connect({.worker = "unix:/nonexistent/gradmesh.sock",
                                 .timeout = absl::Milliseconds(300)});
  EXPECT_TRUE(absl::IsDeadlineExceeded(client.status()) ||
              absl::IsUnavailable(client.status()))
      << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ClientTest, AHandleIsWaitedForOnce) {
  Handle empty;
  EXPECT_TRUE(empty.Done());
  EXPECT_TRUE(absl::IsFailedPrecondition(empty.Wait().status()));
}

}  // namespace
}  // namespace gradmesh

// CoordinatorClient against a coordinator of another protocol version: the
// worker neither joins it nor takes its views, and says why.
#include "worker/daemon/coordinator_client.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/protocol_version.h"

namespace gradmesh::daemon {
namespace {

namespace v1 = ::gradmesh::v1;

// Whether `done` holds within 10 s, asked every 20 ms.
bool Within10s(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

// Answers Hello with `protocol` (none: UNIMPLEMENTED, as a coordinator from
// before versions does), every Join with a view of the joiner alone, and
// every watch with a view that names node "w0".
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  explicit FakeCoordinator(std::optional<uint32_t> protocol)
      : protocol_(protocol) {}

  grpc::Status Hello(grpc::ServerContext*, const v1::HelloRequest* request,
                     v1::HelloResponse* response) override {
    if (!protocol_.has_value()) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
    }
    hello_with_.store(request->protocol());
    response->set_protocol(*protocol_);
    return grpc::Status::OK;
  }
  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override {
    joins_.fetch_add(1);
    *response->mutable_view() = View();
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse* response) override {
    heartbeats_.fetch_add(1);
    response->set_epoch(1);
    return grpc::Status::OK;
  }
  grpc::Status Leave(grpc::ServerContext*, const v1::LeaveRequest*,
                     v1::LeaveResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status WatchViews(grpc::ServerContext*, const v1::WatchRequest*,
                          grpc::ServerWriter<v1::View>* writer) override {
    writer->Write(View());
    return grpc::Status::OK;
  }

  int joins() const { return joins_.load(); }
  int heartbeats() const { return heartbeats_.load(); }
  uint32_t hello_with() const { return hello_with_.load(); }

 private:
  static v1::View View() {
    v1::View view;
    view.set_epoch(1);
    view.add_members()->set_node_id("w0");
    return view;
  }

  const std::optional<uint32_t> protocol_;
  std::atomic<int> joins_{0};
  std::atomic<int> heartbeats_{0};
  std::atomic<uint32_t> hello_with_{0};
};

// A CoordinatorClient of node "w0" following `fake`, recording its views and
// log lines.
class Following {
 public:
  explicit Following(FakeCoordinator* fake) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(fake);
    server_ = builder.BuildAndStart();
    GM_CHECK(server_ != nullptr && port > 0);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                       grpc::InsecureChannelCredentials());
    v1::NodeInfo node;
    node.set_node_id("w0");
    client_ = std::make_unique<CoordinatorClient>(
        v1::Coordinator::NewStub(channel), node, absl::Milliseconds(50),
        [this](const v1::View&) {
          absl::MutexLock lock(&mu_);
          ++views_;
        },
        [this](const std::string& line) {
          absl::MutexLock lock(&mu_);
          lines_.push_back(line);
        },
        [] { return std::vector<std::string>(); });
    client_->Start();
  }
  ~Following() {
    client_->Stop();
    server_->Shutdown();
  }

  // The first log line containing `text`; empty if none.
  std::string Line(const std::string& text) {
    absl::MutexLock lock(&mu_);
    for (const std::string& line : lines_) {
      if (absl::StrContains(line, text)) return line;
    }
    return "";
  }
  int views() {
    absl::MutexLock lock(&mu_);
    return views_;
  }

 private:
  absl::Mutex mu_;
  int views_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorClient> client_;
};

// A coordinator from before versions (Hello unimplemented), and one of a
// newer version: the worker never joins it, never heartbeats, takes none of
// its views, and says why.
TEST(CoordinatorClientTest, ACoordinatorOfAnotherProtocolIsNotFollowed) {
  for (const std::optional<uint32_t> protocol :
       {std::optional<uint32_t>(), std::optional(kProtocolVersion + 1)}) {
    FakeCoordinator fake(protocol);
    Following worker(&fake);
    ASSERT_TRUE(
        Within10s([&] { return !worker.Line("FAILED_PRECONDITION").empty(); }));
    const std::string line = worker.Line("FAILED_PRECONDITION");
    const std::string theirs =
        protocol ? absl::StrCat("protocol ", *protocol, ", ")
                 : "protocol 0 (a gradmesh from before versions were named)";
    EXPECT_TRUE(absl::StrContains(
        line, absl::StrCat("the coordinator speaks ", theirs)))
        << line;
    EXPECT_TRUE(absl::StrContains(
        line, absl::StrCat("this worker ", kProtocolVersion, ": ")))
        << line;
    // Long enough for the watch to have been opened (every 300 ms) had the
    // worker followed it.
    absl::SleepFor(absl::Seconds(1));
    EXPECT_EQ(fake.joins(), 0);
    EXPECT_EQ(fake.heartbeats(), 0);
    EXPECT_EQ(worker.views(), 0);
  }
}

TEST(CoordinatorClientTest, ACoordinatorOfThisProtocolIsFollowed) {
  FakeCoordinator fake(kProtocolVersion);
  Following worker(&fake);
  ASSERT_TRUE(Within10s([&] { return fake.heartbeats() > 0; }));
  EXPECT_EQ(fake.hello_with(), kProtocolVersion);
  EXPECT_GE(fake.joins(), 1);
  EXPECT_TRUE(Within10s([&] { return worker.views() >= 2; }))
      << "the Join's view and the watch's";
  EXPECT_EQ(worker.Line("FAILED_PRECONDITION"), "");
}

}  // namespace
}  // namespace gradmesh::daemon

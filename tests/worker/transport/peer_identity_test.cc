// With mutual TLS, a peer stream speaks for a rank only if the caller's
// certificate names that rank's host: real TLS connections to a PeerService.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc/grpc_util.h"
#include "gradmesh/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/transport/grpc/peer_service.h"

namespace gradmesh::transport {
namespace {

TEST(NamesHostTest, MatchesTheHostOfAnAddress) {
  const std::vector<std::string> names = {"127.0.0.2", "Worker-1.example",
                                          "::1"};
  EXPECT_TRUE(NamesHost(names, "127.0.0.2:7000"));
  EXPECT_TRUE(NamesHost(names, "worker-1.EXAMPLE:7000"));
  EXPECT_TRUE(NamesHost(names, "[::1]:7000"));
  EXPECT_FALSE(NamesHost(names, "127.0.0.3:7000"));
  EXPECT_FALSE(NamesHost(names, "worker-1:7000"));
  EXPECT_FALSE(NamesHost({}, "127.0.0.2:7000"));
}

TEST(NamesHostTest, AWildcardStandsForOneLeftmostLabel) {
  const std::vector<std::string> names = {"*.gradmesh-worker.ns.svc"};
  EXPECT_TRUE(NamesHost(names, "gradmesh-worker-0.gradmesh-worker.ns.svc:1"));
  EXPECT_TRUE(NamesHost(names, "W-7.GRADMESH-worker.ns.svc:1"));
  EXPECT_FALSE(NamesHost(names, "gradmesh-worker.ns.svc:1"));
  EXPECT_FALSE(NamesHost(names, "a.b.gradmesh-worker.ns.svc:1"));
  EXPECT_FALSE(NamesHost(names, ".gradmesh-worker.ns.svc:1"));
  EXPECT_FALSE(NamesHost(names, "a.gradmesh-worker.ns.svc.evil:1"));
  EXPECT_FALSE(NamesHost({"*.0.0.1"}, "127.0.0.1:1"));
}

// A PeerService behind a TLS port on 127.0.0.1, for rank 0 of a group whose
// ranks 1 and 2 serve on 127.0.0.2 and 127.0.0.3; callers present a
// certificate for one of those hosts.
class PeerIdentityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((std::filesystem::temp_directory_path() /
                            absl::StrCat("gradmesh-identity-", getpid()))
                               .string());
    const std::string command =
        absl::StrCat(GRADMESH_SOURCE_DIR, "/scripts/make-test-certs.sh ", *dir_,
                     " 127.0.0.2 127.0.0.3 >/dev/null");
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static TlsFiles Files(const std::string& name) {
    return {.ca = *dir_ + "/ca.pem",
            .cert = absl::StrCat(*dir_, "/", name, ".pem"),
            .key = absl::StrCat(*dir_, "/", name, ".key")};
  }

  void SetUp() override {
    auto credentials = ServerCredentials(Files("node"));
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
  }
  void TearDown() override { server_->Shutdown(); }

  void Open(uint64_t epoch) {
    ASSERT_TRUE(
        service_
            .OpenEpoch(epoch, 0, {"127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"})
            .ok());
  }

  // A stream to the service with `host`'s certificate.
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<v1::Peer::Stub> stub;
    std::unique_ptr<grpc::ClientReaderWriter<v1::Frame, v1::PeerSignal>> stream;

    void Send(uint64_t epoch, uint32_t from, uint32_t step,
              const std::string& data) {
      v1::Frame frame;
      frame.set_epoch(epoch);
      frame.set_step(step);
      frame.set_from_rank(from);
      frame.set_message_bytes(data.size());
      frame.set_data(data);
      stream->Write(frame);
    }
    grpc::StatusCode Finish() {
      stream->WritesDone();
      return stream->Finish().error_code();
    }
  };
  std::unique_ptr<Stream> Connect(const std::string& host) {
    auto credentials = ChannelCredentials(Files(host));
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    auto s = std::make_unique<Stream>();
    s->stub = v1::Peer::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), *credentials));
    s->context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    s->stream = s->stub->Exchange(&s->context);
    return s;
  }

  absl::StatusOr<std::string> Receive(uint64_t epoch, int from, uint32_t step) {
    return service_.Receive(epoch, from, Tag{epoch, 0, step},
                            absl::Now() + absl::Milliseconds(300));
  }

  static std::string* dir_;
  PeerService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};
std::string* PeerIdentityTest::dir_ = nullptr;

// A member speaking for another member's rank is refused; for its own rank
// it is heard.
TEST_F(PeerIdentityTest, RefusesAStreamForAnotherRanksHost) {
  Open(1);
  auto impostor = Connect("127.0.0.3");
  impostor->Send(1, /*from=*/1, 0, "forged");
  EXPECT_EQ(impostor->Finish(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(service_.stats().streams_refused_identity, 1u);
  auto m = Receive(1, 1, 0);
  // Refused at once, so the impostor's end says nothing about rank 1.
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status())) << m.status();

  auto member = Connect("127.0.0.2");
  member->Send(1, /*from=*/1, 0, "genuine");
  EXPECT_EQ(*Receive(1, 1, 0), "genuine");
  EXPECT_EQ(member->Finish(), grpc::StatusCode::OK);
  EXPECT_EQ(service_.stats().messages_delivered, 1u);
}

// A certificate of this CA for a host that no member has: a non-member.
TEST_F(PeerIdentityTest, RefusesANonMember) {
  Open(1);
  for (uint32_t claimed : {1u, 2u}) {
    auto stranger = Connect("node");  // names 127.0.0.1: this rank's host
    stranger->Send(1, claimed, 0, "forged");
    EXPECT_EQ(stranger->Finish(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(service_.stats().streams_refused_identity, 2u);
  EXPECT_EQ(service_.stats().messages_delivered, 0u);
}

// Streams of an epoch not opened yet are checked when it opens: the
// impostor's messages never reach a mailbox, the member's do.
TEST_F(PeerIdentityTest, ChecksStreamsOfAnEpochNotYetOpened) {
  auto impostor = Connect("127.0.0.3");
  impostor->Send(2, /*from=*/1, 0, "forged");
  auto member = Connect("127.0.0.2");
  member->Send(2, /*from=*/1, 1, "genuine");
  // Both held: wait until the two messages have arrived.
  for (int i = 0; i < 200 && service_.stats().messages_delivered < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(service_.stats().messages_delivered, 2u);
  EXPECT_EQ(impostor->Finish(), grpc::StatusCode::OK);  // ended before open
  Open(2);
  EXPECT_EQ(service_.stats().streams_refused_identity, 1u);
  auto forged = Receive(2, 1, 0);
  EXPECT_TRUE(absl::IsDeadlineExceeded(forged.status())) << forged.status();
  EXPECT_EQ(*Receive(2, 1, 1), "genuine");
  // The member's stream goes on after the check.
  member->Send(2, /*from=*/1, 2, "more");
  EXPECT_EQ(*Receive(2, 1, 2), "more");
  EXPECT_EQ(member->Finish(), grpc::StatusCode::OK);
}

// An impostor's stream still open when the epoch opens is cut there; the
// same certificate speaking for its own rank goes on.
TEST_F(PeerIdentityTest, CutsAnOpenImpostorStreamWhenTheEpochOpens) {
  auto own = Connect("127.0.0.3");
  own->Send(3, /*from=*/2, 0, "genuine");  // rank 2 serves on 127.0.0.3
  auto impostor = Connect("127.0.0.3");
  impostor->Send(3, /*from=*/1, 0, "forged");
  for (int i = 0; i < 200 && service_.stats().messages_delivered < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(service_.stats().messages_delivered, 2u);  // both held
  Open(3);
  impostor->Send(3, /*from=*/1, 1, "forged");
  EXPECT_EQ(impostor->Finish(), grpc::StatusCode::PERMISSION_DENIED);
  own->Send(3, /*from=*/2, 1, "more");
  EXPECT_EQ(*Receive(3, 2, 0), "genuine");
  EXPECT_EQ(*Receive(3, 2, 1), "more");
  EXPECT_TRUE(absl::IsDeadlineExceeded(Receive(3, 1, 0).status()));
  EXPECT_EQ(own->Finish(), grpc::StatusCode::OK);
}

// An impostor's stream that breaks before the epoch opens says nothing about
// the rank it claimed: Receive from that rank waits, as for a silent peer.
TEST_F(PeerIdentityTest, AnImpostorsBreakBeforeOpeningFailsNothing) {
  auto impostor = Connect("127.0.0.3");
  impostor->Send(4, /*from=*/1, 0, "forged");
  for (int i = 0; i < 200 && service_.stats().messages_delivered < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  impostor->context.TryCancel();
  impostor->stream->Finish();
  absl::SleepFor(absl::Milliseconds(100));
  Open(4);
  const auto m = Receive(4, 1, 0);
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status())) << m.status();
}

// Streams of an epoch not opened yet are bounded per rank they claim; those
// that end having carried no whole message are forgotten, so they can't
// crowd the rank out.
TEST_F(PeerIdentityTest, BoundsTheStreamsHeldPerRank) {
  for (size_t i = 0; i < 2 * PeerService::kMaxHeldStreamsPerRank; ++i) {
    auto empty = Connect("127.0.0.3");
    v1::Frame frame;  // 3 bytes of a 10-byte message, then the end
    frame.set_epoch(5);
    frame.set_from_rank(1);
    frame.set_message_bytes(10);
    frame.set_data("abc");
    empty->stream->Write(frame);
    EXPECT_EQ(empty->Finish(), grpc::StatusCode::OK) << i;
  }
  for (size_t i = 0; i < PeerService::kMaxHeldStreamsPerRank; ++i) {
    auto held = Connect("127.0.0.2");
    held->Send(5, /*from=*/1, static_cast<uint32_t>(i), "");
    EXPECT_EQ(held->Finish(), grpc::StatusCode::OK) << i;
  }
  auto one_more = Connect("127.0.0.2");
  one_more->Send(5, /*from=*/1, 99, "");
  EXPECT_EQ(one_more->Finish(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  Open(5);  // the member's held messages arrive
  EXPECT_EQ(*Receive(5, 1, 0), "");
}

}  // namespace
}  // namespace gradmesh::transport

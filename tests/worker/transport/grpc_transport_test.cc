#include "worker/transport/grpc/grpc_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>

#include "common/grpc/grpc_util.h"
#include "common/steady_clock.h"
#include "gmock/gmock.h"
#include "gradmesh/v1/peer.grpc.pb.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "gtest/gtest.h"
#include "tests/support/grpc_network.h"
#include "tests/support/multi_rank.h"
#include "tests/support/tcp_proxy.h"
#include "worker/transport/grpc/frame_codec.h"

namespace gradmesh::transport {
namespace {

using ::gradmesh::testing::GrpcNetwork;
using ::testing::IsEmpty;

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(GrpcTransportTest, DeliversChunkedMessagesInOrderWithCounters) {
  GrpcNetwork net(3, /*chunk_bytes=*/7, /*epoch=*/4);
  const Tag a{4, 1, 0}, b{4, 1, 1};
  // Two messages under one tag (order kept), one under another, an empty one.
  ASSERT_TRUE(net.endpoint(0)->Send(2, a, Bytes(1000, 'a')).ok());
  ASSERT_TRUE(net.endpoint(0)->Send(2, a, Bytes(13, 'b')).ok());
  ASSERT_TRUE(net.endpoint(0)->Send(2, b, "").ok());
  ASSERT_TRUE(net.endpoint(1)->Send(2, a, Bytes(7, 'c')).ok());
  EXPECT_EQ(*net.endpoint(2)->Recv(0, b, Soon()), "");
  EXPECT_EQ(*net.endpoint(2)->Recv(1, a, Soon()), Bytes(7, 'c'));
  EXPECT_EQ(*net.endpoint(2)->Recv(0, a, Soon()), Bytes(1000, 'a'));
  EXPECT_EQ(*net.endpoint(2)->Recv(0, a, Soon()), Bytes(13, 'b'));
  const Counters sent = net.endpoint(0)->counters();
  EXPECT_EQ(sent.messages_sent, 3u);
  EXPECT_EQ(sent.bytes_sent, 1013u);
  EXPECT_THAT(sent.bytes_sent_to, ::testing::ElementsAre(0, 0, 1013));
  const Counters received = net.endpoint(2)->counters();
  EXPECT_EQ(received.messages_received, 4u);
  EXPECT_THAT(received.bytes_received_from, ::testing::ElementsAre(1013, 7, 0));
}

TEST(GrpcTransportTest, EveryPairExchangesConcurrently) {
  GrpcNetwork net(5, /*chunk_bytes=*/1 << 10);
  ::gradmesh::testing::RunRanks(net, [&](int r, Transport* t) {
    for (uint32_t step = 0; step < 20; ++step) {
      for (int peer = 0; peer < t->size(); ++peer) {
        if (peer == r) continue;
        ASSERT_TRUE(
            t->Send(peer, {0, 0, step}, Bytes(3000 + peer + step, 'a' + r))
                .ok());
      }
      for (int peer = 0; peer < t->size(); ++peer) {
        if (peer == r) continue;
        auto m = t->Recv(peer, {0, 0, step}, Soon());
        ASSERT_TRUE(m.ok()) << m.status();
        EXPECT_EQ(*m, Bytes(3000 + r + step, 'a' + peer));
      }
    }
  });
}

TEST(GrpcTransportTest, MissingMessageEndsAtTheDeadline) {
  GrpcNetwork net(2);
  const absl::Time start = absl::Now();
  auto m = net.endpoint(0)->Recv(1, {0, 0, 0}, start + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status())) << m.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(GrpcTransportTest, AbortFailsLocalCallsAndWakesPeers) {
  GrpcNetwork net(2);
  ASSERT_TRUE(net.endpoint(0)->Send(1, {0, 0, 0}, "x").ok());
  ASSERT_EQ(*net.endpoint(1)->Recv(0, {0, 0, 0}, Soon()), "x");
  std::thread waiter([&] {
    auto m = net.endpoint(1)->Recv(0, {0, 0, 1}, Soon());
    EXPECT_TRUE(absl::IsUnavailable(m.status())) << m.status();
  });
  absl::SleepFor(absl::Milliseconds(50));
  net.endpoint(0)->Abort(absl::AbortedError("membership changed"));
  waiter.join();
  EXPECT_TRUE(absl::IsAborted(net.endpoint(0)->Send(1, {0, 0, 2}, "y")));
  EXPECT_TRUE(
      absl::IsAborted(net.endpoint(0)->Recv(1, {0, 0, 2}, Soon()).status()));
}

TEST(GrpcTransportTest, PeerThatDiesIsUnavailableNotAHang) {
  GrpcNetwork net(2);
  ASSERT_TRUE(net.endpoint(1)->Send(0, {0, 0, 0}, "hello").ok());
  ASSERT_TRUE(net.endpoint(0)->Recv(1, {0, 0, 0}, Soon()).ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, {0, 0, 0}, "hello").ok());
  ASSERT_TRUE(net.endpoint(1)->Recv(0, {0, 0, 0}, Soon()).ok());
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    auto m = net.endpoint(0)->Recv(1, {0, 0, 1}, start + absl::Seconds(30));
    EXPECT_TRUE(absl::IsUnavailable(m.status())) << m.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  });
  absl::SleepFor(absl::Milliseconds(50));
  net.KillRank(1);
  waiter.join();
}

TEST(GrpcTransportTest, DropsAndCountsFramesOfRetiredEpochsAndOperations) {
  GrpcNetwork net(2, 1 << 20, /*epoch=*/1);
  // Operation 3 failed here: its mailbox goes, and its late frames too;
  // operations in flight beside it (2 and 5) keep theirs.
  // (One stream keeps order: once 'x' is in, so is 'y'.)
  ASSERT_TRUE(net.endpoint(0)->Send(1, {1, 3, 0}, Bytes(10, 'y')).ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, {1, 2, 0}, Bytes(10, 'x')).ok());
  ASSERT_EQ(*net.endpoint(1)->Recv(0, {1, 2, 0}, Soon()), Bytes(10, 'x'));
  net.endpoint(1)->EndOperation(1, 3);
  ASSERT_TRUE(net.endpoint(0)->Send(1, {1, 3, 0}, Bytes(10, 'a')).ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, {1, 5, 0}, Bytes(10, 'b')).ok());
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {1, 5, 0}, Soon()), Bytes(10, 'b'));
  EXPECT_EQ(net.service(1)->stats().frames_dropped_retired_operation, 1u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      net.endpoint(1)->Recv(0, {1, 3, 0}, absl::Now()).status()));

  // Rank 1's transport of epoch 1 goes: late frames of epoch 1 are dropped.
  net.DropTransport(1);
  ASSERT_TRUE(net.endpoint(0)->Send(1, {1, 6, 0}, Bytes(10, 'c')).ok());
  // The frame is counted once it arrives.
  for (int i = 0;
       i < 100 && net.service(1)->stats().frames_dropped_old_epoch == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(net.service(1)->stats().frames_dropped_old_epoch, 1u);
  auto m = net.service(1)->Receive(1, 0, {1, 6, 0}, absl::Now());
  EXPECT_TRUE(absl::IsAborted(m.status())) << m.status();
}

// An epoch closes with the last transport that opened it: a second one of
// the same epoch going away leaves the first receiving.
TEST(GrpcTransportTest, AnEpochClosesWithItsLastTransport) {
  GrpcNetwork net(2, 1 << 20, /*epoch=*/1);
  {
    auto twin = net.MakeTransport(1, 1);
    ASSERT_TRUE(twin.ok());
  }
  ASSERT_TRUE(net.endpoint(0)->Send(1, {1, 0, 0}, "still open").ok());
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {1, 0, 0}, Soon()), "still open");
  EXPECT_EQ(net.service(1)->stats().frames_dropped_old_epoch, 0u);
}

// Epochs open in increasing order: one skipped below the newest opened
// never opens, so its frames are dropped, and a transport of it is refused.
TEST(GrpcTransportTest, AnEpochSkippedIsRetired) {
  GrpcNetwork net(2, 1 << 20, /*epoch=*/1);
  net.StartEpoch(3);
  auto late = net.MakeTransport(1, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
  auto early = net.MakeTransport(0, 2);
  ASSERT_FALSE(early.ok());  // rank 0 is past epoch 2 as well
  // A raw frame of epoch 2 reaches rank 1: dropped, not held.
  auto stub = gradmesh::v1::Peer::NewStub(net.channel(1));
  grpc::ClientContext context;
  auto stream = stub->Exchange(&context);
  gradmesh::v1::Frame frame;
  frame.set_epoch(2);
  frame.set_from_rank(0);
  frame.set_message_bytes(3);
  frame.set_data("abc");
  stream->Write(frame);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(net.service(1)->stats().frames_dropped_old_epoch, 1u);
  EXPECT_EQ(net.service(1)->stats().messages_delivered, 0u);
}

TEST(GrpcTransportTest, KeepsFramesOfAnEpochNotYetStarted) {
  GrpcNetwork net(2, 1 << 20, /*epoch=*/1);
  auto ahead = net.MakeTransport(0, 2);
  ASSERT_TRUE(ahead.ok());
  ASSERT_TRUE((*ahead)->Send(1, {2, 0, 0}, "early").ok());
  absl::SleepFor(absl::Milliseconds(50));
  net.StartEpoch(2);
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {2, 0, 0}, Soon()), "early");
}

TEST(GrpcTransportTest, RefusesMalformedStreams) {
  GrpcNetwork net(2);
  auto stub = gradmesh::v1::Peer::NewStub(net.channel(1));
  grpc::ClientContext context;
  auto stream = stub->Exchange(&context);
  gradmesh::v1::Frame frame;
  frame.set_from_rank(0);
  frame.set_message_bytes(10);
  frame.set_offset(4);  // not where the message starts
  frame.set_data("abc");
  stream->Write(frame);
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(net.service(1)->stats().streams_refused, 1u);
  auto m = net.endpoint(1)->Recv(0, {0, 0, 0}, Soon());
  EXPECT_TRUE(absl::IsUnavailable(m.status())) << m.status();
}

// The hand-written frames are protobuf's Frame, both ways.
TEST(FrameCodecTest, MatchesTheProtobufEncoding) {
  const auto message = std::make_shared<const std::string>(Bytes(100, 'm'));
  const FrameHeader header{.epoch = 3,
                           .operation = 1ull << 40,
                           .step = 7,
                           .from_rank = 2,
                           .message_bytes = 100,
                           .offset = 40};
  grpc::ByteBuffer encoded = EncodeFrame(header, message, 40, 30);
  gradmesh::v1::Frame parsed;
  {
    grpc::ProtoBufferReader reader(&encoded);
    ASSERT_TRUE(parsed.ParseFromZeroCopyStream(&reader));
  }
  EXPECT_EQ(parsed.epoch(), 3u);
  EXPECT_EQ(parsed.operation(), 1ull << 40);
  EXPECT_EQ(parsed.step(), 7u);
  EXPECT_EQ(parsed.from_rank(), 2u);
  EXPECT_EQ(parsed.message_bytes(), 100u);
  EXPECT_EQ(parsed.offset(), 40u);
  EXPECT_EQ(parsed.data(), message->substr(40, 30));

  // And back: a generated Frame decodes, its data placed where asked.
  grpc::ByteBuffer serialized;
  bool own = false;
  ASSERT_TRUE(grpc::SerializationTraits<gradmesh::v1::Frame>::Serialize(
                  parsed, &serialized, &own)
                  .ok());
  std::string out = "kept:";
  FrameHeader got;
  ASSERT_TRUE(DecodeFrame(&serialized,
                          [&](const FrameHeader& h,
                              uint64_t size) -> absl::StatusOr<std::string*> {
                            got = h;
                            EXPECT_EQ(size, 30u);
                            return &out;
                          })
                  .ok());
  EXPECT_EQ(got.operation, 1ull << 40);
  EXPECT_EQ(got.offset, 40u);
  EXPECT_EQ(out, "kept:" + message->substr(40, 30));  // appended
}

TEST(FrameCodecTest, RefusesWhatIsNotAFrame) {
  auto decode = [](const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    std::string sink;
    return DecodeFrame(
        &buffer,
        [&](const FrameHeader&, uint64_t size) -> absl::StatusOr<std::string*> {
          if (size > 64) {
            return absl::InvalidArgumentError("too big");
          }
          return &sink;
        });
  };
  EXPECT_TRUE(decode("").ok());                       // an empty frame
  EXPECT_FALSE(decode(std::string("\x08", 1)).ok());  // a key, no value
  EXPECT_FALSE(decode("\x3a\x05"
                      "abc")
                   .ok());                         // data cut short
  EXPECT_FALSE(decode("\x42\x01x").ok());          // unknown field 8
  EXPECT_FALSE(decode("\x3a\x01x\x08\x01").ok());  // a field after data
  EXPECT_FALSE(decode(std::string("\x3a\x80\x01", 3) + std::string(128, 'x'))
                   .ok());  // the sink refuses 128 bytes
}

// A length larger than the bytes present never reaches the sink (which
// would otherwise size a buffer for it).
TEST(FrameCodecTest, LengthsBeyondTheDataAreRefusedBeforeTheSink) {
  for (const std::string& bytes :
       {std::string("\x28\x80\x80\x80\x80\x04\x3a\xf0\xff\xff\xff\x0f", 12),
        std::string("\x3a\x81\x80\x80\x80\x10", 6) + "x"}) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    bool called = false;
    const absl::Status status = DecodeFrame(
        &buffer,
        [&](const FrameHeader&, uint64_t) -> absl::StatusOr<std::string*> {
          called = true;
          return absl::InternalError("must not be asked");
        });
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_FALSE(called);
  }
}

// Sends racing with Abort end in an error or succeed; nothing crashes.
TEST(GrpcTransportTest, SendsRacingAnAbortFailCleanly) {
  for (int round = 0; round < 20; ++round) {
    GrpcNetwork net(2);
    std::thread sender([&] {
      for (uint32_t step = 0; step < 200; ++step) {
        if (!net.endpoint(0)->Send(1, {0, 0, step}, Bytes(2000, 'a')).ok()) {
          return;
        }
      }
    });
    absl::SleepFor(absl::Microseconds(200 * (round % 5)));
    net.endpoint(0)->Abort(absl::AbortedError("view changed"));
    sender.join();
    EXPECT_TRUE(absl::IsAborted(net.endpoint(0)->Send(1, {0, 1, 0}, "x")));
  }
}

TEST(GrpcTransportTest, RejectsBadOptions) {
  PeerService service;
  auto channels = [](const std::string&) {
    return std::shared_ptr<grpc::Channel>();
  };
  EXPECT_TRUE(
      absl::IsInvalidArgument(GrpcTransport::Create({.service = &service,
                                                     .rank = 2,
                                                     .peers = {"a"},
                                                     .channels = channels})
                                  .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      GrpcTransport::Create({.service = &service,
                             .peers = {"a"},
                             .channels = channels,
                             .chunk_bytes = kMaxChunkBytes + 1})
          .status()));
}

// Two ranks over TCP on 127.0.0.1, rank 1 reached through a proxy that can
// cut the link.
class ProxiedPair {
 public:
  ProxiedPair() {
    for (int r = 0; r < 2; ++r) {
      grpc::ServerBuilder builder;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                               &ports_[r]);
      builder.RegisterCallbackGenericService(&services_[r]);
      servers_[r] = builder.BuildAndStart();
    }
    proxy_ = std::make_unique<testing::TcpProxy>(ports_[1]);
    const std::vector<std::string> peers = {
        absl::StrCat("127.0.0.1:", ports_[0]),
        absl::StrCat("127.0.0.1:", proxy_->port())};
    for (int r = 0; r < 2; ++r) {
      auto t = GrpcTransport::Create(
          {.service = &services_[r],
           .rank = r,
           .peers = peers,
           .channels = [this](const std::string& a) { return Channel(a); }});
      EXPECT_TRUE(t.ok()) << t.status();
      transports_[r] = *std::move(t);
    }
  }
  ~ProxiedPair() {
    for (auto& t : transports_) t.reset();
    for (auto& s : servers_) s->Shutdown();
  }

  GrpcTransport& endpoint(int r) { return *transports_[r]; }
  testing::TcpProxy& proxy() { return *proxy_; }

 private:
  std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto& channel = channels_[address];
    if (channel == nullptr) {
      channel =
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    }
    return channel;
  }

  PeerService services_[2];
  int ports_[2] = {0, 0};
  std::unique_ptr<grpc::Server> servers_[2];
  std::unique_ptr<testing::TcpProxy> proxy_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
  std::unique_ptr<GrpcTransport> transports_[2];
};

// A reset link fails the operation in flight on both sides at once, and the
// next operation goes through on a new stream: one reset does not cost the
// rest of the epoch.
TEST(GrpcTransportTest, AResetLinkFailsOnlyTheOperationsInFlight) {
  ProxiedPair pair;
  ASSERT_TRUE(pair.endpoint(0).Send(1, {0, 1, 0}, "first").ok());
  ASSERT_EQ(*pair.endpoint(1).Recv(0, {0, 1, 0}, Soon()), "first");

  // Operation 2 waits on both sides when the link is cut.
  std::vector<std::thread> waiters;
  for (int r = 0; r < 2; ++r) {
    waiters.emplace_back([&, r] {
      const absl::Time start = absl::Now();
      auto m =
          pair.endpoint(r).Recv(1 - r, {0, 2, 0}, start + absl::Seconds(20));
      EXPECT_TRUE(absl::IsUnavailable(m.status())) << r << ": " << m.status();
      EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    });
  }
  absl::SleepFor(absl::Milliseconds(100));
  pair.proxy().Cut();
  for (auto& w : waiters) w.join();

  for (uint64_t op = 3; op < 6; ++op) {
    ASSERT_TRUE(pair.endpoint(0).Send(1, {0, op, 0}, Bytes(5000, 'a')).ok());
    auto m = pair.endpoint(1).Recv(0, {0, op, 0}, Soon());
    ASSERT_TRUE(m.ok()) << "operation " << op << ": " << m.status();
    EXPECT_EQ(*m, Bytes(5000, 'a'));
  }
}

// Whether, within 5 s, everything `sender` sent is acknowledged.
bool AcknowledgedSoon(const Transport& sender) {
  const absl::Time deadline = SteadyNow() + absl::Seconds(5);
  while (!sender.StalledPeers(absl::ZeroDuration(), SteadyNow()).empty()) {
    if (SteadyNow() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Whether `sender` names peer 1 as stalled for `timeout` within 10 s.
bool NamedSoon(const Transport& sender, absl::Duration timeout) {
  const absl::Time deadline = SteadyNow() + absl::Seconds(10);
  while (SteadyNow() < deadline) {
    const std::vector<int> stalled = sender.StalledPeers(timeout, SteadyNow());
    if (!stalled.empty()) return stalled == std::vector<int>{1};
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// A link that drops every packet, from the start (nothing ever
// acknowledged, the connection never made) or later: what is sent to the
// peer is no longer acknowledged (a small message's write completes all
// the same: gRPC has its bytes), and once it has waited the timeout the
// peer is named; when the link carries again, it is not.
TEST(GrpcTransportTest, NamesAPeerWhoseMessagesStoppedMoving) {
  constexpr absl::Duration kTimeout = absl::Milliseconds(300);
  ProxiedPair pair;
  pair.proxy().Freeze(true);
  ASSERT_TRUE(pair.endpoint(0).Send(1, {0, 1, 0}, "first").ok());
  EXPECT_TRUE(NamedSoon(pair.endpoint(0), kTimeout));
  EXPECT_THAT(pair.endpoint(0).StalledPeers(absl::Hours(1), SteadyNow()),
              IsEmpty());  // not that long
  pair.proxy().Freeze(false);
  ASSERT_EQ(*pair.endpoint(1).Recv(0, {0, 1, 0}, Soon()), "first");
  ASSERT_TRUE(AcknowledgedSoon(pair.endpoint(0)));

  pair.proxy().Freeze(true);
  constexpr uint64_t kOps = 3;
  for (uint64_t op = 2; op < 2 + kOps; ++op) {
    ASSERT_TRUE(pair.endpoint(0).Send(1, {0, op, 0}, Bytes(100, 'a')).ok());
  }
  EXPECT_TRUE(NamedSoon(pair.endpoint(0), kTimeout));
  pair.proxy().Freeze(false);
  for (uint64_t op = 2; op < 2 + kOps; ++op) {
    auto m = pair.endpoint(1).Recv(0, {0, op, 0}, Soon());
    ASSERT_TRUE(m.ok()) << "operation " << op << ": " << m.status();
  }
  EXPECT_TRUE(AcknowledgedSoon(pair.endpoint(0)));
}

// A transport of rank 0 whose peer 1 refuses every connection (a port
// bound, not listening), with the workers' channel arguments (reconnects
// after 250 ms to 1 s): each stream to it fails at once, unanswered.
class RefusingPeer {
 public:
  RefusingPeer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = {.sin_family = AF_INET};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length),
              0);
    auto transport = GrpcTransport::Create(
        {.service = &service_,
         .rank = 0,
         .peers = {"127.0.0.1:1",
                   absl::StrCat("127.0.0.1:", ntohs(address.sin_port))},
         .channels = [](const std::string& peer) {
           return grpc::CreateCustomChannel(peer,
                                            grpc::InsecureChannelCredentials(),
                                            DefaultChannelArguments());
         }});
    EXPECT_TRUE(transport.ok()) << transport.status();
    if (transport.ok()) transport_ = *std::move(transport);
  }
  ~RefusingPeer() {
    transport_.reset();
    close(fd_);
  }

  // Sends one message to peer 1: OK, or Unavailable once the stream has
  // failed (the next Send opens another).
  void Send() { transport_->Send(1, {0, next_op_++, 0}, "x").IgnoreError(); }
  bool Named(absl::Duration timeout) const {
    return transport_->StalledPeers(timeout, SteadyNow()) ==
           std::vector<int>{1};
  }
  bool ok() const { return transport_ != nullptr; }

 private:
  int fd_ = -1;
  PeerService service_;
  std::unique_ptr<GrpcTransport> transport_;
  uint64_t next_op_ = 0;
};

// Refused again and again, the peer is named once the refusals have gone
// on for the timeout, not before: no frame ever waits on a live stream,
// so only the run of streams that broke unanswered shows it.
TEST(GrpcTransportTest, NamesAPeerThatRefusesEveryConnection) {
  constexpr absl::Duration kTimeout = absl::Seconds(2);
  RefusingPeer peer;
  ASSERT_TRUE(peer.ok());
  const absl::Time start = SteadyNow();
  bool named = false;
  while (!named && SteadyNow() - start < absl::Seconds(20)) {
    peer.Send();
    absl::SleepFor(absl::Milliseconds(50));
    const absl::Time checked = SteadyNow();
    named = peer.Named(kTimeout);
    if (checked - start < kTimeout) {
      EXPECT_FALSE(named) << "named after " << (checked - start);
    }
  }
  EXPECT_TRUE(named);
}

// One refusal, or an old run of them, followed by silence names nobody:
// the run must go on; at least three refusals are needed.
TEST(GrpcTransportTest, AnOldRefusalFollowedBySilenceNamesNobody) {
  constexpr absl::Duration kTimeout = absl::Milliseconds(300);
  RefusingPeer peer;
  ASSERT_TRUE(peer.ok());
  peer.Send();
  absl::SleepFor(3 * kTimeout);  // the stream failed long ago: one refusal
  EXPECT_FALSE(peer.Named(kTimeout));
  peer.Send();  // a second, the first still in the run
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(peer.Named(kTimeout));
  const absl::Time start = SteadyNow();
  bool named = false;
  while (!named && SteadyNow() - start < absl::Seconds(10)) {
    peer.Send();
    absl::SleepFor(absl::Milliseconds(50));
    named = peer.Named(kTimeout);
  }
  ASSERT_TRUE(named);  // three or more, over the timeout, still going on
  // Then silence (the last stream may take up to the 1 s reconnect backoff
  // to fail): no longer named.
  absl::SleepFor(absl::Seconds(1) + 2 * kTimeout);
  EXPECT_FALSE(peer.Named(kTimeout));
}

// Frames of an epoch not started here are held up to a bound; past it the
// stream is refused, and what was held is freed with the epoch.
TEST(GrpcTransportTest, BoundsWhatIsHeldForEpochsNotStarted) {
  GrpcNetwork net(2);
  const std::string chunk(PeerService::kMaxUnopenedBytes / 4, 'x');
  for (uint32_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(net.endpoint(0)->Send(1, {0, 0, step}, "ok").ok());
  }
  // Epoch 7 is not open on rank 1: four quarters fit, the fifth is refused.
  auto stub = gradmesh::v1::Peer::NewStub(net.channel(1));
  grpc::ClientContext context;
  auto stream = stub->Exchange(&context);
  for (uint32_t step = 0; step < 5; ++step) {
    gradmesh::v1::Frame frame;
    frame.set_epoch(7);
    frame.set_step(step);
    frame.set_from_rank(0);
    frame.set_message_bytes(chunk.size());
    // Frames of at most kMaxChunkBytes: the header's offset moves on.
    for (uint64_t offset = 0; offset < chunk.size(); offset += kMaxChunkBytes) {
      frame.set_offset(offset);
      frame.set_data(chunk.substr(offset, kMaxChunkBytes));
      if (!stream->Write(frame)) break;
    }
  }
  stream->WritesDone();
  EXPECT_EQ(stream->Finish().error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(net.service(1)->stats().streams_refused_unopened_bytes, 1u);
  // The open epoch is untouched.
  for (uint32_t step = 0; step < 4; ++step) {
    EXPECT_EQ(*net.endpoint(1)->Recv(0, {0, 0, step}, Soon()), "ok");
  }
}

// A stream that claims a rank outside the group, or the receiver's own, is
// refused.
TEST(GrpcTransportTest, RefusesStreamsClaimingNoPeersRank) {
  GrpcNetwork net(2);
  for (uint32_t claimed : {1u, 2u, 4000000000u}) {
    auto stub = gradmesh::v1::Peer::NewStub(net.channel(1));
    grpc::ClientContext context;
    auto stream = stub->Exchange(&context);
    gradmesh::v1::Frame frame;
    frame.set_from_rank(claimed);
    frame.set_message_bytes(3);
    frame.set_data("abc");
    stream->Write(frame);
    stream->WritesDone();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << claimed;
  }
  EXPECT_EQ(net.service(1)->stats().streams_refused, 3u);
  EXPECT_EQ(net.service(1)->stats().messages_delivered, 0u);
}

// Only so many epochs not started here may hold frames at once, and none
// far past the newest started: one more is refused.
TEST(GrpcTransportTest, BoundsHowManyEpochsNotStartedAreHeld) {
  GrpcNetwork net(2);
  auto stub = gradmesh::v1::Peer::NewStub(net.channel(1));
  auto send = [&](uint64_t epoch) {
    grpc::ClientContext context;
    auto stream = stub->Exchange(&context);
    gradmesh::v1::Frame frame;
    frame.set_epoch(epoch);
    frame.set_from_rank(0);
    stream->Write(frame);  // an empty message: it still holds its overhead
    stream->WritesDone();
    return stream->Finish().error_code();
  };
  for (uint64_t e = 1; e <= PeerService::kMaxUnopenedEpochs; ++e) {
    EXPECT_EQ(send(e), grpc::StatusCode::OK) << e;
  }
  EXPECT_EQ(send(PeerService::kMaxUnopenedEpochs + 1),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(net.service(1)->stats().streams_refused_unopened_epochs, 1u);
  // Opening a newer epoch frees them (they will never open): room again.
  // Far-future epochs stay refused.
  const uint64_t open = PeerService::kMaxUnopenedEpochs + 1;
  net.StartEpoch(open);
  EXPECT_EQ(send(open + 1), grpc::StatusCode::OK);
  EXPECT_EQ(send(open + 1 + PeerService::kMaxEpochsAhead),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(net.endpoint(0)->Send(1, {open, 0, 0}, "ok").ok());
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {open, 0, 0}, Soon()), "ok");
}

// A raw Exchange stream from rank 0 to `net`'s rank 1 whose first frame
// starts a message of `announced` bytes in `epoch` (3 bytes of it sent).
struct RawStream {
  std::unique_ptr<gradmesh::v1::Peer::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<
      grpc::ClientReaderWriter<gradmesh::v1::Frame, gradmesh::v1::PeerSignal>>
      stream;

  RawStream(GrpcNetwork& net, uint64_t epoch, uint64_t announced,
            uint64_t operation = 0)
      : stub(gradmesh::v1::Peer::NewStub(net.channel(1))),
        stream(stub->Exchange(&context)) {
    gradmesh::v1::Frame frame;
    frame.set_epoch(epoch);
    frame.set_operation(operation);
    frame.set_from_rank(0);
    frame.set_message_bytes(announced);
    frame.set_data("abc");
    stream->Write(frame);
  }
  grpc::StatusCode Finish() {
    stream->WritesDone();
    return stream->Finish().error_code();
  }
};

// On any connection, plaintext too, one rank runs only so many streams of
// an epoch at once; once they end, it may open new ones.
TEST(GrpcTransportTest, BoundsTheStreamsOneRankRuns) {
  GrpcNetwork net(2);
  std::vector<std::unique_ptr<RawStream>> running;
  for (size_t i = 0; i < PeerService::kMaxStreamsPerRank; ++i) {
    running.push_back(std::make_unique<RawStream>(net, 5, 100));
  }
  // The server admits them as their first frames arrive: try until refused.
  grpc::StatusCode code = grpc::StatusCode::OK;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (code == grpc::StatusCode::OK && absl::Now() < deadline) {
    code = RawStream(net, 5, 100).Finish();
  }
  EXPECT_EQ(code, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_GE(net.service(1)->stats().streams_refused_peer_budget, 1u);
  for (auto& r : running) r->context.TryCancel();
  for (auto& r : running) r->stream->Finish();
  running.clear();
  // The server frees their places as it sees them end.
  const absl::Time freed = absl::Now() + absl::Seconds(5);
  while (code != grpc::StatusCode::OK && absl::Now() < freed) {
    code = RawStream(net, 5, 3).Finish();
  }
  EXPECT_EQ(code, grpc::StatusCode::OK);
}

// A message is charged its announced size from its first frame: one that
// can never fit is refused before its data comes.
TEST(GrpcTransportTest, ChargesAMessageFromItsFirstFrame) {
  GrpcNetwork net(2, 1 << 20, 0, /*held_bytes_per_peer=*/1 << 20);
  EXPECT_EQ(RawStream(net, 7, PeerService::kMaxUnopenedBytes).Finish(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(net.service(1)->stats().streams_refused_unopened_bytes, 1u);
  EXPECT_EQ(RawStream(net, 0, (1 << 20) + 1).Finish(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(net.service(1)->stats().streams_refused_peer_budget, 1u);
  // Within the budget: delivered.
  ASSERT_TRUE(net.endpoint(0)->Send(1, {0, 1, 0}, Bytes(1 << 19, 'a')).ok());
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {0, 1, 0}, Soon()), Bytes(1 << 19, 'a'));
}

// Messages of operations this process has not started count against their
// sender's budget; past it the oldest such operation's are dropped, and a
// later Receive of them fails at once. Started operations are not charged.
TEST(GrpcTransportTest, DropsTheOldestOperationNotStartedPastTheBudget) {
  GrpcNetwork net(2, 1 << 20, 0, /*held_bytes_per_peer=*/1 << 20);
  constexpr size_t kBytes = 300'000;
  // Operation 50 is started here first: its message is not charged.
  ASSERT_TRUE(net.endpoint(1)->Send(0, {0, 50, 0}, "started").ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, {0, 50, 0}, Bytes(kBytes, 's')).ok());
  for (uint64_t op = 100; op < 105; ++op) {
    ASSERT_TRUE(net.endpoint(0)->Send(1, {0, op, 0}, Bytes(kBytes, 'a')).ok());
  }
  // One stream delivers in order: once 104's is here, all are.
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {0, 104, 0}, Soon()), Bytes(kBytes, 'a'));
  for (uint64_t op : {100, 101}) {
    const absl::Time start = absl::Now();
    auto m = net.endpoint(1)->Recv(0, {0, op, 0}, Soon());
    EXPECT_TRUE(absl::IsResourceExhausted(m.status())) << op << m.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  }
  for (uint64_t op : {102, 103}) {
    auto m = net.endpoint(1)->Recv(0, {0, op, 0}, Soon());
    ASSERT_TRUE(m.ok()) << op << m.status();
    EXPECT_EQ(*m, Bytes(kBytes, 'a'));
  }
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {0, 50, 0}, Soon()), Bytes(kBytes, 's'));
  EXPECT_EQ(net.service(1)->stats().messages_dropped_unclaimed, 2u);
}

// Empty messages cost their overhead: a flood of them for operations never
// started here stays within the budget too.
TEST(GrpcTransportTest, EmptyMessagesOfOperationsNotStartedCountToo) {
  GrpcNetwork net(2, 1 << 20, 0, /*held_bytes_per_peer=*/64 << 10);
  constexpr uint64_t kMessages = 2000;  // 2000 x 64 bytes: past 64 KiB
  for (uint64_t op = 1; op <= kMessages; ++op) {
    ASSERT_TRUE(net.endpoint(0)->Send(1, {0, op, 0}, "").ok());
  }
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {0, kMessages, 0}, Soon()), "");
  const uint64_t kept = (64 << 10) / PeerService::kMessageOverheadBytes;
  EXPECT_GE(net.service(1)->stats().messages_dropped_unclaimed,
            kMessages - kept);
  EXPECT_TRUE(absl::IsResourceExhausted(
      net.endpoint(1)->Recv(0, {0, 1, 0}, Soon()).status()));
}

TEST(GrpcTransportTest, TellsSinceWhenPeersRunAnOperationNotStartedHere) {
  GrpcNetwork net(2, 1 << 20);
  const absl::Time before = SteadyNow();
  ASSERT_TRUE(net.endpoint(0)->Send(1, {0, 7, 0}, "a").ok());
  ASSERT_TRUE(net.endpoint(0)->Send(1, {0, 7, 1}, "b").ok());
  // Delivered asynchronously: wait for the first message to be noted.
  std::optional<absl::Time> since;
  for (int i = 0; i < 500 && !since.has_value(); ++i) {
    since = net.endpoint(1)->UnclaimedSince(0, 7);
    if (!since.has_value()) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(since.has_value());
  EXPECT_GE(*since, before);
  EXPECT_LE(*since, SteadyNow());
  EXPECT_FALSE(net.endpoint(1)->UnclaimedSince(0, 8).has_value());
  // Started here: no longer unclaimed, though a message still waits.
  EXPECT_EQ(*net.endpoint(1)->Recv(0, {0, 7, 0}, Soon()), "a");
  EXPECT_FALSE(net.endpoint(1)->UnclaimedSince(0, 7).has_value());
}

}  // namespace
}  // namespace gradmesh::transport

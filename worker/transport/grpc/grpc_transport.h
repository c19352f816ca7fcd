// GrpcTransport: the Transport over gRPC, one per (process, epoch).
//
// Sending: one persistent stream per peer, opened on the first message to it
// (callback API, one write in flight and a send queue behind it, so Send
// never blocks). A message is cut into frames of at most chunk_bytes, below
// gRPC's 4 MiB default receive limit. Receiving goes through the process's
// PeerService, which keeps what peers sent for this epoch.
//
// Failure: a stream that breaks fails the operations in flight with its peer
// (their Recv from it fails with Unavailable instead of waiting; see
// PeerService), and the next Send to the peer opens a new stream, so one
// transient reset costs only the operations it hit. Streams ask their
// receivers to acknowledge the frames they read (kAcknowledgeKey), and a
// peer whose frames have gone unacknowledged for a while is named by
// StalledPeers, for the coordinator to decide: a link that drops every
// packet breaks no stream until gRPC's keepalive notices, and every new
// connection then hangs. So is a peer that refuses connections: each
// stream fails at once, before the receiver answers, and frames never
// wait; a run of such streams (at least three, no answer between them)
// that spans the timeout and still goes on names the peer. Abort fails this
// endpoint's calls with its status and cancels its streams, which peers see
// as a break. Nothing waits past the caller's deadline.
//
//   auto t = GrpcTransport::Create({.service = &peers, .epoch = 3, .rank = 1,
//                                   .peers = addresses, .channels = factory});
//
// Thread-safe. A PeerService runs one transport per epoch, and must outlive
// it. Destruction closes the streams cleanly (bounded wait, then cancel) and
// the epoch at the PeerService (PeerService::CloseEpoch).
#ifndef GRADMESH_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define GRADMESH_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "worker/transport/grpc/peer_service.h"
#include "worker/transport/transport.h"

namespace gradmesh::transport {

// Returns the (shared, cached) channel to a peer's address.
using ChannelFactory =
    std::function<std::shared_ptr<grpc::Channel>(const std::string& address)>;

struct GrpcTransportOptions {
  PeerService* service = nullptr;  // this process's receiving side
  uint64_t epoch = 0;
  int rank = 0;
  std::vector<std::string> peers;  // address of every rank (index = rank)
  ChannelFactory channels;
  uint64_t chunk_bytes = kDefaultChunkBytes;  // 1 .. kMaxChunkBytes
};

class GrpcTransport final : public Transport {
 public:
  // InvalidArgument for a rank outside peers or a bad chunk size;
  // FailedPrecondition for an epoch the service has retired.
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(
      GrpcTransportOptions options);
  ~GrpcTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return static_cast<int>(options_.peers.size()); }
  uint64_t epoch() const { return options_.epoch; }

  absl::Status Send(int peer, const Tag& tag, std::string payload) override;
  absl::StatusOr<std::string> Recv(int peer, const Tag& tag,
                                   absl::Time deadline) override;
  void Abort(const absl::Status& status) override;
  void EndOperation(uint64_t epoch, uint64_t operation) override;
  std::optional<absl::Time> UnclaimedSince(uint64_t epoch,
                                           uint64_t operation) const override;
  std::vector<int> StalledPeers(absl::Duration timeout,
                                absl::Time now) const override;
  Counters counters() const override;

 private:
  class Stream;

  explicit GrpcTransport(GrpcTransportOptions options);

  const GrpcTransportOptions options_;
  mutable absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  // Replaced after they broke; destroyed once done.
  std::vector<std::shared_ptr<Stream>> broken_streams_ ABSL_GUARDED_BY(mu_);
  // The streams to one peer that broke before it answered (refused
  // connections), one after another since the last that it answered: when
  // the first opened, when the last broke, how many.
  struct Refusals {
    absl::Time first;
    absl::Time last;
    int count = 0;

    // This run followed by one more refused stream.
    Refusals Then(const Refusals& next) const {
      if (count == 0) return next;
      return {.first = first, .last = next.last, .count = count + 1};
    }
    // Whether the run names its peer: kRefusalsToName streams or more,
    // refused over at least `timeout`, the last within `timeout` of `now`
    // (an old refusal followed by silence says nothing of the link now).
    bool Name(absl::Duration timeout, absl::Time now) const {
      return count >= kRefusalsToName && last - first >= timeout &&
             now - last < timeout;
    }
  };
  static constexpr int kRefusalsToName = 3;
  std::vector<Refusals> refusals_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

// PeerService: the receiving side of the gRPC transport, one per process.
//
// It serves gradmesh.v1.Peer's Exchange (as the server's generic service, so
// that frames are read without protobuf's copies: frame_codec.h). Every
// incoming stream belongs to one (epoch, sender) pair; its frames are put back
// together into messages, which wait in mailboxes keyed by (epoch, sender, tag)
// until a GrpcTransport of that epoch receives them. Frames of a future epoch
// are kept (a peer may start an epoch before this process has learned of it);
// frames of a retired epoch or of a retired operation are dropped and counted,
// never delivered.
//
//   PeerService peers;  // must outlive the server that serves it
//   builder.RegisterCallbackGenericService(&peers);
//   ... GrpcTransport::Create({.service = &peers, ...});
//
// Thread-safe. Reactions never block: delivery takes one mutex briefly.
#ifndef GRADMESH_WORKER_TRANSPORT_GRPC_PEER_SERVICE_H_
#define GRADMESH_WORKER_TRANSPORT_GRPC_PEER_SERVICE_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "worker/transport/transport.h"

namespace gradmesh::transport {

class PeerService final : public grpc::CallbackGenericService {
 public:
  PeerService() = default;
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  // Exchange streams; any other method is UNIMPLEMENTED.
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

  // Blocks for the message from `from` with `tag` in `epoch`. Errors: the
  // epoch's abort status; Unavailable once the sender's stream has ended or
  // broken (or the epoch is retired) and no such message is waiting;
  // DeadlineExceeded.
  absl::StatusOr<std::string> Receive(uint64_t epoch, int from, const Tag& tag,
                                      absl::Time deadline);

  // Fails present and future Receive calls of `epoch` with `status`.
  void AbortEpoch(uint64_t epoch, const absl::Status& status);

  // Records that `peer` is gone for `epoch` (the sending side saw its stream
  // to the peer break): Receive from it fails once nothing is waiting.
  void MarkPeerGone(uint64_t epoch, int peer, const absl::Status& status);

  // Frees what is kept for epochs below `epoch`; their later frames are
  // dropped.
  void RetireEpochsBelow(uint64_t epoch);

  // Frees what is kept for `operation` of `epoch` (it has finished or
  // failed here); its later frames are dropped. The last
  // kRetiredOperationsKept retired ids of an epoch are remembered.
  void RetireOperation(uint64_t epoch, uint64_t operation);
  static constexpr size_t kRetiredOperationsKept = 4096;

  struct Stats {
    uint64_t messages_delivered = 0;
    uint64_t frames_dropped_old_epoch = 0;
    uint64_t frames_dropped_retired_operation = 0;
    uint64_t streams_refused = 0;  // malformed frames ended the stream
  };
  Stats stats() const;

 private:
  class Reactor;

  struct EpochState {
    absl::Status aborted;                         // OK unless aborted
    absl::flat_hash_map<int, absl::Status> gone;  // peer -> why
    absl::flat_hash_set<uint64_t> retired;        // operations
    std::deque<uint64_t> retired_order;           // oldest first
  };
  struct MailboxKey {
    uint64_t epoch;
    int from;
    Tag tag;
    friend bool operator==(const MailboxKey&, const MailboxKey&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const MailboxKey& key) {
      return H::combine(std::move(h), key.epoch, key.from, key.tag);
    }
  };

  // Called by reactors. Deliver counts a drop when the message is stale.
  void Deliver(uint64_t epoch, int from, const Tag& tag, std::string message,
               uint64_t frames);
  void StreamEnded(uint64_t epoch, int from, absl::Status why);
  void CountRefused();

  EpochState& StateLocked(uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t min_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, EpochState> epochs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<MailboxKey, std::deque<std::string>> mailboxes_
      ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_GRPC_PEER_SERVICE_H_

// PeerService: the receiving side of the gRPC transport, one per process.
//
// It serves gradmesh.v1.Peer's Exchange (as the server's generic service, so
// that frames are read without protobuf's copies: frame_codec.h). Every
// incoming stream belongs to one (epoch, sender) pair; its frames are put back
// together into messages, which wait in mailboxes keyed by (epoch, sender, tag)
// until a GrpcTransport of that epoch receives them. Frames of a retired
// epoch or of a retired operation are dropped and counted, never delivered.
// Frames of an epoch this process has not opened yet are kept (a peer may
// start an epoch first), up to kMaxUnopenedBytes in all: past that the stream
// is refused.
//
// What one peer may hold here (peer_budget.cc), on any connection:
//   - kMaxStreamsPerRank incoming streams at once per epoch;
//   - a message is charged its announced size (plus kMessageOverheadBytes)
//     from its first frame (against kMaxUnopenedBytes for an epoch not
//     opened, else against the sender's budget in that epoch,
//     max_held_bytes_per_peer), so a false length is refused before its
//     data comes; a message of a retired epoch or operation is read into
//     nothing;
//   - messages of operations this process has not started (no local Send or
//     Receive yet) count against the sender's budget until it starts them.
//     Past it, the oldest such operation's messages from that sender are
//     dropped and counted, and a later Receive of them fails at once with
//     ResourceExhausted: an operation nobody here runs holds nothing for
//     long. A message that does not fit even then ends its stream with
//     ResourceExhausted.
//
// Identity: on a TLS connection, a stream speaks for the rank it claims only
// if the caller's certificate names that rank's host (grpc_util.h); other
// streams are refused with PermissionDenied and counted, and their end says
// nothing about the rank they claimed. A stream of an epoch not opened yet
// is checked when it opens: until then its messages are held apart. On a
// plaintext connection the network is trusted and nothing is checked, but a
// stream over a unix-domain socket (the SDK's, when it shares this server)
// is refused with PermissionDenied: local trainers are not peers.
//
// Failures, and what they fail:
//   - a stream that breaks (either direction: the peer's incoming stream, or
//     this process's outgoing stream to it, as GrpcTransport reports) fails
//     the operations in flight with that peer: those that had sent, received
//     or waited for anything and are not retired. Messages of theirs may be
//     lost. Later operations go on: the sender opens a new stream.
//   - a stream the peer closes cleanly (its transport of that epoch is gone)
//     fails every later Receive from it in that epoch;
//   - AbortEpoch fails every Receive of the epoch.
//
//   PeerService peers;  // must outlive the server that serves it
//   builder.RegisterCallbackGenericService(&peers);
//   ... GrpcTransport::Create({.service = &peers, ...});
//
// Thread-safe. Reactions never block: delivery takes one mutex briefly.
//
// One class, a file per concern: peer_stream.cc (an incoming stream's frames
// into messages), peer_admission.cc (who may speak in an epoch),
// peer_liveness.cc (what a broken stream fails), peer_budget.cc (what one
// peer may hold) and peer_service.cc (the mailboxes, and what ends them).
#ifndef GRADMESH_WORKER_TRANSPORT_GRPC_PEER_SERVICE_H_
#define GRADMESH_WORKER_TRANSPORT_GRPC_PEER_SERVICE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
  // Every peer may hold 1 GiB here by default.
  static constexpr uint64_t kDefaultHeldBytesPerPeer = uint64_t{1} << 30;
  explicit PeerService(
      uint64_t max_held_bytes_per_peer = kDefaultHeldBytesPerPeer)
      : max_held_bytes_per_peer_(max_held_bytes_per_peer) {}
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  // Exchange streams; any other method is UNIMPLEMENTED.
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

  // Records that this process runs `epoch` as `rank` of a group whose
  // members serve at `peers` (index = rank): its frames are no longer held
  // against kMaxUnopenedBytes, and streams claiming a rank outside the group
  // (or this one), or whose certificate does not name that rank's host, are
  // refused, those already admitted included. Epochs open in increasing
  // order: what epochs below it that were never opened hold is freed, and
  // their later frames are dropped. Each OpenEpoch (a transport of `epoch`)
  // is paired with a CloseEpoch.
  // FailedPrecondition for an epoch retired here (below one opened since, or
  // closed).
  absl::Status OpenEpoch(uint64_t epoch, int rank,
                         std::vector<std::string> peers);

  // Once every transport that opened `epoch` has closed it: frees what is
  // kept for it; its later frames are dropped, and so are those of every
  // epoch below the oldest one still open.
  void CloseEpoch(uint64_t epoch);
  static constexpr uint64_t kMaxUnopenedBytes = uint64_t{256} << 20;
  // Epochs not opened here that may hold frames at once, and how far past
  // the newest opened one a stream's epoch may be; each message counts
  // kMessageOverheadBytes on top of its own against kMaxUnopenedBytes.
  static constexpr size_t kMaxUnopenedEpochs = 16;
  static constexpr uint64_t kMaxEpochsAhead = 1024;
  static constexpr uint64_t kMessageOverheadBytes = 64;
  // TLS streams of an epoch not opened yet, per rank they claim (each also
  // counts kMessageOverheadBytes and its certificate's names); one that ends
  // having carried no message is forgotten at once.
  static constexpr size_t kMaxHeldStreamsPerRank = 16;
  // Incoming streams of one epoch from one rank that may run at once.
  static constexpr size_t kMaxStreamsPerRank = 16;

  // Blocks for the message from `from` with `tag` in `epoch`. Errors: the
  // epoch's abort status; Aborted once the epoch is retired or closed;
  // Unavailable once the sender's stream broke while the operation was in
  // flight, or the sender closed its stream, and no such message is
  // waiting; ResourceExhausted once its messages were dropped for the
  // sender's budget; DeadlineExceeded.
  absl::StatusOr<std::string> Receive(uint64_t epoch, int from, const Tag& tag,
                                      absl::Time deadline);

  // Marks `operation` of `epoch` in flight (the sending side's first Send;
  // Receive and delivery mark it too), so that a stream break fails it.
  void NoteOperation(uint64_t epoch, uint64_t operation);

  // When the first message of `operation` of `epoch` that waits here, not
  // started here, was delivered (SteadyNow() time); nullopt when none waits
  // or the operation has started.
  std::optional<absl::Time> UnclaimedSince(uint64_t epoch,
                                           uint64_t operation) const;

  // Fails present and future Receive calls of `epoch` with `status`.
  void AbortEpoch(uint64_t epoch, const absl::Status& status);

  // Records that this process opened a stream to `peer` in `epoch`; returns
  // the stream's number for PeerBroke.
  uint64_t OutgoingStreamOpened(uint64_t epoch, int peer);

  // Outgoing stream `stream` to `peer` in `epoch` broke: the operations in
  // flight fail their Receive from it (once nothing is waiting) with
  // `status`; when a newer stream to the peer exists, only those noted
  // before it opened (later ones never used the broken stream).
  void PeerBroke(uint64_t epoch, int peer, uint64_t stream,
                 const absl::Status& status);

  // Frees what is kept for `operation` of `epoch` (it has finished or
  // failed here); its later frames are dropped. The last
  // kRetiredOperationsKept retired ids of an epoch are remembered, and at
  // most as many operations are tracked in flight.
  void RetireOperation(uint64_t epoch, uint64_t operation);
  static constexpr size_t kRetiredOperationsKept =
      Transport::kEndedOperationsKept;

  struct Stats {
    uint64_t messages_delivered = 0;
    uint64_t frames_dropped_old_epoch = 0;
    uint64_t frames_dropped_retired_operation = 0;
    uint64_t streams_refused = 0;  // malformed frames ended the stream
    uint64_t streams_refused_unopened_bytes = 0;  // over kMaxUnopenedBytes
    // Past kMaxUnopenedEpochs holding frames, or kMaxEpochsAhead.
    uint64_t streams_refused_unopened_epochs = 0;
    // Certificates that do not name the host of the rank claimed.
    uint64_t streams_refused_identity = 0;
    // Over kMaxStreamsPerRank, or a message past the sender's budget.
    uint64_t streams_refused_peer_budget = 0;
    // Messages of operations not started here, dropped for the budget.
    uint64_t messages_dropped_unclaimed = 0;
  };
  Stats stats() const;

 private:
  class Reactor;

  struct Unverified {
    int from = -1;
    std::vector<std::string> names;  // the certificate's
    uint64_t charge = 0;  // against the unopened bytes, for the entry itself
    std::deque<std::pair<Tag, std::string>> messages;
    std::optional<std::pair<bool, absl::Status>> ended;  // clean, why
  };
  // What one sender holds in an epoch (peer_budget.cc).
  struct Held {
    size_t streams = 0;  // incoming streams running
    uint64_t bytes = 0;  // charged against max_held_bytes_per_peer_
    // Its operations in `unclaimed`, oldest first; entries claimed since
    // go from the front as they surface, and all at once when they
    // outnumber the live ones (`live`) twice over.
    std::deque<uint64_t> unclaimed_order;
    size_t live = 0;
  };
  // A message in assembly: its announced size, charged where it went.
  struct Assembling {
    int from = -1;
    uint64_t bytes = 0;
    bool unopened = false;  // against the unopened bytes, else the budget
  };
  struct EpochState {
    absl::Status aborted;  // OK unless aborted
    bool open = false;     // OpenEpoch was called
    int transports = 0;    // OpenEpoch calls not yet closed
    bool closed = false;   // CloseEpoch was called: its frames are dropped
    int rank = -1;
    std::vector<std::string> peers;  // addresses, index = rank (once open)
    uint64_t unopened_bytes = 0;     // held while not open
    absl::flat_hash_map<int, absl::Status> gone;  // closed: peer -> why
    // Operations in flight (bounded, oldest first) with the number they were
    // noted at, and those a break failed: operation -> peer -> why. Streams
    // take numbers from the same count, so that a break tells which
    // operations came before the stream that replaced it.
    uint64_t next_number = 0;
    absl::flat_hash_map<uint64_t, uint64_t> active;
    std::deque<uint64_t> active_order;
    absl::flat_hash_map<int, uint64_t> newest_in;   // peer -> stream number
    absl::flat_hash_map<int, uint64_t> newest_out;  // peer -> stream number
    absl::flat_hash_map<uint64_t, absl::flat_hash_map<int, absl::Status>>
        broken;
    absl::flat_hash_set<uint64_t> retired;  // operations
    std::deque<uint64_t> retired_order;     // oldest first
    // TLS streams admitted before the epoch opened, by stream number: their
    // messages wait here until OpenEpoch checks who sent them.
    absl::flat_hash_map<uint64_t, Unverified> unverified;
    absl::flat_hash_map<int, size_t> unverified_per_rank;  // claimed rank
    // Streams that failed that check and still run: why.
    absl::flat_hash_map<uint64_t, absl::Status> refused_streams;
    absl::flat_hash_map<int, Held> held;                   // by sender
    absl::flat_hash_map<uint64_t, Assembling> assembling;  // by stream
    // Operations started here (a local Send or Receive), until retired.
    absl::flat_hash_set<uint64_t> claimed;
    // Delivered, not started here: operation -> sender -> bytes, and when
    // its first message was delivered (steady clock).
    absl::flat_hash_map<uint64_t, absl::flat_hash_map<int, uint64_t>> unclaimed;
    absl::flat_hash_map<uint64_t, absl::Time> unclaimed_since;
  };
  // Called by reactors. Deliver counts a drop when the message is stale;
  // it refuses (an error ends the stream) a message past the unopened bytes.
  absl::Status Deliver(uint64_t epoch, int from, uint64_t stream,
                       const Tag& tag, std::string message, uint64_t frames);
  // Admits an incoming stream of `epoch` from `from` and returns its number:
  // an error for a sender no group of `epoch` has (once it is open), for a
  // certificate that does not name its host (`names`: null on plaintext),
  // or for one epoch too many not opened here.
  absl::StatusOr<uint64_t> IncomingStreamOpened(
      uint64_t epoch, int from, const std::vector<std::string>* names);
  // A message of `operation` announcing `bytes` starts on incoming stream
  // `stream` from `from`: notes the operation in flight, unless the
  // stream's sender is not known yet, and charges the bytes. Returns
  // whether to keep its data: false when its epoch or operation is retired
  // (the reactor reads it into nothing and calls Discarded). The refusal of
  // a stream refused when its epoch opened; ResourceExhausted when the
  // message does not fit.
  absl::StatusOr<bool> NoteIncoming(uint64_t epoch, int from, uint64_t stream,
                                    uint64_t operation, uint64_t bytes);
  // A message NoteIncoming said not to keep has ended after `frames`
  // frames: counts them dropped.
  void Discarded(uint64_t epoch, uint64_t frames);
  // `clean`: the peer closed the stream itself (its epoch is over). A
  // message in assembly is released.
  void StreamEnded(uint64_t epoch, int from, uint64_t stream, bool clean,
                   absl::Status why);

  // peer_budget.cc. Charges a message announcing `bytes` from `from` on
  // `stream`, or says why it does not fit.
  absl::Status ChargeLocked(uint64_t epoch, EpochState& state, int from,
                            uint64_t stream, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the charge of `stream`'s message in assembly (delivered or
  // cut short).
  void ReleaseLocked(EpochState& state, uint64_t stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A delivered message of an operation not started here: charged to its
  // sender until the operation starts or ends here.
  void HoldUnclaimedLocked(EpochState& state, int from, uint64_t operation,
                           uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `operation` started here (or ended): its messages no longer count.
  void ClaimLocked(EpochState& state, uint64_t operation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `from`'s entries of `held`'s order that are no longer unclaimed.
  void TrimOrderLocked(EpochState& state, int from, Held& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the oldest unclaimed operation's messages from `from`; false if
  // there is none.
  bool DropOldestUnclaimedLocked(uint64_t epoch, EpochState& state, int from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OpenEpoch: what was charged against the unopened bytes moves to the
  // senders' budgets.
  void MoveAssemblingToBudgetsLocked(EpochState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PeerBroke's work, for either direction's newest stream numbers.
  void BreakLocked(EpochState& state, int peer, uint64_t stream,
                   uint64_t newest, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountRefused();
  // Whether a stream from `from` may speak in `state` (open): a peer's rank,
  // and, unless `names` is null (plaintext), a certificate naming its host.
  // Counts an identity refusal.
  absl::Status CheckSenderLocked(EpochState& state, int from,
                                 const std::vector<std::string>* names)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OpenEpoch's check of the streams admitted before it.
  void VerifyHeldLocked(uint64_t epoch, EpochState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Whether `epoch`'s frames are dropped: below min_epoch_, or closed.
  bool RetiredLocked(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees what `state` of `epoch` keeps and marks it closed.
  void CloseLocked(uint64_t epoch, EpochState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees what is kept for epochs below `epoch`; their later frames are
  // dropped.
  void RetireEpochsBelowLocked(uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteOperationLocked(EpochState& state, uint64_t operation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  EpochState& StateLocked(uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t max_held_bytes_per_peer_;
  mutable absl::Mutex mu_;
  uint64_t min_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unopened_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // over all epochs
  uint64_t max_opened_ ABSL_GUARDED_BY(mu_) = 0;      // newest OpenEpoch
  absl::flat_hash_map<uint64_t, EpochState> epochs_ ABSL_GUARDED_BY(mu_);
  // Messages waiting, by sender and tag (whose epoch is the stream's).
  absl::flat_hash_map<MessageKey, std::deque<std::string>> mailboxes_
      ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_GRPC_PEER_SERVICE_H_

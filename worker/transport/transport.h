// Transport: the narrow seam between the collectives and the network.
//
// A Transport is one rank's endpoint in a group of size() ranks. Messages are
// opaque byte strings addressed by (peer, Tag); the Tag names the membership
// epoch, the operation and the step, so that messages of different operations
// or steps never mix, whatever order they arrive in.
//
//   GM_RETURN_IF_ERROR(t.Send(peer, tag, EncodeCoo(block)));
//   GM_ASSIGN_OR_RETURN(std::string bytes, t.Recv(peer, tag, deadline));
//
// Contract for every implementation:
//   - Send never waits for the receiver: it queues the message and returns.
//     A step of a schedule may therefore send first and receive second on
//     every rank without deadlock.
//   - Messages between one ordered pair of ranks with equal tags are received
//     in the order they were sent.
//   - Recv blocks until the message arrives, the deadline passes
//     (DeadlineExceeded), this endpoint is aborted (the Abort status), or the
//     peer is known to be gone (Unavailable).
//   - Abort(status) fails this endpoint's pending and future calls with
//     `status` and makes peers waiting on it fail with Unavailable.
//   - EndOperation(op) ends an operation at this endpoint, finished or not:
//     what is kept for it is freed and its late messages are dropped (an
//     OperationScope does it on every path).
//   - Counters count payload bytes only (tags and framing are not counted), so
//     they compare directly with the papers' volume formulas.
// All methods are thread-safe.
#ifndef GRADMESH_WORKER_TRANSPORT_TRANSPORT_H_
#define GRADMESH_WORKER_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradmesh::transport {

struct Tag {
  uint64_t epoch = 0;      // membership epoch
  uint64_t operation = 0;  // operation id, unique within an epoch
  uint32_t step = 0;       // step of the operation's schedule

  friend bool operator==(const Tag&, const Tag&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Tag& tag) {
    return H::combine(std::move(h), tag.epoch, tag.operation, tag.step);
  }
};

std::string ToString(const Tag& tag);

// Where a message waits at its receiver: its sender and its tag.
struct MessageKey {
  int from = 0;
  Tag tag;

  friend bool operator==(const MessageKey&, const MessageKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const MessageKey& key) {
    return H::combine(std::move(h), key.from, key.tag);
  }
};

// Network transports cut messages into chunks of at most this many bytes
// (settable, so that tests cross chunk boundaries), below gRPC's 4 MiB
// default receive limit.
inline constexpr uint64_t kDefaultChunkBytes = 1 << 20;
inline constexpr uint64_t kMaxChunkBytes = 3 << 20;

// Traffic of one endpoint, total and per peer.
struct Counters {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  std::vector<uint64_t> bytes_sent_to;        // indexed by peer rank
  std::vector<uint64_t> bytes_received_from;  // indexed by peer rank
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Queues `payload` for `peer` (0 <= peer < size(), peer != rank()).
  virtual absl::Status Send(int peer, const Tag& tag, std::string payload) = 0;

  // Waits for the message from `peer` carrying `tag`.
  virtual absl::StatusOr<std::string> Recv(int peer, const Tag& tag,
                                           absl::Time deadline) = 0;

  virtual void Abort(const absl::Status& status) = 0;

  // Ends `operation` here: messages of it waiting or arriving later are
  // dropped (an endpoint remembers at least the last kEndedOperationsKept
  // operations it ended). Call it once no Recv of the operation runs.
  virtual void EndOperation(uint64_t epoch, uint64_t operation) = 0;
  static constexpr size_t kEndedOperationsKept = 4096;

  virtual Counters counters() const = 0;

  // When the first message of `operation` that waits here, not started at
  // this endpoint, arrived (SteadyNow() time): peers started an operation
  // this rank has not. nullopt when none waits, once the operation started
  // here, and always on transports that do not track it.
  virtual std::optional<absl::Time> UnclaimedSince(uint64_t epoch,
                                                   uint64_t operation) const {
    return std::nullopt;
  }

  // The peers to which this endpoint has had messages on their way, with
  // no progress (nothing acknowledged by the receiver) for at least
  // `timeout` before `now` (SteadyNow() time): a link that drops every
  // packet, a connection that cannot be made. Empty on transports that do
  // not track it.
  virtual std::vector<int> StalledPeers(absl::Duration timeout,
                                        absl::Time now) const {
    return {};
  }
};

// Ends an operation on a transport when it goes out of scope, however the
// operation ended (a null transport: nothing to end).
//
//   OperationScope scope(transport, tag.epoch, tag.operation);
class OperationScope {
 public:
  OperationScope(Transport* transport, uint64_t epoch, uint64_t operation)
      : transport_(transport), epoch_(epoch), operation_(operation) {}
  ~OperationScope() {
    if (transport_ != nullptr) transport_->EndOperation(epoch_, operation_);
  }
  OperationScope(const OperationScope&) = delete;
  OperationScope& operator=(const OperationScope&) = delete;

 private:
  Transport* const transport_;
  const uint64_t epoch_;
  const uint64_t operation_;
};

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_TRANSPORT_H_

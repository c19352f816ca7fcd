// LoopbackNetwork: an in-process Transport for P ranks.
//
// Each rank is meant to run on its own thread; messages move through shared
// mailboxes under one mutex. Deterministic and fast: the multi-rank tests,
// `gradmesh replay` and the simulator run on it.
//
//   LoopbackNetwork net(4);
//   std::thread t([&] { Work(net.endpoint(1)); });   // one thread per rank
//
// The network must outlive every use of its endpoints. Thread-safe.
#ifndef GRADMESH_WORKER_TRANSPORT_LOOPBACK_H_
#define GRADMESH_WORKER_TRANSPORT_LOOPBACK_H_

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/transport.h"

namespace gradmesh::transport {

class LoopbackNetwork {
 public:
  explicit LoopbackNetwork(int size);
  ~LoopbackNetwork();
  LoopbackNetwork(const LoopbackNetwork&) = delete;
  LoopbackNetwork& operator=(const LoopbackNetwork&) = delete;

  int size() const { return static_cast<int>(endpoints_.size()); }
  Transport* endpoint(int rank) const;

 private:
  class Endpoint;

  using OperationKey = std::pair<uint64_t, uint64_t>;  // epoch, operation

  // One rank's messages waiting, the operations it started and ended, and
  // when the first message of each operation not started here arrived.
  struct Inbox {
    absl::flat_hash_map<MessageKey, std::deque<std::string>> mailboxes;
    absl::flat_hash_set<OperationKey> started;  // a Recv ran; not ended
    absl::flat_hash_map<OperationKey, absl::Time> unclaimed_since;
    absl::flat_hash_set<OperationKey> ended;
    std::deque<OperationKey> ended_order;  // oldest first
  };

  mutable absl::Mutex mu_;
  std::vector<Inbox> inboxes_ ABSL_GUARDED_BY(mu_);         // by receiver
  std::vector<absl::Status> aborted_ ABSL_GUARDED_BY(mu_);  // OK = alive
  std::vector<Counters> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_LOOPBACK_H_

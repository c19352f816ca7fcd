// Small operations over a group beside the all-reduce, for the daemon's
// protocol: the gather of small records (registration, the agreement before
// a step, the vote after it) and the flat broadcast of a bucket's values.
// Each runs under its own operation id, so it never mixes with others, over
// any Transport, and ends it there when it returns (EndOperation).
//
// Thread-safe as the transport is; blocking until `deadline` at most.
#ifndef GRADMESH_WORKER_ENGINE_GROUP_OPS_H_
#define GRADMESH_WORKER_ENGINE_GROUP_OPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/transport/transport.h"

namespace gradmesh::engine {

// Where a small operation runs: this worker is `rank` of `size` members of
// membership `epoch`, reached through `transport`.
struct GroupPlace {
  transport::Transport* transport = nullptr;
  uint64_t epoch = 0;
  int rank = 0;
  int size = 1;
};

// Every member's `mine`, by rank (Bruck all-gather, ceil(log2 P) rounds).
// With `same_size`, a record of another size than `mine` is InvalidArgument
// naming its rank. `waited` (may be null) accumulates the time blocked on
// peers.
absl::StatusOr<std::vector<std::string>> GatherSmall(
    const GroupPlace& place, uint64_t operation, std::string mine,
    absl::Time deadline, bool same_size = false, double* waited = nullptr);

// Copies `values` from member `root` to every member: the root sends to each
// directly. InvalidArgument for a message of another size (naming the root),
// Unavailable or DeadlineExceeded as the transport says.
absl::Status BroadcastValues(const GroupPlace& place, uint64_t operation,
                             int root, absl::Span<float> values,
                             absl::Time deadline);

}  // namespace gradmesh::engine

#endif  // GRADMESH_WORKER_ENGINE_GROUP_OPS_H_

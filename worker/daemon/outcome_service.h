// The Commit service: a worker in doubt about a step asks its peers what
// they decided (DataPlane::Decide answers), over the peer port. An ask can
// make this worker promise to refuse a step, so only members may ask: `admit`
// says whether the caller was a member of the step's epoch, which this
// worker must have installed (an error is returned as the call's status).
//
//   OutcomeService outcomes(&plane, admit);
//   builder.RegisterService(&outcomes);
//   ... AskOutcome(channel, key, gone, deadline)  // from a peer
//   ... UnreachableMembers(members, make_channel, deadline)  // before a join
//
// Thread-safe (the data plane is).
#ifndef GRADMESH_WORKER_DAEMON_OUTCOME_SERVICE_H_
#define GRADMESH_WORKER_DAEMON_OUTCOME_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradmesh/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "worker/daemon/data_plane.h"

namespace gradmesh::daemon {

class OutcomeService final : public gradmesh::v1::Commit::Service {
 public:
  // The longest member id a question may name (node ids are host names or
  // addresses).
  static constexpr size_t kMaxNodeIdBytes = 1024;
  using Admit = std::function<absl::Status(const grpc::ServerContext& context,
                                           uint64_t epoch)>;
  OutcomeService(DataPlane* plane, Admit admit)
      : plane_(plane), admit_(std::move(admit)) {}

  grpc::Status Outcome(grpc::ServerContext* context,
                       const gradmesh::v1::OutcomeRequest* request,
                       gradmesh::v1::OutcomeResponse* response) override;
  // Answers at once: the caller can reach this worker.
  grpc::Status Probe(grpc::ServerContext* context,
                     const gradmesh::v1::ProbeRequest* request,
                     gradmesh::v1::ProbeResponse* response) override;

 private:
  DataPlane* const plane_;
  const Admit admit_;
};

// The outcome of `key` at the worker behind `channel`: its Decide, told
// that this worker counts the members `gone` as gone. The channel's errors,
// or Internal for an answer that names no state.
absl::StatusOr<Outcome> AskOutcome(std::shared_ptr<grpc::Channel> channel,
                                   const OutcomeKey& key,
                                   const std::vector<std::string>& gone,
                                   absl::Time deadline);

// The ids of the `members` (node id, address) from which no answer to a
// Probe (a refusal counts as one) comes by `deadline`, over a channel that
// `channel` makes for an address (a new one, so that a connection cut earlier
// is not reused), asked at once.
std::vector<std::string> UnreachableMembers(
    const std::vector<std::pair<std::string, std::string>>& members,
    const std::function<std::shared_ptr<grpc::Channel>(const std::string&)>&
        channel,
    absl::Time deadline);

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_OUTCOME_SERVICE_H_

// The Commit service: a worker in doubt about a step asks its peers what
// they decided (DataPlane::Decide answers), over the peer port.
//
//   OutcomeService outcomes(&plane);
//   builder.RegisterService(&outcomes);
//   ... AskOutcome(channel, key, deadline)  // from a peer
//
// Thread-safe (the data plane is).
#ifndef GRADMESH_WORKER_DAEMON_OUTCOME_SERVICE_H_
#define GRADMESH_WORKER_DAEMON_OUTCOME_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradmesh/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "worker/daemon/data_plane.h"

namespace gradmesh::daemon {

class OutcomeService final : public gradmesh::v1::Commit::Service {
 public:
  explicit OutcomeService(DataPlane* plane) : plane_(plane) {}

  grpc::Status Outcome(grpc::ServerContext* context,
                       const gradmesh::v1::OutcomeRequest* request,
                       gradmesh::v1::OutcomeResponse* response) override;

 private:
  DataPlane* const plane_;
};

// The outcome of `key` at the worker behind `channel`: its Decide. The
// channel's errors, or Internal for an answer that names no state.
absl::StatusOr<Outcome> AskOutcome(std::shared_ptr<grpc::Channel> channel,
                                   const OutcomeKey& key, absl::Time deadline);

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_OUTCOME_SERVICE_H_

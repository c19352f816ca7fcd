// SdkService: the Worker service that training processes call through the
// SDK (proto/gradmesh/v1/worker.proto), a thin layer over the DataPlane:
// it turns requests into data-plane calls and statuses back into gRPC ones.
//
// Each call's deadline is the client's, capped by the daemon's operation
// timeout.
//
// Who may call: anyone who can open the unix socket (it is owner-only).
// Over TCP a call must bear the worker's token, as gRPC metadata
// "authorization: Bearer TOKEN", or it is refused with Unauthenticated; a
// worker without a token refuses every call over TCP (PermissionDenied).
//
// Thread-safe (the data plane is).
#ifndef GRADMESH_WORKER_DAEMON_SDK_SERVICE_H_
#define GRADMESH_WORKER_DAEMON_SDK_SERVICE_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradmesh/v1/worker.grpc.pb.h"
#include "worker/daemon/data_plane.h"
#include "worker/daemon/view_tracker.h"

namespace gradmesh::daemon {

class SdkService final : public gradmesh::v1::Worker::Service {
 public:
  struct Options {
    absl::Duration operation_timeout;
    std::string token;  // empty: no calls over TCP
    // Told of each refused call (the daemon counts and logs it).
    std::function<void(const absl::Status&)> on_refused;
    // Before a Register, AllReduce, Broadcast or GetStatus (`step`: an
    // AllReduce or Broadcast): an error refuses the call
    // (TrainerWatch::BeforeCall). Empty: none.
    std::function<absl::Status(bool step)> before_call;
    // A Register that takes over a bucket another client stepped
    // (DataPlane::TakenOver), saying so, before it runs
    // (TrainerWatch::NewTrainer). Empty: none.
    std::function<void(const std::string& why)> new_trainer;
  };
  SdkService(DataPlane* plane, ViewTracker* views, Options options)
      : plane_(plane), views_(views), options_(std::move(options)) {}

  // The node id GetStatus reports (known once the port is bound).
  void set_node_id(std::string node_id) {
    absl::MutexLock lock(&mu_);
    node_id_ = std::move(node_id);
  }

  grpc::Status Register(grpc::ServerContext* context,
                        const gradmesh::v1::RegisterRequest* request,
                        gradmesh::v1::RegisterResponse* response) override;
  grpc::Status Unregister(grpc::ServerContext* context,
                          const gradmesh::v1::UnregisterRequest* request,
                          gradmesh::v1::UnregisterResponse* response) override;
  grpc::Status AllReduce(grpc::ServerContext* context,
                         const gradmesh::v1::AllReduceRequest* request,
                         gradmesh::v1::AllReduceResponse* response) override;
  grpc::Status Broadcast(grpc::ServerContext* context,
                         const gradmesh::v1::BroadcastRequest* request,
                         gradmesh::v1::BroadcastResponse* response) override;
  grpc::Status Residual(grpc::ServerContext* context,
                        const gradmesh::v1::ResidualRequest* request,
                        gradmesh::v1::ResidualResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const gradmesh::v1::StatusRequest* request,
                         gradmesh::v1::StatusResponse* response) override;

 private:
  absl::Time Deadline(const grpc::ServerContext& context) const;
  // The token check above, first in every handler.
  absl::Status Admit(const grpc::ServerContext& context) const;
  // Admit, then Options::before_call: first in AllReduce and Broadcast.
  absl::Status AdmitStep(const grpc::ServerContext& context) const;

  DataPlane* const plane_;
  ViewTracker* const views_;
  const Options options_;
  absl::Mutex mu_;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_SDK_SERVICE_H_

// SdkService: the Worker service that training processes call through the
// SDK (proto/gradmesh/v1/worker.proto), a thin layer over the DataPlane:
// it turns requests into data-plane calls and statuses back into gRPC ones.
//
// Each call's deadline is the client's, capped by the daemon's operation
// timeout.
//
// Thread-safe (the data plane is).
#ifndef GRADMESH_WORKER_DAEMON_SDK_SERVICE_H_
#define GRADMESH_WORKER_DAEMON_SDK_SERVICE_H_

#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradmesh/v1/worker.grpc.pb.h"
#include "worker/daemon/data_plane.h"
#include "worker/daemon/view_tracker.h"

namespace gradmesh::daemon {

class SdkService final : public gradmesh::v1::Worker::Service {
 public:
  SdkService(DataPlane* plane, ViewTracker* views,
             absl::Duration operation_timeout)
      : plane_(plane), views_(views), operation_timeout_(operation_timeout) {}

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

  DataPlane* const plane_;
  ViewTracker* const views_;
  const absl::Duration operation_timeout_;
  absl::Mutex mu_;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_SDK_SERVICE_H_

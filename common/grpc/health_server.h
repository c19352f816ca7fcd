// HealthServer: the standard gRPC health service (grpc.health.v1.Health) on a
// port of its own, in plaintext, for probes that cannot present a client
// certificate (Kubernetes' `grpc:` probes, a container's HEALTHCHECK).
//
// It answers two service names:
//   ""       (liveness)  SERVING while the process serves;
//   "ready"  (readiness) SERVING once the owner calls SetReady(true).
// Any other name gets NOT_FOUND; only Check is served (no Watch), which is
// what probes call. It carries no data, so plaintext gives away nothing but
// whether the process is up and ready.
//
//   GM_ASSIGN_OR_RETURN(auto health, HealthServer::Start("0.0.0.0:7709"));
//   health->SetReady(true);
//   ...
//   health->Stop();  // NOT_SERVING from here on, then the port closes
//
// Thread-safe.
#ifndef GRADMESH_COMMON_GRPC_HEALTH_SERVER_H_
#define GRADMESH_COMMON_GRPC_HEALTH_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradmesh {

inline constexpr char kReadinessService[] = "ready";

class HealthServer {
 public:
  // Binds `listen` (host:port; port 0 picks one). Unavailable if it can't.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(
      const std::string& listen);
  virtual ~HealthServer() = default;

  virtual void SetReady(bool ready) = 0;
  virtual int port() const = 0;
  // Idempotent; the destructor calls it.
  virtual void Stop() = 0;
};

// Asks the health service at `address` (plaintext) about `service` within
// `timeout_ms`. OK when it answers SERVING; NotFound for a service name it
// does not know; Unavailable with the status it answered (NOT_SERVING) or
// the call's error otherwise.
absl::Status CheckHealth(const std::string& address, const std::string& service,
                         int timeout_ms);

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_GRPC_HEALTH_SERVER_H_

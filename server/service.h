// CoordinatorServer: gradmesh-coordinator's gRPC service over the
// Coordinator state machine, with its /metrics.
//
//   auto server = CoordinatorServer::Start({.listen = "0.0.0.0:7700",
//                                           .plan = {.teams = 0}});
//   ...
//   (*server)->Stop();
//
// Series at /metrics (prometheus-cpp):
//   gradmesh_coordinator_members, _epoch, _teams        gauges
//   gradmesh_coordinator_plan_info{algorithm,encoding,values}  gauge = 1
//   gradmesh_coordinator_autotuning                      gauge (0/1)
//   gradmesh_coordinator_autotune_trial_seconds{d}       gauge: a trial's mean
//   gradmesh_coordinator_autotune_modeled_seconds{d}     gauge: the
//       alpha-beta model's
//   gradmesh_coordinator_iteration_seconds{node}         gauge: latest report
//   gradmesh_coordinator_link_alpha_seconds, _link_beta_seconds_per_byte
//   gradmesh_coordinator_member_departures_total{node}  counter: times a
//       node left the view (left, expired, or restarted as a new process)
//   gradmesh_coordinator_calls_refused_total             counter
// Each scrape reads the state machine afresh.
//
// With mutual TLS, a call that speaks for a member (Join, Heartbeat, Leave,
// ReportStats) is refused with PermissionDenied, logged and counted unless
// the caller's certificate names that member's host (grpc_util.h).
//
// Thread-safe. Membership is checked every 100 ms (heartbeat timeouts), on
// the steady clock: a step of the wall clock evicts nobody and keeps nobody.
// When it goes more than 1 s (or half the heartbeat timeout, if shorter)
// from one check without checking or hearing any member (the process was
// paused or starved), that silence is excused (Coordinator::Excuse).
#ifndef GRADMESH_SERVER_SERVICE_H_
#define GRADMESH_SERVER_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc/grpc_util.h"
#include "server/coordinator.h"

namespace gradmesh::server {

struct ServerOptions {
  std::string listen = "127.0.0.1:7700";  // port 0 picks one
  std::string metrics_listen;             // host:port; empty: off
  // Plaintext gRPC health service (common/grpc/health_server.h), "" and
  // "ready" both SERVING while serving; empty: off.
  std::string health_listen;
  TlsFiles tls;
  PlanConfig plan;
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  // How long a member removed because others could not reach it is kept
  // out at first (LinkReports).
  absl::Duration quarantine = absl::Seconds(30);
};

class CoordinatorServer {
 public:
  // InvalidArgument for a bad plan; Unavailable if a port can't be bound.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const ServerOptions& options);
  virtual ~CoordinatorServer() = default;

  // Ends the watch streams and stops serving. Idempotent.
  virtual void Stop() = 0;
  virtual std::string address() const = 0;
  virtual int metrics_port() const = 0;  // 0 when /metrics is off
  virtual int health_port() const = 0;   // 0 when health checks are off
};

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_SERVICE_H_

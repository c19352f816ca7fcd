// WorkerDaemon: gradmesh-worker, one per GPU node, wired from small parts:
//   - PeerService + GrpcTransport: the peer exchange (gRPC streams);
//   - CoordinatorClient: join, heartbeat, views, autotune reports;
//   - ViewTracker: which group (epoch, plan, transport) a step runs on;
//   - DataPlane: registered tensor sets in shared memory, all-reduce,
//     broadcast and barrier on them, residuals per (job, bucket);
//   - SdkService: the Worker service for the SDK, on the peer port (or on
//     `sdk_listen`) and on a unix socket (owner-only) when `sdk_socket` is
//     set;
//   - HealthServer: liveness and readiness for probes, on `health_listen`.
//
//   - OutcomeService: the Commit service, which peers in doubt about a step
//     ask (see DataPlane).
//
// Views: one that changes membership applies at once, aborting operations in
// flight (the data plane runs their steps again on the new view); a plan
// change of the same members applies from its start step, so that all
// members switch at the same step.
//
//   auto daemon = WorkerDaemon::Start({.coordinator = "10.0.0.1:7700"});
//   ...
//   (*daemon)->Stop();  // leaves the coordinator, ends requests in flight
//
// Thread-safe. Logs go to stderr, each line with node, epoch and rank.
#ifndef GRADMESH_WORKER_DAEMON_DAEMON_H_
#define GRADMESH_WORKER_DAEMON_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc/grpc_util.h"
#include "worker/transport/grpc/peer_service.h"

namespace gradmesh::kernels {
class TopKSelector;
}  // namespace gradmesh::kernels

namespace gradmesh::daemon {

struct DaemonOptions {
  std::string listen = "127.0.0.1:0";  // peer + worker services; port 0 picks
  std::string advertise;       // address peers and clients dial; default: the
                               // listen host with the bound port
  std::string coordinator;     // host:port, required
  std::string node_id;         // default: the advertised address
  std::string metrics_listen;  // host:port for /metrics; empty: off
  std::string sdk_socket;      // unix socket path for the SDK; empty: none
  // TCP host:port of the SDK alone, so that a network policy can tell
  // trainers' traffic from peers'; empty: the SDK shares `listen`.
  std::string sdk_listen;
  // Plaintext gRPC health service (common/grpc/health_server.h): "" while
  // serving, "ready" while this worker is a member of the current view;
  // empty: off.
  std::string health_listen;
  // A file holding the token SDK calls over TCP must bear (sdk_service.h);
  // empty: SDK calls over TCP are refused.
  std::string sdk_token_file;
  TlsFiles tls;
  absl::Duration operation_timeout = absl::Seconds(30);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // How long a step cut by a membership change waits for the new view.
  absl::Duration view_wait = absl::Seconds(5);
  // Peers that started a step this worker's trainer has not joined for this
  // long go on without it (TrainerWatch); zero: never.
  absl::Duration step_join_timeout = absl::Seconds(10);
  // A member of the view to which this worker has had frames
  // unacknowledged for this long, or which has refused its connections
  // that long, is reported unreachable with the heartbeats (the coordinator
  // removes the member most members name; server/link_reports.h); zero: never.
  absl::Duration link_timeout = absl::Seconds(10);
  // What one peer's messages may hold here (PeerService); 0 is refused.
  uint64_t peer_buffer_bytes = transport::PeerService::kDefaultHeldBytesPerPeer;
  // Where the algorithms' top-k selections run (--topk); null: the CPU.
  const kernels::TopKSelector* topk = nullptr;
};

class WorkerDaemon {
 public:
  // Binds the ports and starts following the coordinator (joining in the
  // background until it answers). InvalidArgument for bad options,
  // Unavailable if a port can't be bound.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Start(
      const DaemonOptions& options);

  virtual ~WorkerDaemon() = default;

  // Leaves the coordinator, fails requests in flight with Unavailable and
  // stops serving. Idempotent; the destructor calls it.
  virtual void Stop() = 0;

  virtual std::string address() const = 0;  // the advertised address
  // "unix:PATH" of the SDK socket, empty when there is none.
  virtual std::string sdk_address() const = 0;
  virtual int metrics_port() const = 0;  // 0 when /metrics is off
  virtual int health_port() const = 0;   // 0 when health checks are off
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_DAEMON_H_

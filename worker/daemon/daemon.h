// WorkerDaemon: gradmesh-worker, one per GPU node.
//
// It serves the peer exchange (PeerService) and the SDK-facing Worker
// service on one gRPC port, registers with the coordinator, follows its views
// (membership + plan), and runs each AllReduce request with the engine over a
// GrpcTransport of the current epoch. Residuals are kept per request shape
// (the tensors of a request are fused into one buffer) across epochs.
//
// Views: one that changes membership applies at once, failing an operation in
// flight with Aborted; a plan change of the same members applies from its
// start step, so that all members switch at the same step. Every request
// names its step (the client's), and the operation id is the step, so a
// worker that missed a step cannot shift the steps after it.
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

namespace gradmesh::daemon {

struct DaemonOptions {
  std::string listen = "127.0.0.1:0";  // peer + worker services; port 0 picks
  std::string advertise;       // address peers and clients dial; default: the
                               // listen host with the bound port
  std::string coordinator;     // host:port, required
  std::string node_id;         // default: the advertised address
  std::string metrics_listen;  // host:port for /metrics; empty: off
  TlsFiles tls;
  absl::Duration operation_timeout = absl::Seconds(30);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
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
  virtual int metrics_port() const = 0;     // 0 when /metrics is off
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_DAEMON_H_

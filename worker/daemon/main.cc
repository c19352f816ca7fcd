// gradmesh-worker: the worker daemon of one GPU node.
//
//   gradmesh-worker --coordinator=10.0.0.1:7700 --listen=0.0.0.0:7701
//       --advertise=10.0.0.2:7701 --metrics-listen=0.0.0.0:9101
//
// Every flag may also come from GRADMESH_WORKER_<FLAG> in the environment.
// SIGTERM or SIGINT: leave the coordinator and stop cleanly.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "common/cli.h"
#include "common/grpc/tls_flags.h"
#include "worker/daemon/daemon.h"
#include "worker/kernels/topk_choice.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7700",
          "coordinator address, host:port");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "address of the peer and worker services (port 0: any free port)");
ABSL_FLAG(std::string, advertise, "",
          "address others dial (default: the listen host and bound port)");
ABSL_FLAG(
    std::string, node_id, "",
    "stable identity; ranks sort by it (default: the advertised address)");
ABSL_FLAG(std::string, sdk_socket, "",
          "serve the SDK on this unix socket path (mode 0600); over TCP "
          "(--listen or --sdk-listen) it needs --sdk-token-file");
ABSL_FLAG(std::string, sdk_listen, "",
          "serve the SDK over TCP on this host:port instead of on --listen, "
          "so that a network policy can tell trainers from peers (empty: "
          "--listen)");
ABSL_FLAG(std::string, sdk_token_file, "",
          "file holding the token that SDK clients over TCP must give "
          "($GRADMESH_TOKEN); without one, only the unix socket serves the "
          "SDK");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus /metrics on host:port (empty: off)");
ABSL_FLAG(std::string, health_listen, "",
          "serve the gRPC health service in plaintext on host:port, for "
          "probes: service \"\" (live) and \"ready\" (a member of the "
          "current view) (empty: off)");
ABSL_FLAG(double, operation_timeout_s, 30,
          "an all-reduce that takes longer fails with DeadlineExceeded");
ABSL_FLAG(int, heartbeat_interval_ms, 500, "heartbeat period");
ABSL_FLAG(int, view_wait_ms, 5000,
          "a step cut by a membership change waits this long for the new "
          "view, then runs again there (more than the coordinator's "
          "--heartbeat-timeout-ms)");
ABSL_FLAG(double, link_timeout_s, 10,
          "a member of the view to which this worker has had frames "
          "unacknowledged, or which has refused its connections, for this "
          "long is reported unreachable to the coordinator, which removes "
          "the member most members name (a link that drops every packet or "
          "refuses connections; 0: never report)");
ABSL_FLAG(double, step_join_timeout_s, 10,
          "when the peers started a step this worker's trainer has not joined "
          "for this long, the worker steps out of the group and the others go "
          "on without it (as soon as they start it, when the trainer process "
          "died); the "
          "trainer's next call rejoins it and fails, so that every process "
          "registers again and broadcasts (0: never; "
          "raise it where one rank pauses longer between steps, e.g. to "
          "evaluate alone)");
ABSL_FLAG(int, peer_buffer_mib, 1024,
          "what one peer's messages may hold here in an epoch: those "
          "arriving, and those of operations this worker has not started "
          "(the oldest of which are dropped past it); a message that does not "
          "fit (with 64 bytes of overhead) is refused");
ABSL_FLAG(std::string, topk, "auto", gradmesh::kernels::kTopKFlagHelp);
ABSL_FLAG(std::string, port_file, "",
          "write the advertised address and metrics port here once serving "
          "(for scripts that start workers on port 0)");

namespace {

// Each registered bucket keeps its segment open (its client's lock is
// watched through it), besides the peers' sockets: the soft limit on open
// files (often 1024) goes up to the hard one.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 ||
      limit.rlim_cur >= limit.rlim_max) {
    return;
  }
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);  // best effort: the old limit stays
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("gradmesh-worker: the gradmesh worker daemon.");
  const auto args = gradmesh::ParseFlags(argc, argv, "GRADMESH_WORKER_");
  if (args.size() > 1) {
    std::fprintf(stderr, "gradmesh-worker: unexpected argument '%s'\n",
                 args[1].c_str());
    return 2;
  }
  // Before anything starts threads (the CUDA driver may): they inherit it.
  gradmesh::BlockTerminationSignals();
  RaiseOpenFileLimit();
  const absl::StatusOr<const gradmesh::kernels::TopKSelector*> topk =
      gradmesh::kernels::TopKNamed(absl::GetFlag(FLAGS_topk));
  if (!topk.ok()) {
    std::fprintf(stderr, "gradmesh-worker: %s\n",
                 std::string(topk.status().message()).c_str());
    return topk.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  gradmesh::KeepLargeBuffersWarm();

  const double timeout = absl::GetFlag(FLAGS_operation_timeout_s);
  auto daemon = gradmesh::daemon::WorkerDaemon::Start(
      {.listen = absl::GetFlag(FLAGS_listen),
       .advertise = absl::GetFlag(FLAGS_advertise),
       .coordinator = absl::GetFlag(FLAGS_coordinator),
       .node_id = absl::GetFlag(FLAGS_node_id),
       .metrics_listen = absl::GetFlag(FLAGS_metrics_listen),
       .sdk_socket = absl::GetFlag(FLAGS_sdk_socket),
       .sdk_listen = absl::GetFlag(FLAGS_sdk_listen),
       .health_listen = absl::GetFlag(FLAGS_health_listen),
       .sdk_token_file = absl::GetFlag(FLAGS_sdk_token_file),
       .tls = gradmesh::TlsFilesFromFlags(),
       .operation_timeout =
           timeout > 0 ? absl::Seconds(timeout) : absl::ZeroDuration(),
       .heartbeat_interval =
           absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms)),
       .view_wait = absl::Milliseconds(absl::GetFlag(FLAGS_view_wait_ms)),
       .step_join_timeout =
           absl::Seconds(absl::GetFlag(FLAGS_step_join_timeout_s)),
       .link_timeout = absl::Seconds(absl::GetFlag(FLAGS_link_timeout_s)),
       .peer_buffer_bytes =
           uint64_t(std::max(absl::GetFlag(FLAGS_peer_buffer_mib), 0)) << 20,
       .topk = *topk});
  if (!daemon.ok()) {
    std::fprintf(stderr, "gradmesh-worker: %s\n",
                 daemon.status().ToString().c_str());
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    gradmesh::WritePortFile(path, (*daemon)->address(),
                            (*daemon)->metrics_port());
  }
  gradmesh::AwaitTerminationSignal();
  (*daemon)->Stop();
  daemon->reset();
  gradmesh::ExitAfterShutdown(0);
}

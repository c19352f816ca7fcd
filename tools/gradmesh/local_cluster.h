// LocalCluster: a coordinator and P worker processes on 127.0.0.1 (or on
// emulated hosts, see below), for `gradmesh local` and the integration
// tests.
//
// Each process is started from its binary (gradmesh-coordinator,
// gradmesh-worker) on port 0 and reports its address through a port file in
// `work_dir`, where its log also goes; each worker serves the SDK on a unix
// socket there (sdk_address). Worker w has node id worker-ww, so its rank is
// w while all are members. Children get SIGTERM when the parent dies, so
// nothing outlives a killed launcher.
//
//   GM_ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start({.workers = 4}));
//   GM_RETURN_IF_ERROR(cluster->WaitForView(4, absl::Seconds(30)));
//   gradmesh::Client::Connect({.worker = cluster->sdk_address(0)});
//   cluster->Kill(2, SIGKILL);
//
// Emulated hosts (LocalClusterOptions::hosts): worker w runs in network
// namespace hosts[w].netns and serves its peers on hosts[w].ip, so that its
// peer traffic crosses whatever links join the namespaces (veth, tc). The
// SDK socket and shared memory still reach it from here.
//
// Not thread-safe, except that clients may be used from one thread each.
#ifndef GRADMESH_TOOLS_GRADMESH_LOCAL_CLUSTER_H_
#define GRADMESH_TOOLS_GRADMESH_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc/grpc_util.h"
#include "gradmesh/client.h"

namespace gradmesh::tools {

struct LocalClusterOptions {
  int workers = 4;
  std::string bin_dir;   // where the binaries are; empty: found (FindBinary)
  std::string work_dir;  // logs and port files; empty: a new temporary one,
                         // removed with the cluster (see KeepWorkDir)
  // Passed to the coordinator as --flag=value (e.g. {"algo", "spardl"}).
  std::vector<std::pair<std::string, std::string>> coordinator_flags;
  // Passed to every worker.
  std::vector<std::pair<std::string, std::string>> worker_flags;
  TlsFiles tls;  // given to every process and client when set
  absl::Duration start_timeout = absl::Seconds(30);
  // Empty: every worker on 127.0.0.1 here. Else one per worker: the
  // namespace (a name under /var/run/netns, as `ip netns add` makes; empty:
  // this one) and the address its peer and metrics services bind to there.
  struct Host {
    std::string netns;
    std::string ip;
    TlsFiles tls;  // its own certificate, naming `ip`; empty: the cluster's
  };
  std::vector<Host> hosts;
  // The coordinator's listen address host; with `hosts`, one that every
  // namespace reaches (e.g. the bridge's address here).
  std::string coordinator_host = "127.0.0.1";
  // A job on several nodes: the coordinator's "host:port" for the workers.
  // Started here, listening on that port of every interface, when
  // start_coordinator; else one that runs there already (another node's).
  std::string coordinator_address;
  bool start_coordinator = true;
  // Without `hosts`: the address the workers serve their peers on.
  std::string worker_ip = "127.0.0.1";
  // Put before each worker's node id ("worker-ww"): the ids sort as the
  // ranks go, so that "node001-" comes after every "node000-" worker.
  std::string node_prefix;
};

// The path of gradmesh binary `name`: in `bin_dir` if given; else next to
// this executable, in the build tree's layout, or on PATH. NotFound if none.
absl::StatusOr<std::string> FindBinary(const std::string& name,
                                       const std::string& bin_dir);

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      const LocalClusterOptions& options);
  ~LocalCluster();  // Stop()

  // Waits until every live worker is in one view of `members` members (or
  // more, with `or_more`).
  absl::Status WaitForView(int members, absl::Duration timeout,
                           bool or_more = false);

  int size() const { return static_cast<int>(workers_.size()); }
  // The worker's current plan (through its SDK socket).
  absl::StatusOr<gradmesh::Plan> GetPlan(int worker);
  // "unix:PATH" of worker `worker`'s SDK socket.
  const std::string& sdk_address(int worker) const {
    return workers_[worker].sdk_address;
  }
  const std::string& worker_address(int worker) const {
    return workers_[worker].address;
  }
  int worker_metrics_port(int worker) const {
    return workers_[worker].metrics_port;
  }
  const std::string& coordinator_address() const {
    return coordinator_.address;
  }
  int coordinator_metrics_port() const { return coordinator_.metrics_port; }
  const std::string& work_dir() const { return work_dir_; }
  std::string worker_log(int worker) const;
  // The log of the coordinator running now (a restarted one has its own).
  std::string coordinator_log() const;

  // Kills the coordinator (SIGKILL, as a crash would) and starts a new one on
  // the same address; returns once it serves.
  absl::Status RestartCoordinator();

  // Kills worker `worker` (SIGKILL) if it runs, and starts a new process in
  // its place (same flags and node id, a new port): a new incarnation.
  // Returns once it serves, or fails (after start_timeout at the most) with
  // the new process killed and reaped. The earlier process's log is kept as
  // previous_worker_log(worker, r), r counting this worker's restarts from 1.
  absl::Status RestartWorker(int worker);
  std::string previous_worker_log(int worker, int restart) const;
  // How many times RestartWorker has started worker `worker` again.
  int restarts(int worker) const { return workers_[worker].restarts; }

  // Sends `signal` to worker `worker`; for SIGKILL reaps it, and for SIGSTOP
  // returns once it has stopped (a stop takes effect when the process is
  // next scheduled, which on a loaded machine can be after it has run a
  // while longer), or reaps it if it had exited instead. False only when a
  // SIGSTOP showed no stop within 10 s (or the process had exited): the
  // caller's test would not test what it means to.
  bool Kill(int worker, int signal);
  // Kill's signals, to the coordinator (one this cluster started).
  bool SignalCoordinator(int signal);
  bool alive(int worker) const { return workers_[worker].pid > 0; }
  // Whether worker `worker`'s process has exited (reaping it if so).
  bool Exited(int worker);
  // Its wait status once reaped (Exited, Kill with SIGKILL, or Kill with
  // SIGSTOP that found it exited).
  int exit_status(int worker) const { return workers_[worker].exit_status; }

  // A temporary work_dir is removed with the cluster unless this is called
  // (when something failed and its logs matter).
  void KeepWorkDir() { keep_work_dir_ = true; }

  // SIGTERM to every process, SIGKILL to those still running after 10 s.
  // Returns OK when every process that was running exited with status 0.
  absl::Status Stop();

 private:
  struct Process {
    pid_t pid = -1;
    int exit_status = 0;  // once reaped
    std::string name;     // "coordinator", "worker-03"
    std::string address;
    int metrics_port = 0;
    std::string sdk_address;
    int restarts = 0;                          // RestartWorker's
    std::unique_ptr<gradmesh::Client> client;  // for status, made on demand
    struct {
      std::string binary;
      std::vector<std::string> args;  // Spawn's
      std::string netns;
    } start;  // how a worker was started, for RestartWorker
  };

  LocalCluster() = default;
  // `netns`: the network namespace the process runs in (empty: this one).
  absl::Status Spawn(const std::string& binary, const std::string& name,
                     std::vector<std::string> args, const std::string& netns,
                     Process* process);
  absl::Status AwaitPortFile(Process* process, absl::Time deadline);
  // Kill's work, for any process.
  bool Signal(Process& process, int signal);
  // Spawns the coordinator listening on `listen` and waits until it serves.
  absl::Status StartCoordinator(const std::string& listen, absl::Time deadline);
  // The work directory: options_.work_dir (made if absent) or a new
  // temporary one.
  absl::Status MakeWorkDir();
  // Spawns worker `w` (its port file awaited later).
  absl::Status StartWorker(int w, const std::string& binary);

  LocalClusterOptions options_;
  std::string work_dir_;
  bool temporary_work_dir_ = false;
  bool keep_work_dir_ = false;
  Process coordinator_;
  std::string coordinator_binary_;
  std::vector<std::string> coordinator_args_;  // all but --listen
  int coordinator_starts_ = 0;
  std::vector<Process> workers_;
};

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_LOCAL_CLUSTER_H_

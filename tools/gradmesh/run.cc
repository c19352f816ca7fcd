#include "tools/gradmesh/run.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/cli.h"
#include "common/status_macros.h"
#include "tools/gradmesh/node_link.h"
#include "tools/gradmesh/supervisor.h"

extern char** environ;

namespace gradmesh::tools {

namespace fs = std::filesystem;

namespace {

using Variables = std::vector<std::pair<std::string, std::string>>;

bool ExecutableFile(const std::string& path) {
  std::error_code error;
  return access(path.c_str(), X_OK) == 0 && !fs::is_directory(path, error);
}

// The file that execve runs for `name`: `name` itself when it has a '/',
// else the first executable file of that name on PATH (as execvp would).
absl::StatusOr<std::string> ResolveProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (ExecutableFile(name)) return name;
    return absl::NotFoundError(
        absl::StrCat("cannot execute ", name, ": not an executable file"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate =
        absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (ExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("cannot execute ", name, ": not found on PATH"));
}

std::string Absolute(const std::string& path) {
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  return path.empty() || error ? path : absolute.string();
}

// Where a copy runs in the job: the numbers of its variables.
struct Placement {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
};

// A TCP port free on 127.0.0.1 now, for torch.distributed's own rendezvous
// (as torchrun's MASTER_PORT); 0 if none could be found.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in address = {.sin_family = AF_INET,
                         .sin_port = 0,
                         .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

// What copy `at` finds in its environment besides this process's: the SDK's
// variables and torchrun's (for torch.distributed's env:// beside it).
Variables RankVariables(const RunOptions& options, const LocalCluster& cluster,
                        const std::string& job, const Placement& at) {
  const std::string rank = absl::StrCat(at.rank);
  const std::string local_rank = absl::StrCat(at.local_rank);
  const std::string size = absl::StrCat(at.world_size);
  Variables variables = {
      {"GRADMESH_WORKER", cluster.sdk_address(at.local_rank)},
      {"GRADMESH_JOB", job},
      {"GRADMESH_RANK", rank},
      {"GRADMESH_LOCAL_RANK", local_rank},
      {"GRADMESH_WORLD_SIZE", size},
      {"RANK", rank},
      {"LOCAL_RANK", local_rank},
      {"WORLD_SIZE", size},
      {"LOCAL_WORLD_SIZE", absl::StrCat(at.local_world_size)},
      {"MASTER_ADDR", at.master_addr},
      {"MASTER_PORT", absl::StrCat(at.master_port)}};
  const TlsFiles& tls = options.cluster.tls;
  if (tls.enabled()) {
    variables.push_back({"GRADMESH_TLS_CA", Absolute(tls.ca)});
    variables.push_back({"GRADMESH_TLS_CERT", Absolute(tls.cert)});
    variables.push_back({"GRADMESH_TLS_KEY", Absolute(tls.key)});
  }
  return variables;
}

// This process's environment, "NAME=value" each, with `variables` set.
std::vector<std::string> Environment(const Variables& variables) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view name =
        absl::string_view(*entry).substr(0, std::strcspn(*entry, "="));
    if (std::none_of(variables.begin(), variables.end(),
                     [&](const auto& v) { return v.first == name; })) {
      environment.emplace_back(*entry);
    }
  }
  for (const auto& [name, value] : variables) {
    environment.push_back(absl::StrCat(name, "=", value));
  }
  return environment;
}

// "worker R was killed by signal 9 (Killed) (its log: LOG)": how this
// node's worker `index` (rank R) ended.
std::string WorkerEnd(LocalCluster& cluster, int rank, int index,
                      const std::string& log) {
  return absl::StrCat("worker ", rank, " ",
                      Describe(cluster.exit_status(index)), " (its log: ", log,
                      ")");
}

// Stops the cluster after the copies, reports, and returns `code`, the
// job's exit status (`why`: another node's reason for it, if any).
int Finish(const Supervisor& supervisor, LocalCluster& cluster, int code,
           const std::string& why = "") {
  bool restarted = false;
  for (int w = 0; w < cluster.size(); ++w) restarted |= cluster.restarts(w) > 0;
  if (supervisor.failed() || !supervisor.lost().empty() || restarted) {
    cluster.KeepWorkDir();  // the logs it named stay
  }
  std::vector<int> lost;
  for (int index : supervisor.lost()) {
    lost.push_back(supervisor.rank_of(index));
    std::fprintf(
        stderr, "gradmesh run: %s\n",
        WorkerEnd(cluster, lost.back(), index, cluster.worker_log(index))
            .c_str());
  }
  if (const absl::Status stopped = cluster.Stop(); !stopped.ok()) {
    cluster.KeepWorkDir();
    std::fprintf(stderr, "gradmesh run: stopping the cluster: %s\n",
                 std::string(stopped.message()).c_str());
  }
  if (supervisor.failed()) {
    std::fprintf(stderr, "gradmesh run: %s (cluster logs kept in %s)\n",
                 supervisor.failure().c_str(), cluster.work_dir().c_str());
  } else if (!supervisor.interrupted() && lost.empty()) {
    std::fprintf(stderr, "gradmesh run: all %d processes exited 0\n",
                 cluster.size());
  } else if (!supervisor.interrupted()) {
    std::fprintf(stderr,
                 "gradmesh run: the other %zu processes exited 0; lost with "
                 "their workers: rank %s\n",
                 cluster.size() - lost.size(),
                 absl::StrJoin(lost, ", ").c_str());
  }
  if (code != supervisor.exit_code()) {
    std::fprintf(stderr, "gradmesh run: the job ends with status %d%s%s\n",
                 code, why.empty() ? "" : ": ", why.c_str());
  }
  return code;
}

// Starts this node's worker `index` (rank `rank`) again after it was seen
// gone, saying how it ended.
absl::Status RestartWorker(LocalCluster& cluster, int rank, int index) {
  const std::string log =
      cluster.previous_worker_log(index, cluster.restarts(index) + 1);
  std::fprintf(stderr, "gradmesh run: %s; starting it again\n",
               WorkerEnd(cluster, rank, index, log).c_str());
  return cluster.RestartWorker(index);
}

// Runs the copies on a started cluster, copy i at placements[i]; returns
// the job's exit status.
int Supervise(const RunOptions& options, const std::string& program,
              int signal_fd, LocalCluster& cluster, const std::string& job,
              const std::vector<Placement>& placements, NodeLink* link) {
  std::fprintf(stderr,
               "gradmesh run: cluster up (logs in %s); starting %zu copies "
               "of: %s\n",
               cluster.work_dir().c_str(), placements.size(),
               absl::StrJoin(options.command, " ").c_str());
  std::vector<std::string> workers;
  for (int w = 0; w < cluster.size(); ++w) {
    workers.push_back(absl::StrCat(cluster.worker_metrics_port(w)));
  }
  if (cluster.coordinator_metrics_port() != 0) {
    std::fprintf(stderr,
                 "gradmesh run: /metrics at http://127.0.0.1:%d/metrics "
                 "(coordinator), workers on ports %s\n",
                 cluster.coordinator_metrics_port(),
                 absl::StrJoin(workers, ", ").c_str());
  } else {  // another node's coordinator
    std::fprintf(stderr, "gradmesh run: /metrics of the workers on ports %s\n",
                 absl::StrJoin(workers, ", ").c_str());
  }
  std::vector<std::vector<std::string>> environments;
  std::vector<int> ranks;
  for (const Placement& at : placements) {
    environments.push_back(
        Environment(RankVariables(options, cluster, job, at)));
    ranks.push_back(at.rank);
  }
  Supervisor supervisor(
      signal_fd, ranks, [&cluster](int index) { return cluster.Exited(index); },
      link,
      {.max_restarts = options.max_restarts, .min_copies = options.min_np},
      [&cluster, &ranks](int index) {
        return RestartWorker(cluster, ranks[index], index);
      });
  supervisor.StartAll(program, options.command, std::move(environments));
  supervisor.Wait();
  const int code = link == nullptr
                       ? supervisor.exit_code()
                       : link->Finish(supervisor.exit_code(), signal_fd);
  return Finish(supervisor, cluster, code, link == nullptr ? "" : link->why());
}

// The cluster's start, or why it failed (its logs kept).
absl::StatusOr<std::unique_ptr<LocalCluster>> StartCluster(
    const LocalClusterOptions& options) {
  std::fprintf(stderr, "gradmesh run: starting %s%d workers\n",
               options.start_coordinator ? "a coordinator and " : "",
               options.workers);
  return LocalCluster::Start(options);
}

// Waits for the job's first full view of `members`.
absl::Status AwaitView(LocalCluster& cluster, int members,
                       absl::Duration timeout, bool or_more = false) {
  const absl::Status view = cluster.WaitForView(members, timeout, or_more);
  if (view.ok()) return view;
  cluster.KeepWorkDir();
  return absl::Status(view.code(), absl::StrCat(view.message(), "; logs in ",
                                                cluster.work_dir()));
}

// One host: P workers here and P copies, ranks 0..P-1.
absl::Status RunHere(const RunOptions& options, const std::string& program,
                     int signal_fd, int* code) {
  GM_ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster,
                      StartCluster(options.cluster));
  GM_RETURN_IF_ERROR(
      AwaitView(*cluster, options.cluster.workers, options.start_timeout));
  const std::string job = options.job.empty()
                              ? absl::StrCat("run-", getpid(), "-",
                                             absl::ToUnixSeconds(absl::Now()))
                              : options.job;
  const int size = cluster->size();
  std::vector<Placement> placements;
  const int master_port = FreePort();
  for (int r = 0; r < size; ++r) {
    placements.push_back({.rank = r,
                          .local_rank = r,
                          .world_size = size,
                          .local_world_size = size,
                          .master_port = master_port});
  }
  *code = Supervise(options, program, signal_fd, *cluster, job, placements,
                    nullptr);
  return absl::OkStatus();
}

// Whether something accepts TCP connections at host:port (a coordinator
// that runs already).
bool Answers(const std::string& host, int port) {
  const absl::StatusOr<int> fd = ConnectTcp(host, port);
  if (fd.ok()) close(*fd);
  return fd.ok();
}

// The address of this host's interface toward `host` (the route a UDP
// socket would take), for peers on other nodes to reach.
absl::StatusOr<std::string> AddressToward(const std::string& host) {
  addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM};
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), "9", &hints, &found);
      error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local = {};
  socklen_t length = sizeof(local);
  const bool routed =
      fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  freeaddrinfo(found);
  if (fd >= 0) close(fd);
  char text[INET_ADDRSTRLEN] = {};
  if (!routed ||
      inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no route to ", host, " found; pass --host=THIS_NODE'S_ADDRESS"));
  }
  return std::string(text);
}

// This node's cluster for a job on several nodes whose coordinator is at
// host:port.
absl::StatusOr<LocalClusterOptions> NodeCluster(const RunOptions& options,
                                                const std::string& host) {
  LocalClusterOptions cluster = options.cluster;
  cluster.coordinator_address = options.coordinator;
  cluster.node_prefix = absl::StrFormat("node%03d-", options.node_rank);
  if (options.host.empty()) {
    GM_ASSIGN_OR_RETURN(cluster.worker_ip, AddressToward(host));
  } else {
    cluster.worker_ip = options.host;
  }
  // A host name that resolves to loopback here would hide node 0's
  // workers from the other nodes.
  if (absl::StartsWith(cluster.worker_ip, "127.") &&
      !absl::StartsWith(host, "127.") && host != "localhost") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the coordinator ", host,
        " is reached through loopback here, so the other nodes could not "
        "reach this one's workers: give --coordinator an address the other "
        "nodes reach, or --host"));
  }
  return cluster;
}

// The launchers linked and this node's cluster started (into *cluster):
// node 0 takes the link's port first (a second job on this coordinator
// stops there, before its workers could take the first one's names), then
// starts its cluster and waits for the others; another node joins node 0
// first, then starts its workers.
absl::StatusOr<std::unique_ptr<NodeLink>> LinkUp(
    const RunOptions& options, const std::string& host, int port,
    LocalClusterOptions cluster_options, absl::Time deadline, int signal_fd,
    std::unique_ptr<LocalCluster>* cluster) {
  const NodeLink::Shape shape = {.nodes = options.nodes,
                                 .per_node = cluster_options.workers,
                                 .min_copies = options.min_np,
                                 .min_nodes = options.min_nodes};
  if (options.node_rank != 0) {
    GM_ASSIGN_OR_RETURN(auto link,
                        NodeLink::Join(host, port + 1, options.node_rank, shape,
                                       deadline, signal_fd));
    if (!options.job.empty() && options.job != link->job()) {
      std::fprintf(stderr,
                   "gradmesh run: --job=%s is not node 0's; the job is %s\n",
                   options.job.c_str(), link->job().c_str());
    }
    cluster_options.start_coordinator = false;
    GM_ASSIGN_OR_RETURN(*cluster, StartCluster(cluster_options));
    return link;
  }
  GM_ASSIGN_OR_RETURN(auto link, NodeLink::Listen(port + 1));
  cluster_options.start_coordinator = !Answers(host, port);
  GM_ASSIGN_OR_RETURN(*cluster, StartCluster(cluster_options));
  if (options.min_nodes > 0 && options.min_nodes < options.nodes) {
    std::fprintf(stderr,
                 "gradmesh run: waiting for up to %d more nodes on port %d "
                 "(the job starts with %d or more, %d s after the last)\n",
                 options.nodes - 1, port + 1, options.min_nodes,
                 static_cast<int>(absl::ToInt64Seconds(options.last_call)));
  } else {
    std::fprintf(stderr, "gradmesh run: waiting for %d more nodes on port %d\n",
                 options.nodes - 1, port + 1);
  }
  const std::string job = options.job.empty()
                              ? absl::StrCat("run-", options.coordinator, "-",
                                             absl::ToUnixSeconds(absl::Now()))
                              : options.job;
  if (absl::Status joined =
          link->AwaitNodes(shape, job, deadline, options.last_call, signal_fd);
      !joined.ok()) {
    (*cluster)->KeepWorkDir();
    return absl::Status(
        joined.code(),
        absl::StrCat(joined.message(), "; logs in ", (*cluster)->work_dir()));
  }
  return link;
}

// Why no copy starts on this node, if so: a termination signal (the node
// leaves the job, NodeLink::Leave), another node's failure, or the job
// already over (a node that came late).
std::optional<NodeLink::Stop> StopBeforeTheCopies(NodeLink& link,
                                                  int signal_fd) {
  if (SignalPending(signal_fd)) {
    link.Leave();
    return NodeLink::Stop{.why = "interrupted while starting", .code = 130};
  }
  if (std::optional<NodeLink::Stop> stop = link.Poll()) return stop;
  if (link.ended()) return NodeLink::Stop{.why = "the job is over", .code = 0};
  return std::nullopt;
}

// The first view this node's copies start in: every node's workers as node
// 0 counted them (NodeLink::members). While nodes may be lost, more are
// welcome (a node joining meanwhile), the wait has its own start timeout
// (the last call may have used the link's), and a node that joined but whose
// workers never came does not stop the job: after the timeout, any view with
// this node's workers will do. The link and signals are answered every
// kFirstViewSlice meanwhile: returns why no copy starts, if so
// (StopBeforeTheCopies), or nullopt once the view is there.
constexpr absl::Duration kFirstViewSlice = absl::Milliseconds(250);
absl::StatusOr<std::optional<NodeLink::Stop>> AwaitFirstView(
    const RunOptions& options, NodeLink& link, LocalCluster& cluster,
    absl::Time deadline, int signal_fd) {
  const bool may_lose = link.nodes_may_be_lost();
  const absl::Time until =
      may_lose ? absl::Now() + options.start_timeout : deadline;
  bool viewed = false;
  while (true) {
    if (std::optional<NodeLink::Stop> stop =
            StopBeforeTheCopies(link, signal_fd)) {
      return stop;
    }
    if (viewed) return std::nullopt;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    viewed = cluster
                 .WaitForView(link.members(), std::min(left, kFirstViewSlice),
                              /*or_more=*/may_lose)
                 .ok();
  }
  if (!may_lose) {  // the error, with the logs kept
    GM_RETURN_IF_ERROR(
        AwaitView(cluster, link.members(), absl::ZeroDuration()));
    return std::nullopt;
  }
  std::fprintf(stderr,
               "gradmesh run: the workers did not form a view of %d or more "
               "members in time; starting with the view this node's are in\n",
               link.members());
  GM_RETURN_IF_ERROR(AwaitView(cluster, cluster.size(), absl::Seconds(1),
                               /*or_more=*/true));
  return std::nullopt;
}

// This node's workers' plans, all of one view (views change while nodes
// join: each copy's rank and world size must come from the same one).
absl::StatusOr<std::vector<gradmesh::Plan>> OneViewsPlans(
    LocalCluster& cluster) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    std::vector<gradmesh::Plan> plans;
    for (int w = 0; w < cluster.size(); ++w) {
      GM_ASSIGN_OR_RETURN(plans.emplace_back(), cluster.GetPlan(w));
    }
    if (std::all_of(plans.begin(), plans.end(), [&](const auto& plan) {
          return plan.epoch == plans.front().epoch;
        })) {
      return plans;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          "this node's workers did not settle in one view");
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// Node `node_rank` of several: its workers join the coordinator at
// options.coordinator (node 0 starts it), the launchers link up, and each
// copy's rank is its worker's in the first view with every node in the job
// when this one entered it (or more: a node may join meanwhile).
absl::Status RunOnNodes(const RunOptions& options, const std::string& program,
                        int signal_fd, int* code) {
  const absl::Time deadline = absl::Now() + options.start_timeout;
  const size_t colon = options.coordinator.rfind(':');
  const std::string host = options.coordinator.substr(0, colon);
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(options.coordinator.substr(colon + 1), &port) ||
      port <= 0 || port > 65533) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator=", options.coordinator,
                     " is not HOST:PORT (PORT at most 65533: the next two "
                     "are the launchers' and MASTER_PORT)"));
  }
  GM_ASSIGN_OR_RETURN(const LocalClusterOptions cluster_options,
                      NodeCluster(options, host));
  std::unique_ptr<LocalCluster> cluster;
  GM_ASSIGN_OR_RETURN(const std::unique_ptr<NodeLink> link,
                      LinkUp(options, host, port, cluster_options, deadline,
                             signal_fd, &cluster));
  const int local = cluster->size();
  GM_ASSIGN_OR_RETURN(
      const std::optional<NodeLink::Stop> stop,
      AwaitFirstView(options, *link, *cluster, deadline, signal_fd));
  if (stop) {
    std::string why = stop->why;
    if (stop->code != 0) {
      cluster->KeepWorkDir();
      absl::StrAppend(&why, " (logs in ", cluster->work_dir(), ")");
    }
    std::fprintf(stderr, "gradmesh run: no process starts here: %s\n",
                 why.c_str());
    *code = link->Finish(stop->code, signal_fd);
    return absl::OkStatus();
  }
  GM_ASSIGN_OR_RETURN(const std::vector<gradmesh::Plan> plans,
                      OneViewsPlans(*cluster));
  std::vector<Placement> placements;
  for (int w = 0; w < local; ++w) {
    const gradmesh::Plan& plan = plans[w];
    placements.push_back({.rank = plan.rank,
                          .local_rank = w,
                          .world_size = plan.world_size,
                          .local_world_size = local,
                          .master_addr = host,
                          .master_port = options.master_port != 0
                                             ? options.master_port
                                             : port + 2});
  }
  *code = Supervise(options, program, signal_fd, *cluster, link->job(),
                    placements, link.get());
  return absl::OkStatus();
}

}  // namespace

int RunCommand(const RunOptions& options) {
  if (options.command.empty()) {
    std::fprintf(stderr, "gradmesh run: no command to run\n");
    return 2;
  }
  const absl::StatusOr<std::string> program =
      ResolveProgram(options.command[0]);
  if (!program.ok()) {
    std::fprintf(stderr, "gradmesh run: %s\n",
                 std::string(program.status().message()).c_str());
    return 127;
  }
  BlockTerminationSignals();
  const int signal_fd = TerminationSignalFd();
  if (signal_fd < 0) {
    std::fprintf(stderr, "gradmesh run: signalfd: %s\n", std::strerror(errno));
    return 1;
  }
  int code = 1;
  const absl::Status ran = options.nodes > 1
                               ? RunOnNodes(options, *program, signal_fd, &code)
                               : RunHere(options, *program, signal_fd, &code);
  // Ctrl-C stops the daemons. The link's waits read the signal themselves
  // and end Cancelled.
  if (!ran.ok() && (absl::IsCancelled(ran) || SignalPending(signal_fd))) {
    std::fprintf(stderr, "gradmesh run: %s\n",
                 absl::IsCancelled(ran) ? std::string(ran.message()).c_str()
                                        : "interrupted while starting");
    code = 130;
  } else if (!ran.ok()) {
    std::fprintf(stderr, "gradmesh run: %s\n",
                 std::string(ran.message()).c_str());
  }
  close(signal_fd);
  return code;
}

}  // namespace gradmesh::tools

#include "tools/gradmesh/local_cluster.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/cli.h"
#include "common/status_macros.h"

namespace gradmesh::tools {

namespace fs = std::filesystem;

namespace {

bool Executable(const fs::path& path) {
  return access(path.c_str(), X_OK) == 0 && fs::is_regular_file(path);
}

// The last lines of a log, for error messages.
std::string Tail(const std::string& path, int lines = 5) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > static_cast<size_t>(lines) ? all.size() - lines
                                                          : 0;
       i < all.size(); ++i) {
    absl::StrAppend(&out, "\n  ", all[i]);
  }
  return out;
}

// --tls_ca, --tls_cert and --tls_key for `tls`, if it is enabled.
void AppendTlsArgs(const TlsFiles& tls, std::vector<std::string>* args) {
  if (!tls.enabled()) return;
  args->push_back(absl::StrCat("--tls_ca=", tls.ca));
  args->push_back(absl::StrCat("--tls_cert=", tls.cert));
  args->push_back(absl::StrCat("--tls_key=", tls.key));
}

}  // namespace

absl::StatusOr<std::string> FindBinary(const std::string& name,
                                       const std::string& bin_dir) {
  if (!bin_dir.empty()) {
    const fs::path path = fs::path(bin_dir) / name;
    if (Executable(path)) return path.string();
    return absl::NotFoundError(
        absl::StrCat(name, " is not in --bin-dir ", bin_dir));
  }
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  std::vector<fs::path> candidates;
  if (!error) {
    const fs::path dir = self.parent_path();
    candidates.push_back(dir / name);
    // The build tree: build/tools/gradmesh/gradmesh or build/bench/...
    // next to build/worker/daemon/gradmesh-worker and build/server/....
    for (const fs::path& root :
         {dir.parent_path().parent_path(), dir.parent_path()}) {
      candidates.push_back(root / "worker" / "daemon" / name);
      candidates.push_back(root / "server" / name);
    }
  }
  if (const char* path = std::getenv("PATH")) {
    for (absl::string_view dir : absl::StrSplit(path, ':')) {
      if (!dir.empty()) candidates.push_back(fs::path(std::string(dir)) / name);
    }
  }
  for (const fs::path& candidate : candidates) {
    if (Executable(candidate)) return candidate.string();
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find ", name,
                   " next to this program, in the build tree or on "
                   "PATH; build it or pass --bin-dir"));
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  if (options.workers < 1 || options.workers > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a local cluster has 1..64 workers, not ", options.workers));
  }
  if (!options.hosts.empty() &&
      static_cast<int>(options.hosts.size()) != options.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.hosts.size(), " hosts for ", options.workers,
                     " workers: give one per worker"));
  }
  GM_ASSIGN_OR_RETURN(const std::string coordinator_binary,
                      FindBinary("gradmesh-coordinator", options.bin_dir));
  GM_ASSIGN_OR_RETURN(const std::string worker_binary,
                      FindBinary("gradmesh-worker", options.bin_dir));
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->options_ = options;
  GM_RETURN_IF_ERROR(cluster->MakeWorkDir());
  const absl::Time deadline = absl::Now() + options.start_timeout;

  const std::string& chost = options.coordinator_host;
  std::vector<std::string> args = {
      absl::StrCat("--metrics_listen=", chost, ":0")};
  for (const auto& [flag, value] : options.coordinator_flags) {
    args.push_back(absl::StrCat("--", flag, "=", value));
  }
  AppendTlsArgs(options.tls, &args);
  cluster->coordinator_binary_ = coordinator_binary;
  cluster->coordinator_args_ = args;
  if (options.coordinator_address.empty()) {
    GM_RETURN_IF_ERROR(
        cluster->StartCoordinator(absl::StrCat(chost, ":0"), deadline));
  } else {
    if (options.start_coordinator) {
      const size_t colon = options.coordinator_address.rfind(':');
      GM_RETURN_IF_ERROR(cluster->StartCoordinator(
          absl::StrCat("0.0.0.0", options.coordinator_address.substr(colon)),
          deadline));
    }
    cluster->coordinator_.address = options.coordinator_address;
  }

  cluster->workers_.resize(options.workers);
  for (int w = 0; w < options.workers; ++w) {
    GM_RETURN_IF_ERROR(cluster->StartWorker(w, worker_binary));
  }
  for (Process& worker : cluster->workers_) {
    GM_RETURN_IF_ERROR(cluster->AwaitPortFile(&worker, deadline));
  }
  return cluster;
}

absl::Status LocalCluster::MakeWorkDir() {
  if (options_.work_dir.empty()) {
    std::string pattern =
        (fs::temp_directory_path() / "gradmesh-local-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("mkdtemp: ", std::strerror(errno)));
    }
    work_dir_ = pattern;
    temporary_work_dir_ = true;
    return absl::OkStatus();
  }
  std::error_code error;
  fs::create_directories(options_.work_dir, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot create ", options_.work_dir, ": ", error.message()));
  }
  work_dir_ = options_.work_dir;
  return absl::OkStatus();
}

absl::Status LocalCluster::StartWorker(int w, const std::string& binary) {
  const std::string name =
      absl::StrFormat("%sworker-%02d", options_.node_prefix, w);
  const std::string socket =
      (fs::absolute(work_dir_) / (name + ".sock")).string();
  if (socket.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the work directory's path is too long for a unix socket: ", socket));
  }
  workers_[w].sdk_address = absl::StrCat("unix:", socket);
  const LocalClusterOptions::Host host =
      options_.hosts.empty() ? LocalClusterOptions::Host{"", options_.worker_ip}
                             : options_.hosts[w];
  std::vector<std::string> args = {
      absl::StrCat("--listen=", host.ip, ":0"),
      absl::StrCat("--metrics_listen=", host.ip, ":0"),
      absl::StrCat("--coordinator=", coordinator_.address),
      absl::StrCat("--node_id=", name), absl::StrCat("--sdk_socket=", socket)};
  for (const auto& [flag, value] : options_.worker_flags) {
    args.push_back(absl::StrCat("--", flag, "=", value));
  }
  AppendTlsArgs(host.tls.enabled() ? host.tls : options_.tls, &args);
  workers_[w].start = {binary, args, host.netns};
  return Spawn(binary, name, args, host.netns, &workers_[w]);
}

absl::Status LocalCluster::Spawn(const std::string& binary,
                                 const std::string& name,
                                 std::vector<std::string> args,
                                 const std::string& netns, Process* process) {
  process->name = name;
  const std::string log = (fs::path(work_dir_) / (name + ".log")).string();
  const std::string port_file =
      (fs::path(work_dir_) / (name + ".port")).string();
  std::remove(port_file.c_str());
  args.insert(args.begin(), binary);
  args.push_back(absl::StrCat("--port_file=", port_file));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string netns_path =
      netns.empty() ? "" : absl::StrCat("/var/run/netns/", netns);
  const std::string netns_error =
      absl::StrCat("cannot enter network namespace ", netns_path,
                   " (it must exist, and setns needs root)\n");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // The child: die with the launcher, log to a file, run the binary.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    if (!netns_path.empty()) {
      const int ns = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
        // Only async-signal-safe calls after fork.
        (void)!write(STDERR_FILENO, netns_error.data(), netns_error.size());
        _exit(126);
      }
      close(ns);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  process->pid = pid;
  return absl::OkStatus();
}

absl::Status LocalCluster::AwaitPortFile(Process* process,
                                         absl::Time deadline) {
  const std::string port_file =
      (fs::path(work_dir_) / (process->name + ".port")).string();
  const std::string log =
      (fs::path(work_dir_) / (process->name + ".log")).string();
  while (true) {
    const PortFile file = ReadPortFile(port_file);
    if (!file.address.empty()) {
      process->address = file.address;
      process->metrics_port = file.metrics_port;
      return absl::OkStatus();
    }
    if (waitpid(process->pid, &process->exit_status, WNOHANG) == process->pid) {
      process->pid = -1;
      return absl::UnavailableError(absl::StrCat(
          process->name, " exited before serving; its log ", log, Tail(log)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          process->name, " did not start in time; its log ", log, Tail(log)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<gradmesh::Plan> LocalCluster::GetPlan(int worker) {
  Process& p = workers_[worker];
  if (p.client == nullptr) {
    // Connect waits up to 2 s for membership; WaitForView asks again.
    auto client = gradmesh::Client::Connect(
        {.worker = p.sdk_address, .job = "local", .timeout = absl::Seconds(2)});
    if (!client.ok()) return client.status();
    p.client = *std::move(client);
  }
  return p.client->GetPlan();
}

absl::Status LocalCluster::WaitForView(int members, absl::Duration timeout,
                                       bool or_more) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (true) {
    uint64_t epoch = 0;
    bool agreed = true;
    for (int w = 0; w < size() && agreed; ++w) {
      if (workers_[w].pid <= 0) continue;
      absl::StatusOr<gradmesh::Plan> plan = GetPlan(w);
      agreed = plan.ok() &&
               (plan->world_size == members ||
                (or_more && plan->world_size > members)) &&
               plan->rank >= 0 && (epoch == 0 || plan->epoch == epoch);
      if (!agreed) {
        last = plan.ok() ? absl::StrCat(workers_[w].name, " is in epoch ",
                                        plan->epoch, " of ", plan->world_size,
                                        " members")
                         : absl::StrCat(workers_[w].name, ": ",
                                        plan.status().ToString());
      } else {
        epoch = plan->epoch;
      }
    }
    if (agreed) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the workers did not form a view of ", members,
          or_more ? " or more" : "", " members in time (", last, ")"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::string LocalCluster::worker_log(int worker) const {
  return (fs::path(work_dir_) / (workers_[worker].name + ".log")).string();
}

std::string LocalCluster::coordinator_log() const {
  return (fs::path(work_dir_) / (coordinator_.name + ".log")).string();
}

absl::Status LocalCluster::StartCoordinator(const std::string& listen,
                                            absl::Time deadline) {
  std::vector<std::string> args = coordinator_args_;
  args.push_back(absl::StrCat("--listen=", listen));
  const std::string name =
      coordinator_starts_ == 0
          ? "coordinator"
          : absl::StrCat("coordinator-", coordinator_starts_ + 1);
  ++coordinator_starts_;
  GM_RETURN_IF_ERROR(
      Spawn(coordinator_binary_, name, std::move(args), "", &coordinator_));
  return AwaitPortFile(&coordinator_, deadline);
}

absl::Status LocalCluster::RestartCoordinator() {
  if (coordinator_.pid > 0) {
    kill(coordinator_.pid, SIGKILL);
    waitpid(coordinator_.pid, nullptr, 0);
    coordinator_.pid = -1;
  }
  return StartCoordinator(coordinator_.address,
                          absl::Now() + options_.start_timeout);
}

absl::Status LocalCluster::RestartWorker(int worker) {
  Kill(worker, SIGKILL);
  Process& p = workers_[worker];
  p.client.reset();
  // Keep the earlier processes' logs beside the new one's.
  const std::string log = worker_log(worker);
  std::rename(log.c_str(), previous_worker_log(worker, ++p.restarts).c_str());
  GM_RETURN_IF_ERROR(
      Spawn(p.start.binary, p.name, p.start.args, p.start.netns, &p));
  const absl::Status serving =
      AwaitPortFile(&p, absl::Now() + options_.start_timeout);
  if (!serving.ok()) Kill(worker, SIGKILL);  // none half started stays
  return serving;
}

std::string LocalCluster::previous_worker_log(int worker, int restart) const {
  return absl::StrCat(worker_log(worker), ".", restart);
}

bool LocalCluster::Exited(int worker) {
  Process& p = workers_[worker];
  if (p.pid > 0 && waitpid(p.pid, &p.exit_status, WNOHANG) == p.pid) {
    p.pid = -1;
  }
  return p.pid <= 0;
}

bool LocalCluster::Kill(int worker, int signal) {
  return Signal(workers_[worker], signal);
}

bool LocalCluster::SignalCoordinator(int signal) {
  return Signal(coordinator_, signal);
}

bool LocalCluster::Signal(Process& p, int signal) {
  if (p.pid <= 0) return signal != SIGSTOP;
  kill(p.pid, signal);
  if (signal == SIGKILL) {
    waitpid(p.pid, &p.exit_status, 0);
    p.pid = -1;
  } else if (signal == SIGSTOP) {
    // Polled with a bound: a process stopped before reports no new stop.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(p.pid, &status, WNOHANG | WUNTRACED)) == 0 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (got == p.pid && !WIFSTOPPED(status)) {
      p.exit_status = status;  // it had exited: reaped now
      p.pid = -1;
    }
    return got == p.pid && WIFSTOPPED(status);
  }
  return true;
}

absl::Status LocalCluster::Stop() {
  std::vector<Process*> running;
  for (Process& w : workers_) {
    if (w.pid > 0) running.push_back(&w);
  }
  // Workers first, so that they can leave the coordinator.
  for (Process* p : running) kill(p->pid, SIGTERM);
  absl::Status result;
  auto reap = [&](Process* p) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    int status = 0;
    while (waitpid(p->pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &status, 0);
        result.Update(absl::DeadlineExceededError(
            absl::StrCat(p->name, " ignored SIGTERM for 10 s; killed")));
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      result.Update(absl::InternalError(
          absl::StrCat(p->name, " exited with status ", WEXITSTATUS(status))));
    } else if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL) {
      result.Update(absl::InternalError(
          absl::StrCat(p->name, " died of signal ", WTERMSIG(status))));
    }
    p->pid = -1;
  };
  for (Process* p : running) reap(p);
  if (coordinator_.pid > 0) {
    kill(coordinator_.pid, SIGTERM);
    reap(&coordinator_);
  }
  return result;
}

LocalCluster::~LocalCluster() {
  Stop().IgnoreError();
  if (temporary_work_dir_ && !keep_work_dir_) {
    std::error_code ignored;
    fs::remove_all(work_dir_, ignored);
  }
}

}  // namespace gradmesh::tools

#include "tools/gradmesh/run.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/cli.h"
#include "common/status_macros.h"

extern char** environ;

namespace gradmesh::tools {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxLine = 64 << 10;  // longer lines are cut
constexpr absl::Duration kKillAfter = absl::Seconds(10);
constexpr absl::Duration kTick = absl::Milliseconds(100);
// How long a copy that failed waits for its worker to be seen gone (it may
// refuse connections a moment before it can be reaped) before it counts as
// failed.
constexpr absl::Duration kWorkerGoneGrace = absl::Seconds(3);

using Variables = std::vector<std::pair<std::string, std::string>>;

// One pipe from a copy, forwarded line by line with the copy's prefix.
struct Stream {
  int fd = -1;  // the pipe's read end (non-blocking); -1 once closed
  int target = STDOUT_FILENO;
  std::string prefix;   // "[r] "
  std::string pending;  // output not forwarded yet: the start of a line
};

struct Copy {
  int rank = 0;
  pid_t pid = -1;  // also its process group; -1 before start and once reaped
  Stream out;
  Stream err;
};

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone; nothing better to do
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Writes the complete lines of `stream.pending` to its target in one write,
// each prefixed; with `all`, the unterminated rest too (given a newline).
void EmitLines(Stream& stream, bool all) {
  std::string out;
  absl::string_view rest = stream.pending;
  while (!rest.empty()) {
    size_t take = rest.find('\n');
    if (take != absl::string_view::npos) {
      ++take;
    } else if (all || rest.size() >= kMaxLine) {
      take = std::min(rest.size(), kMaxLine);
    } else {
      break;
    }
    absl::StrAppend(&out, stream.prefix, rest.substr(0, take));
    if (out.back() != '\n') out.push_back('\n');
    rest.remove_prefix(take);
  }
  stream.pending.erase(0, stream.pending.size() - rest.size());
  WriteAll(stream.target, out);
}

// Reads from `stream` once, or until its pipe is empty with `until_empty`,
// forwarding complete lines; at end of file forwards the rest and closes it.
void Pump(Stream& stream, bool until_empty) {
  char buffer[1 << 16];
  while (stream.fd >= 0) {
    const ssize_t n = read(stream.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n > 0) {
      stream.pending.append(buffer, static_cast<size_t>(n));
      EmitLines(stream, /*all=*/false);
      if (!until_empty) return;
      continue;
    }
    EmitLines(stream, /*all=*/true);
    close(stream.fd);
    stream.fd = -1;
  }
}

// Forwards what is left in `stream` and closes it, even if some grandchild
// still holds the pipe's write end.
void Close(Stream& stream) {
  Pump(stream, /*until_empty=*/true);
  if (stream.fd < 0) return;
  EmitLines(stream, /*all=*/true);
  close(stream.fd);
  stream.fd = -1;
}

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

// What copy `rank` finds in its environment besides this process's: the
// SDK's variables and torchrun's (for torch.distributed's env:// beside it).
Variables RankVariables(const RunOptions& options, const LocalCluster& cluster,
                        const std::string& job, int rank, int master_port) {
  const std::string size = absl::StrCat(cluster.size());
  Variables variables = {{"GRADMESH_WORKER", cluster.sdk_address(rank)},
                         {"GRADMESH_JOB", job},
                         {"GRADMESH_RANK", absl::StrCat(rank)},
                         {"GRADMESH_LOCAL_RANK", absl::StrCat(rank)},
                         {"GRADMESH_WORLD_SIZE", size},
                         {"RANK", absl::StrCat(rank)},
                         {"LOCAL_RANK", absl::StrCat(rank)},
                         {"WORLD_SIZE", size},
                         {"LOCAL_WORLD_SIZE", size},
                         {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", absl::StrCat(master_port)}};
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

// A null-terminated array pointing into `strings`, for execve.
std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// The forked child, up to execve: only async-signal-safe calls from here.
[[noreturn]] void ExecCopy(pid_t parent, int out, int err, const char* program,
                           char** argv, char** envp) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(128 + SIGTERM);
  setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null = open("/dev/null", O_RDONLY);
  if (null >= 0 && null != STDIN_FILENO) {
    dup2(null, STDIN_FILENO);
    close(null);
  }
  dup2(out, STDOUT_FILENO);  // the pipes close on exec; their copies don't
  dup2(err, STDERR_FILENO);
  execve(program, argv, envp);
  const char* reason = strerrordesc_np(errno);
  for (const char* part : {"gradmesh run: cannot execute ", program, ": ",
                           reason != nullptr ? reason : "error", "\n"}) {
    if (write(STDERR_FILENO, part, std::strlen(part)) < 0) break;
  }
  _exit(127);
}

// Starts `program` with `args` (args[0] first) and `environment` as copy
// `copy->rank`, its output into two pipes.
absl::Status Spawn(const std::string& program, std::vector<std::string> args,
                   std::vector<std::string> environment, Copy* copy) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<char*> argv = Pointers(args);
  std::vector<char*> envp = Pointers(environment);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    ExecCopy(parent, out[1], err[1], program.c_str(), argv.data(), envp.data());
  }
  const int fork_errno = errno;
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    return absl::InternalError(
        absl::StrCat("fork: ", std::strerror(fork_errno)));
  }
  setpgid(pid, pid);  // as the child does, so that no signal can miss it
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  const std::string prefix = absl::StrCat("[", copy->rank, "] ");
  copy->pid = pid;
  copy->out = {.fd = out[0], .target = STDOUT_FILENO, .prefix = prefix};
  copy->err = {.fd = err[0], .target = STDERR_FILENO, .prefix = prefix};
  return absl::OkStatus();
}

// How a process ended, from its wait status.
std::string Describe(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("exited with status ", WEXITSTATUS(status));
}

int ExitCode(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// SIGINT and SIGTERM as a readable file; they must be blocked.
int TerminationSignalFd() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
}

// Whether a termination signal came (consuming it).
bool SignalPending(int signal_fd) {
  signalfd_siginfo info;
  return read(signal_fd, &info, sizeof(info)) == sizeof(info);
}

// The copies, from their start until the last one has ended: forwards their
// output, and stops them all when one fails or a termination signal comes.
// A copy that fails after its worker is gone (`worker_gone(rank)`, within
// kWorkerGoneGrace of the copy's end) is lost, not failed: the others go on
// without it, unless none is left.
class Supervisor {
 public:
  Supervisor(int signal_fd, int copies, std::function<bool(int)> worker_gone)
      : signal_fd_(signal_fd), worker_gone_(std::move(worker_gone)) {
    copies_.resize(copies);
    for (int r = 0; r < copies; ++r) copies_[r].rank = r;
  }
  ~Supervisor() {
    for (Copy& copy : copies_) {
      Close(copy.out);
      Close(copy.err);
    }
  }

  // Starts copy r with environment `environments[r]`, unless a termination
  // signal is already pending or a start fails.
  void StartAll(const std::string& program,
                const std::vector<std::string>& args,
                std::vector<std::vector<std::string>> environments);
  // Returns once every started copy has ended and its output is forwarded.
  void Wait();

  bool failed() const { return failed_; }
  const std::vector<int>& lost() const { return lost_; }
  bool interrupted() const { return interrupted_; }
  const std::string& failure() const { return failure_; }
  int exit_code() const {
    return failed_ ? failure_code_ : interrupted_ ? 130 : 0;
  }

 private:
  bool Running() const;
  void PollOnce();
  void ReadSignals();
  void Reap();
  // Lost or failed, for each undecided copy whose worker is gone or whose
  // grace is over (`at_end`: waits for that).
  void Decide(bool at_end);
  void Fail(std::string failure, int code);
  void StopAll();
  void KillLate();

  const int signal_fd_;
  const std::function<bool(int)> worker_gone_;
  std::vector<Copy> copies_;
  std::vector<int> lost_;  // ranks
  // Copies that failed while their worker still ran: rank, wait status and
  // until when its worker may still be seen gone.
  struct Undecided {
    int rank;
    int status;
    absl::Time until;
  };
  std::vector<Undecided> undecided_;
  bool stopping_ = false;
  bool interrupted_ = false;
  bool failed_ = false;
  int failure_code_ = 0;
  std::string failure_;
  absl::Time kill_at_ = absl::InfiniteFuture();
};

void Supervisor::StartAll(const std::string& program,
                          const std::vector<std::string>& args,
                          std::vector<std::vector<std::string>> environments) {
  ReadSignals();
  for (Copy& copy : copies_) {
    if (stopping_) return;
    const absl::Status started =
        Spawn(program, args, std::move(environments[copy.rank]), &copy);
    if (!started.ok()) {
      Fail(absl::StrCat("rank ", copy.rank,
                        " did not start: ", started.message()),
           1);
    }
  }
}

void Supervisor::Wait() {
  while (Running()) {
    PollOnce();
    ReadSignals();  // before Reap: a copy that died of our Ctrl-C is no
                    // failure
    Reap();
    Decide(/*at_end=*/false);
    KillLate();
  }
  Decide(/*at_end=*/true);
  for (Copy& copy : copies_) {
    Close(copy.out);
    Close(copy.err);
  }
}

bool Supervisor::Running() const {
  return std::any_of(copies_.begin(), copies_.end(),
                     [](const Copy& copy) { return copy.pid > 0; });
}

void Supervisor::PollOnce() {
  std::vector<pollfd> fds = {{.fd = signal_fd_, .events = POLLIN}};
  std::vector<Stream*> streams;
  for (Copy& copy : copies_) {
    for (Stream* stream : {&copy.out, &copy.err}) {
      if (stream->fd < 0) continue;
      fds.push_back({.fd = stream->fd, .events = POLLIN});
      streams.push_back(stream);
    }
  }
  // The tick bounds how late an exit (whose pipes a grandchild may keep
  // open) or the SIGKILL deadline is noticed.
  if (poll(fds.data(), fds.size(), absl::ToInt64Milliseconds(kTick)) <= 0) {
    return;
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents != 0) Pump(*streams[i - 1], /*until_empty=*/false);
  }
}

void Supervisor::ReadSignals() {
  signalfd_siginfo info;
  while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
    if (stopping_) {  // a second one: no more patience
      kill_at_ = absl::Now();
      continue;
    }
    std::fprintf(stderr, "gradmesh run: got %s; stopping the commands\n",
                 info.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
    interrupted_ = true;
    StopAll();
  }
}

void Supervisor::Reap() {
  for (Copy& copy : copies_) {
    if (copy.pid <= 0) continue;
    int status = 0;
    const pid_t reaped = waitpid(copy.pid, &status, WNOHANG);
    if (reaped == 0 || (reaped < 0 && errno != ECHILD)) continue;
    copy.pid = -1;  // with ECHILD, reaped elsewhere: its status is unknown
    if (reaped <= 0 || stopping_ || status == 0) continue;
    undecided_.push_back({.rank = copy.rank,
                          .status = status,
                          .until = absl::Now() + kWorkerGoneGrace});
  }
}

void Supervisor::Decide(bool at_end) {
  while (!undecided_.empty() && !stopping_) {
    const Undecided u = undecided_.front();
    if (worker_gone_(u.rank) && lost_.size() + 1 < copies_.size()) {
      lost_.push_back(u.rank);
      std::fprintf(stderr,
                   "gradmesh run: rank %d %s: its worker is gone; the other "
                   "%zu go on\n",
                   u.rank, Describe(u.status).c_str(),
                   copies_.size() - lost_.size());
    } else if (absl::Now() >= u.until || lost_.size() + 1 >= copies_.size()) {
      Fail(absl::StrCat("rank ", u.rank, " ", Describe(u.status)),
           ExitCode(u.status));
    } else if (at_end) {
      absl::SleepFor(kTick);
      continue;
    } else {
      return;  // asked again at the next tick
    }
    undecided_.erase(undecided_.begin());
  }
}

void Supervisor::Fail(std::string failure, int code) {
  if (failed_) return;
  failed_ = true;
  failure_ = std::move(failure);
  failure_code_ = code;
  StopAll();
}

void Supervisor::StopAll() {
  if (stopping_) return;
  stopping_ = true;
  kill_at_ = absl::Now() + kKillAfter;
  for (const Copy& copy : copies_) {
    if (copy.pid > 0) kill(-copy.pid, SIGTERM);
  }
}

void Supervisor::KillLate() {
  if (absl::Now() < kill_at_) return;
  kill_at_ = absl::InfiniteFuture();
  for (const Copy& copy : copies_) {
    if (copy.pid <= 0) continue;
    std::fprintf(stderr, "gradmesh run: rank %d did not stop; sent SIGKILL\n",
                 copy.rank);
    kill(-copy.pid, SIGKILL);
  }
}

// A started cluster in its first full view.
absl::StatusOr<std::unique_ptr<LocalCluster>> StartCluster(
    const RunOptions& options) {
  std::fprintf(stderr, "gradmesh run: starting a coordinator and %d workers\n",
               options.cluster.workers);
  GM_ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster,
                      LocalCluster::Start(options.cluster));
  const absl::Status view =
      cluster->WaitForView(options.cluster.workers, options.start_timeout);
  if (!view.ok()) {
    cluster->KeepWorkDir();
    return absl::Status(view.code(), absl::StrCat(view.message(), "; logs in ",
                                                  cluster->work_dir()));
  }
  return cluster;
}

// Stops the cluster after the copies, reports, and returns the exit code.
int Finish(const Supervisor& supervisor, LocalCluster& cluster) {
  if (supervisor.failed() || !supervisor.lost().empty()) cluster.KeepWorkDir();
  for (int rank : supervisor.lost()) {
    std::fprintf(stderr, "gradmesh run: worker %d %s (its log: %s)\n", rank,
                 Describe(cluster.exit_status(rank)).c_str(),
                 cluster.worker_log(rank).c_str());
  }
  if (const absl::Status stopped = cluster.Stop(); !stopped.ok()) {
    cluster.KeepWorkDir();
    std::fprintf(stderr, "gradmesh run: stopping the cluster: %s\n",
                 std::string(stopped.message()).c_str());
  }
  if (supervisor.failed()) {
    std::fprintf(stderr, "gradmesh run: %s (cluster logs kept in %s)\n",
                 supervisor.failure().c_str(), cluster.work_dir().c_str());
  } else if (!supervisor.interrupted() && supervisor.lost().empty()) {
    std::fprintf(stderr, "gradmesh run: all %d processes exited 0\n",
                 cluster.size());
  } else if (!supervisor.interrupted()) {
    std::fprintf(stderr,
                 "gradmesh run: the other %zu processes exited 0; lost with "
                 "their workers: rank %s\n",
                 cluster.size() - supervisor.lost().size(),
                 absl::StrJoin(supervisor.lost(), ", ").c_str());
  }
  return supervisor.exit_code();
}

// Runs the copies on a started cluster; returns the exit code.
int Supervise(const RunOptions& options, const std::string& program,
              int signal_fd, LocalCluster& cluster) {
  const int copies = cluster.size();
  std::fprintf(stderr,
               "gradmesh run: cluster up (logs in %s); starting %d copies "
               "of: %s\n",
               cluster.work_dir().c_str(), copies,
               absl::StrJoin(options.command, " ").c_str());
  std::vector<std::string> workers;
  for (int w = 0; w < copies; ++w) {
    workers.push_back(absl::StrCat(cluster.worker_metrics_port(w)));
  }
  std::fprintf(stderr,
               "gradmesh run: /metrics at http://127.0.0.1:%d/metrics "
               "(coordinator), workers on ports %s\n",
               cluster.coordinator_metrics_port(),
               absl::StrJoin(workers, ", ").c_str());
  const std::string job = options.job.empty()
                              ? absl::StrCat("run-", getpid(), "-",
                                             absl::ToUnixSeconds(absl::Now()))
                              : options.job;
  std::vector<std::vector<std::string>> environments;
  const int master_port = FreePort();
  for (int r = 0; r < copies; ++r) {
    environments.push_back(
        Environment(RankVariables(options, cluster, job, r, master_port)));
  }
  Supervisor supervisor(signal_fd, copies,
                        [&cluster](int rank) { return cluster.Exited(rank); });
  supervisor.StartAll(program, options.command, std::move(environments));
  supervisor.Wait();
  return Finish(supervisor, cluster);
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
  if (absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
          StartCluster(options);
      cluster.ok()) {
    code = Supervise(options, *program, signal_fd, **cluster);
  } else if (SignalPending(signal_fd)) {  // Ctrl-C also stops the daemons
    std::fprintf(stderr, "gradmesh run: interrupted while starting\n");
    code = 130;
  } else {
    std::fprintf(stderr, "gradmesh run: %s\n",
                 std::string(cluster.status().message()).c_str());
  }
  close(signal_fd);
  return code;
}

}  // namespace gradmesh::tools

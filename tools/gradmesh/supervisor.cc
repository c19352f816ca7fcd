#include "tools/gradmesh/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace gradmesh::tools {

using supervisor_internal::Copy;
using supervisor_internal::Stream;

namespace {

constexpr size_t kMaxLine = 64 << 10;  // longer lines are cut
constexpr absl::Duration kKillAfter = absl::Seconds(10);
constexpr absl::Duration kTick = absl::Milliseconds(100);
// How long a copy that failed waits for its worker to be seen gone (it may
// refuse connections a moment before it can be reaped) before it counts as
// failed.
constexpr absl::Duration kWorkerGoneGrace = absl::Seconds(3);
// How long a copy stopped for its gone worker has after SIGTERM.
constexpr absl::Duration kStopGrace = absl::Seconds(5);

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
  copy->group = pid;
  copy->stopped = false;
  copy->kill_at = absl::InfiniteFuture();
  copy->out = {.fd = out[0], .target = STDOUT_FILENO, .prefix = prefix};
  copy->err = {.fd = err[0], .target = STDERR_FILENO, .prefix = prefix};
  return absl::OkStatus();
}

int ExitCode(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace

std::string Describe(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("exited with status ", WEXITSTATUS(status));
}

int TerminationSignalFd() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
}

bool SignalPending(int signal_fd) {
  signalfd_siginfo info;
  return read(signal_fd, &info, sizeof(info)) == sizeof(info);
}

Supervisor::Supervisor(int signal_fd, const std::vector<int>& ranks,
                       std::function<bool(int)> worker_gone, NodeLink* link,
                       Limits limits,
                       std::function<absl::Status(int)> restart_worker)
    : signal_fd_(signal_fd),
      worker_gone_(std::move(worker_gone)),
      restart_worker_(std::move(restart_worker)),
      link_(link),
      restarts_left_(limits.max_restarts),
      min_copies_(limits.min_copies) {
  copies_.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    copies_[i].index = static_cast<int>(i);
    copies_[i].rank = ranks[i];
  }
}

Supervisor::~Supervisor() {
  for (Copy& copy : copies_) {
    Close(copy.out);
    Close(copy.err);
  }
}

void Supervisor::StartAll(const std::string& program,
                          const std::vector<std::string>& args,
                          std::vector<std::vector<std::string>> environments) {
  ReadSignals();
  program_ = program;
  args_ = args;
  environments_ = std::move(environments);
  for (Copy& copy : copies_) {
    if (stopping_) return;
    const absl::Status started =
        Spawn(program_, args_, environments_[copy.index], &copy);
    if (!started.ok()) {
      Fail(absl::StrCat("rank ", copy.rank,
                        " did not start: ", started.message()),
           1);
    }
  }
}

void Supervisor::Wait() {
  do {
    while (Running()) {
      PollOnce();
      ReadSignals();  // before Reap: a copy that died of our Ctrl-C is no
                      // failure
      Reap();
      PollLink();  // before Decide: another node's news (a copy ended)
      StopCopiesOfGoneWorkers();
      Decide(/*at_end=*/false);
      KillLate();
    }
    Decide(/*at_end=*/true);
  } while (Running());  // a copy started again at the end
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
    if (link_ != nullptr) link_->Leave();  // this node leaves, or all stop
    StopAll();
  }
}

void Supervisor::PollLink() {
  if (link_ == nullptr) return;
  if (std::optional<NodeLink::Stop> stop = link_->Poll()) {
    Fail(stop->why, stop->code, /*here=*/false);
  }
}

void Supervisor::Reap() {
  for (Copy& copy : copies_) {
    if (copy.pid <= 0) continue;
    int status = 0;
    const pid_t reaped = waitpid(copy.pid, &status, WNOHANG);
    if (reaped == 0 || (reaped < 0 && errno != ECHILD)) continue;
    Ended(copy, reaped > 0, status);
  }
}

void Supervisor::Ended(Copy& copy, bool known, int status) {
  copy.pid = -1;
  // A copy stopped for its gone worker did not finish, whatever its status
  // (a trainer may save a checkpoint on SIGTERM and exit 0).
  const bool finished = known && status == 0 && !copy.stopped;
  if (finished) {
    finished_ = true;
    if (link_ != nullptr) link_->Ended();
  }
  if (!known || stopping_ || finished) return;
  undecided_.push_back({.index = copy.index,
                        .status = status,
                        .until = absl::Now() + kWorkerGoneGrace});
}

std::string Supervisor::HowEnded(int index, int status) const {
  return copies_[index].stopped ? "was stopped by gradmesh run"
                                : Describe(status);
}

void Supervisor::StopCopiesOfGoneWorkers() {
  if (restart_worker_ == nullptr) return;
  // The restarts that copies already ended or being stopped may take.
  int pending = static_cast<int>(undecided_.size());
  for (const Copy& copy : copies_) pending += copy.pid > 0 && copy.stopped;
  for (Copy& copy : copies_) {
    if (copy.pid <= 0) continue;
    if (copy.stopped) {  // SIGTERM sent; Reap collects it
      if (absl::Now() >= copy.kill_at) {
        std::fprintf(stderr,
                     "gradmesh run: rank %d did not stop within %s; sent "
                     "SIGKILL\n",
                     copy.rank, absl::FormatDuration(kStopGrace).c_str());
        kill(-copy.group, SIGKILL);
        copy.kill_at = absl::InfiniteFuture();
      }
      continue;
    }
    if (restarts_left_ <= pending || !Restartable() ||
        !worker_gone_(copy.index)) {
      continue;
    }
    ReadSignals();  // a Ctrl-C that ended the worker too stops the job
    if (!Restartable()) return;
    std::fprintf(stderr,
                 "gradmesh run: the worker of rank %d is gone while rank %d "
                 "runs; stopping rank %d to start both again\n",
                 copy.rank, copy.rank, copy.rank);
    kill(-copy.group, SIGTERM);
    copy.stopped = true;
    copy.kill_at = absl::Now() + kStopGrace;
    ++pending;
  }
}

void Supervisor::Decide(bool at_end) {
  while (!undecided_.empty() && !stopping_) {
    const Undecided u = undecided_.front();
    const int rank = copies_[u.index].rank;
    const bool gone = worker_gone_(u.index);
    if (gone && Restartable() && RestartWithWorker(u.index, u.status)) {
      // the worker and the copy run again
    } else if (gone && MayLose()) {
      Lose(u.index, u.status);
    } else if (!gone && absl::Now() >= u.until && Restartable()) {
      Restart(u.index, u.status);
    } else if (absl::Now() >= u.until ||
               (!MayLose() && (gone || !Restartable()))) {
      Fail(absl::StrCat("rank ", rank, " ", HowEnded(u.index, u.status)),
           copies_[u.index].stopped ? 1 : ExitCode(u.status));
    } else if (at_end) {
      absl::SleepFor(kTick);
      PollLink();
      continue;
    } else {
      return;  // asked again at the next tick
    }
    undecided_.erase(undecided_.begin());
  }
}

void Supervisor::Lose(int index, int status) {
  if (stopping_) return;  // the job ends anyway (e.g. stopped meanwhile)
  lost_.push_back(index);
  const int left = static_cast<int>(copies_.size() - lost_.size());
  // Once the job is over for a copy, losses no longer count.
  const bool counts = !finished_ && (link_ == nullptr || !link_->ended());
  if (counts && link_ == nullptr && left < min_copies_) {
    Fail(absl::StrCat(
             "rank ", copies_[index].rank, " ", HowEnded(index, status),
             " and its worker is gone: ",
             TooFewLeft(left, static_cast<int>(copies_.size()), min_copies_)),
         1);
    return;
  }
  if (left > 0) {
    std::fprintf(stderr,
                 "gradmesh run: rank %d %s: its worker is gone; the other %d "
                 "here go on\n",
                 copies_[index].rank, HowEnded(index, status).c_str(), left);
  } else {
    std::fprintf(stderr,
                 "gradmesh run: rank %d %s: its worker is gone; this node has "
                 "no process left and counts as lost (node 0 decides whether "
                 "the job goes on: --min-nodes)\n",
                 copies_[index].rank, HowEnded(index, status).c_str());
  }
  if (counts && link_ != nullptr) {
    link_->Lost(static_cast<int>(lost_.size()));  // node 0 counts the job's
  }
}

bool Supervisor::MayLose() const {
  return lost_.size() + 1 < copies_.size() ||
         (link_ != nullptr && link_->nodes_may_be_lost());
}

bool Supervisor::Restartable() const {
  // Not once the job is over for any copy, here or on another node: the new
  // one would wait for peers that are done.
  return restarts_left_ > 0 && !finished_ && !stopping_ &&
         (link_ == nullptr || !link_->ended());
}

bool Supervisor::RestartWithWorker(int index, int status) {
  if (restart_worker_ == nullptr) return false;
  Copy& copy = copies_[index];
  Retire(copy);  // nothing of it may reach the new worker
  const absl::Status started = restart_worker_(index);
  // That took a while: what came meanwhile goes first.
  ReadSignals();
  Reap();
  PollLink();
  if (!started.ok()) {
    std::fprintf(stderr,
                 "gradmesh run: the worker of rank %d did not start again: "
                 "%s\n",
                 copy.rank, std::string(started.message()).c_str());
    return false;
  }
  if (!Restartable()) return false;
  Restart(index, status, "after its worker was gone, which was started again");
  return true;
}

void Supervisor::Retire(Copy& copy) {
  // What is left of it (a shell script's children) goes first.
  kill(-copy.group, SIGKILL);
  Close(copy.out);  // what it wrote last comes out first
  Close(copy.err);
}

void Supervisor::Restart(int index, int status, const std::string& why) {
  Copy& copy = copies_[index];
  Retire(copy);
  --restarts_left_;
  std::fprintf(stderr,
               "gradmesh run: rank %d %s%s%s; starting it again (%d restart%s "
               "left)\n",
               copy.rank, HowEnded(index, status).c_str(),
               why.empty() ? "" : " ", why.c_str(), restarts_left_,
               restarts_left_ == 1 ? "" : "s");
  const absl::Status started =
      Spawn(program_, args_, environments_[index], &copy);
  if (!started.ok()) {
    Fail(absl::StrCat("rank ", copy.rank,
                      " did not start again: ", started.message()),
         1);
  }
}

void Supervisor::Fail(std::string failure, int code, bool here) {
  if (failed_) return;
  failed_ = true;
  failure_ = std::move(failure);
  failure_code_ = code;
  if (here && link_ != nullptr) link_->Failed(code);
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

}  // namespace gradmesh::tools

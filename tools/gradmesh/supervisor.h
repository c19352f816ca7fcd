// Supervisor: the copies of `gradmesh run`'s command on this node, from
// their start until the last one has ended (run.h describes the behaviour:
// output forwarding, signals, lost and failed copies).
#ifndef GRADMESH_TOOLS_GRADMESH_SUPERVISOR_H_
#define GRADMESH_TOOLS_GRADMESH_SUPERVISOR_H_

#include <sys/types.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tools/gradmesh/node_link.h"

namespace gradmesh::tools {
namespace supervisor_internal {

// One pipe from a copy, forwarded line by line with the copy's prefix.
struct Stream {
  int fd = -1;  // the pipe's read end (non-blocking); -1 once closed
  int target = STDOUT_FILENO;
  std::string prefix;   // "[r] "
  std::string pending;  // output not forwarded yet: the start of a line
};

struct Copy {
  int index = 0;     // among this launcher's copies: its worker's
  int rank = 0;      // in the job
  pid_t pid = -1;    // also its process group; -1 before start and once reaped
  pid_t group = -1;  // its process group, kept once reaped
  bool stopped = false;  // by the launcher, its worker gone (SIGTERM sent)
  absl::Time kill_at = absl::InfiniteFuture();  // SIGKILL then, if stopped
  Stream out;
  Stream err;
};

}  // namespace supervisor_internal

// The copies, from their start until the last one has ended: forwards their
// output, and stops them all when one fails or a termination signal comes.
// A copy that fails while its worker runs is started again (same rank, same
// environment; what is left of its process group killed first) while
// `max_restarts` restarts are left on this node and no copy has exited 0.
// A copy that fails after its worker is gone (`worker_gone(index)`, within
// kWorkerGoneGrace of the copy's end) has its worker started again first
// (`restart_worker(index)`, a new incarnation), then itself, as one restart
// under the same rule. While a restart is left, a copy whose worker is seen
// gone while it runs is stopped (SIGTERM, then SIGKILL 5 s later) for that
// restart. With
// no restart left (or when the worker does not start) the copy is lost, not
// failed: the others go on without it, unless none is left here (on several
// nodes: unless the job goes on without this node,
// NodeLink::nodes_may_be_lost), or fewer than `min_copies` are left in the
// job (on several nodes node 0 counts copies and nodes: NodeLink::Lost),
// which stops it with status 1.
// Once a copy anywhere in the job exited 0, no copy starts again. A
// termination signal stops the copies here, and the link leaves the job
// (NodeLink::Leave: the others go on where nodes may be lost).
class Supervisor {
 public:
  struct Limits {
    int max_restarts = 0;  // on this node, in all
    int min_copies = 0;    // alone (no link): copies left below this fail
  };

  // Copy i has rank ranks[i] in the job; `link` (may be null) joins the
  // other nodes' launchers: a failure there stops these copies, and theirs
  // is told there.
  Supervisor(int signal_fd, const std::vector<int>& ranks,
             std::function<bool(int)> worker_gone, NodeLink* link,
             Limits limits,
             std::function<absl::Status(int)> restart_worker = nullptr);
  ~Supervisor();  // forwards what is left of the copies' output
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts copy r with environment `environments[r]`, unless a termination
  // signal is already pending or a start fails.
  void StartAll(const std::string& program,
                const std::vector<std::string>& args,
                std::vector<std::vector<std::string>> environments);
  // Returns once every started copy has ended and its output is forwarded.
  void Wait();

  bool failed() const { return failed_; }
  // The copies lost with their workers (indices).
  const std::vector<int>& lost() const { return lost_; }
  int rank_of(int index) const { return copies_[index].rank; }
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
  // Copy `copy` ended with wait status `status` (`known`: else reaped
  // elsewhere): a success ends the job for every copy (not one stopped for
  // its worker: that is a failure whatever its status); a failure waits for
  // Decide.
  void Ended(supervisor_internal::Copy& copy, bool known, int status);
  // A copy whose worker is gone while it runs would fail only at its next
  // call to the worker, which a long evaluation can delay: while a restart
  // is left for it (beyond those the copies already ended may take) it gets
  // SIGTERM now (SIGKILL kStopGrace later), and once reaped Decide starts
  // its worker and it again. With none left it runs on (it may not need its
  // worker any more).
  void StopCopiesOfGoneWorkers();
  // How copy `index` ended, with wait status `status`, for messages (a
  // copy stopped by StopCopiesOfGoneWorkers says so, even one that ended on
  // its own in the same tick).
  std::string HowEnded(int index, int status) const;
  // Lost or failed, for each undecided copy whose worker is gone or whose
  // grace is over (`at_end`: waits for that).
  void Decide(bool at_end);
  // `here`: a copy of this launcher's failed (else another node's).
  void Fail(std::string failure, int code, bool here = true);
  // Whether a failed copy may start again: restarts left, and no copy has
  // ended well (the job is over) and nothing stops them.
  bool Restartable() const;
  // Starts copy `index` again after it failed with wait status `status`
  // (`why`: what came first, e.g. its worker's restart).
  void Restart(int index, int status, const std::string& why = "");
  // Starts the gone worker of copy `index` again, then the copy; false
  // (nothing counted) when the worker does not start, or when the copy may
  // no longer start (what came while the worker started: a signal, another
  // node's failure, a copy that ended well). The worker's start blocks this
  // loop (restart_worker's bound: LocalCluster's start timeout).
  bool RestartWithWorker(int index, int status);
  // Whether one more copy may be lost without failing: another is left
  // here, or the job goes on without this node (NodeLink).
  bool MayLose() const;
  // Copy `index` is lost: counted, and told to the link or checked
  // against the minimum.
  void Lose(int index, int status);
  // Kills what is left of a copy's process group and forwards the rest of
  // its output.
  void Retire(supervisor_internal::Copy& copy);
  // A stop from another node's launcher, if any, fails these copies.
  void PollLink();
  void StopAll();
  void KillLate();

  const int signal_fd_;
  const std::function<bool(int)> worker_gone_;
  const std::function<absl::Status(int)> restart_worker_;
  NodeLink* const link_;
  std::vector<supervisor_internal::Copy> copies_;
  std::vector<int> lost_;  // indices
  int restarts_left_;
  const int min_copies_;
  bool finished_ = false;  // a copy exited 0
  // What StartAll started, for restarts.
  std::string program_;
  std::vector<std::string> args_;
  std::vector<std::vector<std::string>> environments_;
  // Copies that failed while their worker still ran: index, wait status and
  // until when its worker may still be seen gone.
  struct Undecided {
    int index;
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

// How a process ended, from its wait status ("exited with status 3").
std::string Describe(int status);

// SIGINT and SIGTERM as a readable file; they must be blocked.
int TerminationSignalFd();

// Whether a termination signal came (consuming it).
bool SignalPending(int signal_fd);

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_SUPERVISOR_H_

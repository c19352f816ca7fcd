// ViewTracker: which group (membership epoch, plan, transport) each operation
// of this worker runs on.
//
// The coordinator publishes views; the tracker turns each into a Group
// through an injected factory (the daemon builds a gRPC transport, tests a
// loopback one) and decides when it applies:
//   - a view that changes membership (node ids, incarnations, or the
//     membership epoch: a node restarted within the heartbeat timeout is a
//     new member under the same id) applies at once; the group it replaces
//     is handed back to be aborted, failing its operations in flight with
//     Aborted;
//   - a plan change of the same members applies from its start step, so that
//     every member switches at the same step; steps before it keep the
//     previous group; a view that arrives after its start step has been
//     reached (late) applies at once.
// Views not newer than the latest one are ignored.
//
//   ViewTracker views(make_group, RealClock());
//   views.Install(view);                     // from the coordinator client
//   GM_ASSIGN_OR_RETURN(auto group, views.Acquire(step, deadline));
//
// Time comes from the injected Clock, so that tests control deadlines.
// Thread-safe; Acquire blocks until a view arrives, the deadline passes or
// Stop is called.
#ifndef GRADMESH_WORKER_DAEMON_VIEW_TRACKER_H_
#define GRADMESH_WORKER_DAEMON_VIEW_TRACKER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine/engine.h"
#include "worker/transport/transport.h"

namespace gradmesh::daemon {

// A source of time and of timed waits (LevelDB's Env, for time only).
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // With `mu` held: waits until `condition` holds or Now() passes `deadline`;
  // returns whether the condition holds.
  virtual bool AwaitWithDeadline(absl::Mutex* mu,
                                 const absl::Condition& condition,
                                 absl::Time deadline) const = 0;
};

// The system clock (a process-wide instance).
Clock* RealClock();

using PlanInfo = collectives::Plan;

struct ViewInfo {
  uint64_t epoch = 0;
  std::vector<std::string> member_ids;  // index = rank
  std::vector<std::string> addresses;   // index = rank
  // Each member's process start (NodeInfo.incarnation); empty: all 0.
  std::vector<uint64_t> incarnations;
  PlanInfo plan;
  uint64_t start_step = 0;  // 0: at once
  // When these members (ids, incarnations) first formed a view (0: unknown,
  // as in tests that make views by hand).
  uint64_t membership_epoch = 0;
};

// A view as this worker runs it.
struct Group {
  ViewInfo view;
  int rank = -1;       // -1: not a member
  absl::Status error;  // why the plan can't run here (OK if it can)
  std::unique_ptr<transport::Transport> transport;  // members only
  engine::EngineOptions options;

  engine::GroupConfig config() const {
    return {.transport = transport.get(), .options = options};
  }
  int size() const { return static_cast<int>(view.member_ids.size()); }
};

using GroupFactory =
    std::function<std::shared_ptr<Group>(const ViewInfo& view)>;

class ViewTracker {
 public:
  ViewTracker(GroupFactory make_group, Clock* clock);
  ViewTracker(const ViewTracker&) = delete;
  ViewTracker& operator=(const ViewTracker&) = delete;

  struct Change {
    std::string description;       // for the log
    bool late = false;             // a plan change applied at once
    std::shared_ptr<Group> group;  // the new view's group
    // Groups a membership change displaced (the current one, and those of
    // a plan switch before or after it), to abort.
    std::vector<std::shared_ptr<Group>> replaced;
  };
  // Installs `view`; nullopt if it is not newer than the latest view.
  // Calls run one at a time, so that groups are made in increasing epochs
  // and at most once per epoch.
  std::optional<Change> Install(const ViewInfo& view);

  // The group an operation at `step` runs on (no step: the latest group that
  // applies). Waits for the first view until `deadline` (DeadlineExceeded).
  // Unavailable after Stop or when this worker is not a member;
  // FailedPrecondition when the plan can't run here.
  absl::StatusOr<std::shared_ptr<Group>> Acquire(std::optional<uint64_t> step,
                                                 absl::Time deadline);

  // Waits until a view newer than `epoch` is installed (true), `deadline`
  // passes or Stop is called (false).
  bool AwaitNewer(uint64_t epoch, absl::Time deadline);

  // The latest group that applies now (null before the first view).
  std::shared_ptr<Group> current() const;
  // Every group a step may run on now, without switching to any: the
  // current one, the pending plan's and the previous one (for steps before
  // the current one's start).
  std::vector<std::shared_ptr<Group>> groups() const;

  // The clock it was given, for the parts that share its time.
  Clock* clock() const { return clock_; }
  uint64_t latest_epoch() const;

  // Destroys, outside the lock, the groups that no view uses and no
  // operation holds any more. Groups are never destroyed elsewhere while
  // running: destroying one closes its transport's streams, which may wait
  // for peers (up to GrpcTransport's bounded close), and that must not
  // happen on an operation's path or under this lock. Call it from a thread
  // that may wait (the daemon's reaper).
  void ReleaseRetired();

  // Acquire fails with Unavailable from now on. Returns every group still
  // held (retired ones included), for the caller to abort and release.
  std::vector<std::shared_ptr<Group>> Stop();

 private:
  absl::Status Usable(const Group& group) const;
  // Moves *group (if any) to retired_, leaving it null.
  void RetireLocked(std::shared_ptr<Group>* group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupFactory make_group_;
  Clock* const clock_;
  absl::Mutex install_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held through Install
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t latest_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<Group> current_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Group> previous_ ABSL_GUARDED_BY(mu_);  // steps < current's
  std::shared_ptr<Group> pending_ ABSL_GUARDED_BY(mu_);   // from its start
  std::optional<uint64_t> last_step_ ABSL_GUARDED_BY(mu_);
  // No longer current, previous or pending; kept for ReleaseRetired.
  std::vector<std::shared_ptr<Group>> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_VIEW_TRACKER_H_

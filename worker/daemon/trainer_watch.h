// TrainerWatch: takes this worker out of the group while its trainer does
// not take part, and back in when the trainer returns.
//
// A trainer that hangs, stops (SIGSTOP, a debugger), or failed a step that
// its peers ran, leaves the others waiting on its worker at every step:
// the daemon still heartbeats, so membership never changes. Every period
// the watch asks `absent` (DataPlane::Absent) whether the peers started a
// step this trainer has not joined within the step-join timeout; if so, it
// steps the worker out (`step_out`: it leaves the group), and the others run
// the step again without it, as after a worker loss. The trainer's next call
// (BeforeCall) rejoins the worker as a new member (`rejoin`); a step fails
// with FailedPrecondition saying why: its replica missed steps, so every
// process registers its buckets again and the parameters are broadcast from a
// survivor (what gradmesh.torch.elastic does).
//
// Thread-safe. The hooks run on the watch's thread or the caller's, one
// transition at a time.
#ifndef GRADMESH_WORKER_DAEMON_TRAINER_WATCH_H_
#define GRADMESH_WORKER_DAEMON_TRAINER_WATCH_H_

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/steady_clock.h"

namespace gradmesh::daemon {

class TrainerWatch {
 public:
  struct Hooks {
    // Why the trainer counts as absent now, or nullopt.
    std::function<std::optional<std::string>()> absent;
    std::function<void()> step_out;  // leave the group, stay out
    std::function<void()> rejoin;    // join again, as a new member
    std::function<void(const std::string&)> log;
  };

  // Watches every join_timeout / 4 (10 ms to 1 s); a zero `join_timeout`
  // watches nothing (BeforeCall is then always OK).
  TrainerWatch(absl::Duration join_timeout, Hooks hooks);
  ~TrainerWatch();  // Stop()
  TrainerWatch(const TrainerWatch&) = delete;
  TrainerWatch& operator=(const TrainerWatch&) = delete;

  // Before a trainer's call: OK while the worker is in the group. After a
  // step-out, rejoins, and fails a step (`step`: AllReduce or Broadcast)
  // with FailedPrecondition naming what the trainer missed; other calls
  // (Register, GetStatus: a trainer coming back, or a new one) go on.
  absl::Status BeforeCall(bool step);

  // A new trainer process took over from the one before (`why`): rejoins
  // as a new member at once, so that the peers waiting on the old one go
  // on and then register again with the new one.
  void NewTrainer(const std::string& why);

  // Ends the watch (no step-out after it returns). Idempotent.
  void Stop();

 private:
  void Loop();
  // Asks `absent` and steps out if so.
  void StepOutIfAbsent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(transition_mu_);

  const absl::Duration join_timeout_;
  const Hooks hooks_;
  Wakeup wake_;
  std::thread thread_;
  absl::Mutex transition_mu_;  // one step-out or rejoin at a time
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(transition_mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Why the worker stepped out; nullopt while it is in.
  std::optional<std::string> out_ ABSL_GUARDED_BY(mu_);
  // Whether out_ is set, read without a lock by every BeforeCall.
  std::atomic<bool> out_flag_ = false;
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_TRAINER_WATCH_H_

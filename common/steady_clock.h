// Time for failure detection and periodic loops that a step of the wall
// clock (NTP, a VM's resume, `date -s`) must not move.
//
// SteadyNow() reads CLOCK_MONOTONIC as an absl::Time: compare it only with
// other SteadyNow() values. Wakeup is what a periodic loop waits on between
// rounds. Debian's Abseil ends absl::Mutex's timed waits at a wall-clock
// instant, so a backward step of the clock would stall such a wait by the
// size of the step (a heartbeat loop missing its timeout); Wakeup's waits
// are measured on the steady clock.
//
//   Wakeup wake;                          // the loop's
//   while (!stopping()) {
//     Beat();
//     wake.WaitFor(absl::Milliseconds(250));  // Stop() calls wake.Notify()
//   }
//
// Thread-safe.
#ifndef GRADMESH_COMMON_STEADY_CLOCK_H_
#define GRADMESH_COMMON_STEADY_CLOCK_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradmesh {

inline absl::Time SteadyNow() {
  return absl::UnixEpoch() +
         absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

class Wakeup {
 public:
  // Ends the current WaitFor, or else the next one, at once.
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      notified_ = true;
    }
    cv_.notify_all();
  }

  // Waits until Notify or `timeout` (steady time) passes; returns whether
  // it was notified, and consumes the notification.
  bool WaitFor(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                 [this] { return notified_; });
    const bool notified = notified_;
    notified_ = false;
    return notified;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;  // wait_for: the steady clock
  bool notified_ = false;
};

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_STEADY_CLOCK_H_

// ClientLeases: notices SDK clients that went away without unregistering
// (a trainer killed, crashed or out of memory), so that their buckets do not
// stay mapped for the daemon's life.
//
// A client holds an Attach stream open while it lives (client/client.cc,
// Presence; proto/gradmesh/v1/worker.proto). When a
// client's last stream ends, it has `grace` to attach again (a reconnecting
// TCP client, a restarted worker's server) before `expire(client_id)` runs,
// on the leases' own thread. A client that never attaches (an older SDK) is
// never expired. A zero grace expires nobody.
//
// Thread-safe. `expire` must not call back into the leases.
#ifndef GRADMESH_WORKER_DAEMON_CLIENT_LEASES_H_
#define GRADMESH_WORKER_DAEMON_CLIENT_LEASES_H_

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/steady_clock.h"

namespace gradmesh::daemon {

class ClientLeases {
 public:
  ClientLeases(absl::Duration grace,
               std::function<void(const std::string& client_id)> expire);
  ~ClientLeases();  // Stop()
  ClientLeases(const ClientLeases&) = delete;
  ClientLeases& operator=(const ClientLeases&) = delete;

  // A stream of `client_id` began: ResourceExhausted (not counted) past
  // kMaxStreams open streams of one client. Or one ended (one that was
  // counted).
  absl::Status Attach(const std::string& client_id);
  void Detach(const std::string& client_id);

  static constexpr int kMaxStreams = 16;

  // Ends the thread; nobody expires after it returns. Idempotent.
  void Stop();

 private:
  struct Lease {
    int streams = 0;
    absl::Time detached;  // SteadyNow() when streams fell to 0
  };

  void Loop();
  // Removes the expired leases; the time until the next expiry (infinite
  // when none is due).
  absl::Duration TakeExpired(std::vector<std::string>* expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration grace_;
  const std::function<void(const std::string&)> expire_;
  Wakeup wake_;
  absl::Mutex mu_;
  std::map<std::string, Lease> leases_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_CLIENT_LEASES_H_

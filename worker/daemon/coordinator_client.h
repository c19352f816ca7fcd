// CoordinatorClient: this worker's side of membership.
//
// It joins the coordinator (retrying until it answers, and only one of its
// own protocol version: proto/protocol_version.h), heartbeats, rejoins
// when the coordinator has dropped it, follows the stream of views (passing
// each to `on_view`), and sends iteration reports for autotune. Each
// heartbeat names the members this worker cannot reach (`unreachable`). It
// keeps the newest view it has seen and joins with it, so that a restarted
// coordinator adopts the view the members run (see Coordinator::Join). When
// that view leaves this node out (it was removed), it first calls each member
// (`probe`) and names those that did not answer, so that a node removed for
// its link stays out while the link is still bad.
//
//   CoordinatorClient coordinator(stub, {.node_id = id, ...}, on_view, log);
//   coordinator.Start();
//   ...
//   coordinator.Stop();  // leaves, joins its threads
//
// Thread-safe. `on_view` and `log` run on the client's threads.
#ifndef GRADMESH_WORKER_DAEMON_COORDINATOR_CLIENT_H_
#define GRADMESH_WORKER_DAEMON_COORDINATOR_CLIENT_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/steady_clock.h"
#include "gradmesh/v1/coordinator.grpc.pb.h"

namespace gradmesh::daemon {

class CoordinatorClient {
 public:
  using OnView = std::function<void(const gradmesh::v1::View&)>;
  using Log = std::function<void(const std::string&)>;
  // The node ids of the members this worker cannot reach now.
  using Unreachable = std::function<std::vector<std::string>()>;
  // The node ids of the members of `view` that do not answer a call now;
  // returns within about a second.
  using Probe =
      std::function<std::vector<std::string>(const gradmesh::v1::View& view)>;

  // `probe` may be empty: joins name nobody.
  CoordinatorClient(std::unique_ptr<gradmesh::v1::Coordinator::Stub> stub,
                    gradmesh::v1::NodeInfo node,
                    absl::Duration heartbeat_interval, OnView on_view, Log log,
                    Unreachable unreachable, Probe probe = nullptr);
  ~CoordinatorClient();  // Stop()

  void Start();

  // Queues a report; with `flush`, sends the queue before returning (while
  // autotune measures, so that a plan change it triggers starts at a step no
  // member has reached). Reports are best effort.
  void Report(gradmesh::v1::IterationStats report, bool flush);

  // Leaves the group and stays out (no heartbeats, no joins) until Rejoin:
  // this worker's trainer stopped taking part, so the others go on without
  // it. Returns once the coordinator was told (or could not be).
  void StepOut();
  // Joins again, as a new member with `incarnation` (its replica missed
  // the steps taken without it, or a new trainer took over), after StepOut
  // or in place of the member it is.
  void Rejoin(uint64_t incarnation);

  // Leaves the coordinator (if joined) and joins the threads. Idempotent.
  void Stop();

 private:
  // Asks the coordinator's protocol version (Hello) and records whether it
  // is this worker's; no answer leaves the last one standing.
  // FailedPrecondition for another version.
  absl::Status Hello();
  // Hello, then Join.
  absl::Status Join();
  // Sends Leave if joined, and forgets the join.
  void Leave() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // Keeps `view` if it is the newest seen, then passes it on.
  void Seen(const gradmesh::v1::View& view);
  void WatchLoop();
  void HeartbeatLoop();
  void FlushReports();

  const std::unique_ptr<gradmesh::v1::Coordinator::Stub> stub_;
  const absl::Duration heartbeat_interval_;
  const OnView on_view_;
  const Log log_;
  const Unreachable unreachable_;
  const Probe probe_;
  std::thread watch_thread_;
  std::thread heartbeat_thread_;
  // The loops' waits, on the steady clock (a wall-clock step must not hold
  // back a heartbeat).
  Wakeup watch_wake_;
  Wakeup heartbeat_wake_;

  absl::Mutex flush_mu_;  // one flush at a time
  // Held across a Join, Heartbeat or Leave call, so that StepOut's Leave
  // comes after any join in flight.
  absl::Mutex call_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  gradmesh::v1::NodeInfo node_ ABSL_GUARDED_BY(mu_);
  bool stepped_out_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  // The coordinator said it speaks this worker's protocol: until then no
  // view is taken (nor watched for).
  bool same_version_ ABSL_GUARDED_BY(mu_) = false;
  gradmesh::v1::View latest_ ABSL_GUARDED_BY(mu_);  // epoch 0: none yet
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;   // of the last view seen
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<gradmesh::v1::IterationStats> reports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_COORDINATOR_CLIENT_H_

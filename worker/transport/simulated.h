// SimulatedNetwork: P ranks in one process, as LoopbackNetwork, plus a
// simulated clock per rank that says how long the same exchanges would take
// on a network of alpha-beta links, with the computation the real code did
// charged per value. `gradmesh sim` runs the real algorithms on it.
//
// The model:
//   - Each rank has one outgoing link, which sends one message at a time,
//     in the order of the rank's Send calls: a message of b bytes occupies
//     it for b beta, and a message queued behind others waits for them. A
//     rank receives from any number of senders at once (no incoming
//     contention).
//   - A message arrives alpha after its last byte left: sent at clock t on a
//     link free from f, at max(t, f) + b beta + alpha. The latency overlaps
//     the next message's transmission, as on a stream, so the messages a
//     step queues together cost alpha once plus their bytes, which is how
//     Table I counts a round.
//   - Send does not advance the sender's clock (Transport's Send only
//     queues). Recv advances the receiver's clock to the arrival time if
//     that is later.
//   - Computation: between two calls on a rank's thread, the clock advances
//     by the values that thread selected, merged and accumulated
//     (common/work_meter.h), each times its cost per value.
//   - `scale` stands a smaller gradient for a larger one: every payload
//     byte and every counted value costs `scale` times. Rounds are exact;
//     bytes and work are the small run's, scaled.
// Every message's arrival depends only on its sender's clock, and a Recv
// names its peer and tag, so the clocks are deterministic whatever order
// the threads run in: this is a discrete-event simulation whose events are
// ordered by causality, one thread per rank.
//
//   SimulatedNetwork net(4, {.link = {.alpha_s = 50e-6,
//                                     .beta_s_per_byte = 1 / 1.25e9}});
//   // on rank r's thread:
//   net.Start(r);                          // clock 0, work counted from here
//   ... the algorithm over net.endpoint(r) ...
//   double seconds = net.Finish(r).seconds;  // its clock at the end
//
// Clocks are in simulated seconds from each operation's Start; an operation
// is simulated as if every rank started it at the same time. Rank r's
// clock and work count belong to the thread that runs rank r: Start,
// Finish, and Send and Recv on endpoint(r) must all be called on that one
// thread (Abort and counters may come from any), and no rank may start the
// next operation before every rank has finished this one (a barrier
// between operations). Message delivery, Abort and counters are
// LoopbackNetwork's (counters: real bytes, not scaled).
#ifndef GRADMESH_WORKER_TRANSPORT_SIMULATED_H_
#define GRADMESH_WORKER_TRANSPORT_SIMULATED_H_

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/work_meter.h"
#include "worker/transport/loopback.h"
#include "worker/transport/transport.h"

namespace gradmesh::transport {

struct SimLink {
  double alpha_s = 50e-6;                 // per message, seconds
  double beta_s_per_byte = 1.0 / 1.25e9;  // seconds per byte (10 Gbit/s)
};

// Seconds per value of each kind of work (WorkCount's).
struct SimCompute {
  double select_s_per_value = 0;
  double merge_s_per_value = 0;
  double accumulate_s_per_value = 0;
};

struct SimOptions {
  SimLink link;
  SimCompute compute;
  double scale = 1;  // bytes and values count this many times (>= 1)
};

// What one rank's operation cost in simulated time.
struct SimTimes {
  double seconds = 0;          // its clock at Finish
  double compute_seconds = 0;  // the part charged for its work
};

class SimulatedNetwork {
 public:
  SimulatedNetwork(int size, const SimOptions& options);
  ~SimulatedNetwork();
  SimulatedNetwork(const SimulatedNetwork&) = delete;
  SimulatedNetwork& operator=(const SimulatedNetwork&) = delete;

  int size() const { return loopback_.size(); }
  const SimOptions& options() const { return options_; }
  Transport* endpoint(int rank) const;

  // On rank's thread: its clock and link to 0; its work counts from now.
  void Start(int rank);
  // On rank's thread: charges the work since its last call and returns its
  // clock.
  SimTimes Finish(int rank);

 private:
  class Endpoint;

  // The clock of one rank, touched only on its own thread (a cache line
  // each, so that ranks' threads do not share one).
  struct alignas(64) Clock {
    double now = 0;
    double link_free = 0;
    double compute = 0;
    WorkCount seen;  // the thread's counts when last charged
  };

  // Advances rank's clock by the work its thread did since the last charge.
  void Charge(int rank);
  // The arrival time of a message from `from` leaving now.
  double Depart(int from, uint64_t bytes);
  // Queues the arrival, or returns false when `to` ended the operation (the
  // message is dropped, as the loopback mailbox would).
  bool PushArrival(int to, const MessageKey& key, double arrival);
  double PopArrival(int to, const MessageKey& key);
  // Forgets the arrival PushArrival queued last for `key` (its Send failed).
  void DropLastArrival(int to, const MessageKey& key);
  // Records that `to` ended an operation and forgets its arrivals.
  void EndArrivals(int to, uint64_t epoch, uint64_t operation);

  const SimOptions options_;
  LoopbackNetwork loopback_;
  std::vector<Clock> clocks_;  // by rank
  absl::Mutex mu_;
  // Arrival times of the messages in flight by receiver, in the loopback
  // mailboxes' order (both are FIFO per sender, receiver and tag).
  std::vector<absl::flat_hash_map<MessageKey, std::deque<double>>> arrivals_
      ABSL_GUARDED_BY(mu_);
  // Operations each receiver ended: (epoch, operation), and oldest first.
  struct Ended {
    absl::flat_hash_set<std::pair<uint64_t, uint64_t>> ids;
    std::deque<std::pair<uint64_t, uint64_t>> order;
  };
  std::vector<Ended> ended_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

}  // namespace gradmesh::transport

#endif  // GRADMESH_WORKER_TRANSPORT_SIMULATED_H_

// StepRecorder: what one successful all-reduce did, into the worker's
// metrics (worker_metrics.h): its time, its traffic per peer (counted by the
// group's transport), the nonzeros of each phase, and the yardstick of a
// dense ring.
//
// Thread-safe: steps of distinct buckets record concurrently; each byte the
// transport counted is recorded once.
#ifndef GRADMESH_WORKER_DAEMON_STEP_RECORDER_H_
#define GRADMESH_WORKER_DAEMON_STEP_RECORDER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/daemon/view_tracker.h"
#include "worker/engine/engine.h"
#include "worker/transport/transport.h"

namespace gradmesh::daemon {

class WorkerMetrics;

// What one operation did, for the caller and for autotune's reports.
struct ReduceResult {
  uint64_t nonzeros = 0;
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 0;
  PlanInfo plan;       // plan.algorithm "dense" for an exact bucket
  bool exact = false;  // summed exactly, not by the plan's algorithm
  double seconds = 0;
  // Since the call of the bucket's step before (step - 1) came to this
  // worker: a training step, its compute included (0: no such step).
  double period_seconds = 0;
  uint64_t step = 0;
  uint64_t values = 0;  // the bucket's size
  uint64_t tensors = 0;
  uint64_t tensors_missing = 0;  // with no entry in the result
  collectives::OpStats stats;
};

class StepRecorder {
 public:
  // `metrics` may be null: nothing is recorded.
  explicit StepRecorder(WorkerMetrics* metrics) : metrics_(metrics) {}

  // `per_tensor_quota`: whether the selections were split per tensor.
  void Record(const ReduceResult& result, const Group& group,
              bool per_tensor_quota);

 private:
  // The bytes per peer since the last record on `group`'s transport.
  void RecordTraffic(const Group& group);

  WorkerMetrics* const metrics_;
  absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  transport::Counters counted_ ABSL_GUARDED_BY(mu_);  // recorded so far
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_STEP_RECORDER_H_

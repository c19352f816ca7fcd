// A registered tensor set (a bucket of a job) as the daemon holds it: its
// shared-memory segment, its description (what the members compare at
// registration), and who may run a call on it.
//
// One call runs on a bucket at a time: Hold waits for the one before (until
// a deadline), Release lets the next in. Usable tells a call that found the
// bucket whether it may still read its memory.
#ifndef GRADMESH_WORKER_DAEMON_BUCKET_H_
#define GRADMESH_WORKER_DAEMON_BUCKET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/shm_segment.h"

namespace gradmesh::daemon {

struct TensorSpec {
  std::string name;
  uint64_t size = 0;
};

// How a bucket's selections treat its tensors (the SDK's Fusion).
struct BucketOptions {
  // Split every selection's quota per tensor (SAFusion), rather than one
  // top-k over the fused bucket.
  bool per_tensor_quota = true;
  // Always summed exactly (the dense ring), whatever its size and the plan.
  bool exact = false;
  // The last this many tensors summed exactly in the bucket's own operation
  // (collectives/exact_tail.h), the rest by the plan; all of them: as
  // `exact`.
  uint32_t exact_tensors = 0;
};

// Who registers a bucket (RegisterRequest.client_id, .segment_locked).
struct BucketClient {
  std::string id;  // empty: unknown
  // The client holds a lock on the segment while it lives
  // (SharedSegment::HoldLock): once none is held, the bucket is abandoned.
  bool locks_segment = false;
};

struct BucketName {
  std::string job;
  std::string bucket;
};

struct Bucket {
  BucketName name;
  std::string key;         // "job/bucket"
  uint64_t id = 0;         // this registration's, agreed by the members
  std::string buffer;      // the engine's buffer: key and id
  std::string descriptor;  // bucket name, tensor names and sizes, options
  std::string shm_name;    // the segment's name at registration
  std::string client_id;   // RegisterRequest.client_id
  bool client_locks_segment = false;  // BucketClient::locks_segment
  uint64_t fingerprint = 0;
  std::vector<uint64_t> tensor_starts;  // each tensor's first index
  // The members (node id, incarnation) that registered it: a step on a view
  // with anyone else needs the bucket registered again.
  absl::flat_hash_set<std::pair<std::string, uint64_t>> members;
  bool per_tensor_quota = true;
  bool exact = false;  // BucketOptions::exact
  // The values of the BucketOptions::exact_tensors last tensors (0 when the
  // bucket is exact).
  uint64_t exact_tail = 0;
  SegmentLayout layout{0};
  SharedSegment segment;
  absl::Mutex mu;                         // held briefly
  bool busy ABSL_GUARDED_BY(mu) = false;  // a call runs on it
  std::optional<uint64_t> last_step ABSL_GUARDED_BY(mu);
  // When last_step's call came (SteadyNow()).
  absl::Time last_step_began ABSL_GUARDED_BY(mu);
  // This worker refused last_step before its agreement (its view not ready,
  // the plan unable to run here, the registration older than the view): its
  // peers may be running it, waiting for this worker.
  bool last_step_refused ABSL_GUARDED_BY(mu) = false;
  bool forgotten ABSL_GUARDED_BY(mu) = false;  // unregistered or replaced
  // The last step applied here and its group's epoch (StepRecord's
  // applied_step and applied_epoch); cleared by a Broadcast of the job.
  uint64_t applied_step ABSL_GUARDED_BY(mu) = 0;  // 1 + the step; 0: none
  uint64_t applied_epoch ABSL_GUARDED_BY(mu) = 0;

  absl::Span<float> values() const {
    return {segment.at<float>(layout.values), layout.n};
  }
};

// "job/bucket".
std::string BucketKey(const BucketName& name);

// InvalidArgument unless `name` is 1 to 256 bytes without '/' (or empty,
// when `may_be_empty`); `what` names it in the message.
absl::Status CheckName(absl::string_view what, absl::string_view name,
                       bool may_be_empty);

// A bucket of `tensors` in segment `shm_name` (mapped, its name unlinked),
// described and laid out, not yet agreed with the members (id, buffer and
// members unset). InvalidArgument for bad names or specs (exact_tensors past
// the tensors' count among them), a segment of the wrong size; PermissionDenied
// for a segment that is not this user's alone.
absl::StatusOr<std::shared_ptr<Bucket>> OpenBucket(
    const BucketName& name, const std::vector<TensorSpec>& tensors,
    const std::string& shm_name, const BucketOptions& options);

// Waits until no call runs on `bucket` (DeadlineExceeded past `deadline`),
// then marks it busy until Release.
absl::Status Hold(Bucket& bucket, absl::Time deadline);
void Release(Bucket& bucket);

// An error if `bucket` was forgotten, or if the caller has given up
// (`cancelled`, may be empty): its memory must not be read.
absl::Status Usable(Bucket& bucket, const std::function<bool()>& cancelled);

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_BUCKET_H_

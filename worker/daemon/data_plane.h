// DataPlane: the daemon's operations on registered tensor sets.
//
// A training process registers a tensor set (a bucket of a job): the SDK has
// created a shared-memory segment for it (common/shm_segment.h) and the data
// plane maps it. An all-reduce then runs directly on those pages: the engine
// reads the gradient once (adding it into the residual and checking that it
// is finite in the same pass), and the result is written back there, dense
// or sparse. Nothing of the tensor data crosses the control protocol.
//
// Names, not arrival order, match operations across workers: an operation is
// (job, bucket, step), and its id on the wire is a hash of that name, so
// several buckets of a step may be in flight at once and finish in any
// order. Residuals belong to (job, bucket); a new job starts with none.
//
// Agreement before each all-reduce (step_protocol.h): the members exchange a
// small record (the bucket's shape fingerprint and the count of non-finite
// values), so that tensor sets that differ between workers, or a NaN or Inf
// on any worker, fail the step with InvalidArgument on every worker instead
// of a hang or a poisoned sum. Registration does the same for the buckets'
// names and shapes (every worker registers the same buckets in the same order).
//
// Failure keeps the gradient: whatever goes wrong after a step names a
// registered bucket of the right job (no view, a stale step, a peer gone, a
// disagreement), the gradient's finite values are in the residual, and the
// next step carries them. Non-finite values are never kept.
//
// A step is all or nothing on the members that finish it: once a worker
// knows the result, the members vote (step_protocol.h), and only a step
// every member voted for changes the residual and writes the result. A
// worker in doubt asks its peers (DataPlaneHooks::ask_outcome, answered by
// Decide). Without a view change nothing more happens after a failed vote:
// the step failed, its gradient is in the residual. When membership changed
// under the step (Aborted or Unavailable), the worker waits for the new view
// (up to DataPlaneOptions::view_wait) and runs the same step again there from
// the residual; every survivor whose attempt failed does the same, so they meet
// under the same step.
//
// Thread-safe: one call per bucket runs at a time (a second waits, until its
// deadline at most), calls on distinct buckets run concurrently.
#ifndef GRADMESH_WORKER_DAEMON_DATA_PLANE_H_
#define GRADMESH_WORKER_DAEMON_DATA_PLANE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/daemon/bucket.h"
#include "worker/daemon/step_protocol.h"
#include "worker/daemon/step_recorder.h"
#include "worker/daemon/view_tracker.h"
#include "worker/engine/engine.h"

namespace gradmesh::daemon {

class WorkerMetrics;

struct ReduceCall {
  BucketName name;
  uint64_t step = 0;
  bool mean = false;    // divide the sum by the world size
  bool sparse = false;  // indices + values regions instead of dense values
  bool return_residual = false;
  // Whether the caller has given up; checked before the result is written.
  std::function<bool()> cancelled;
};

struct Membership {
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 0;
};

struct DataPlaneOptions {
  // After an attempt that failed because membership changed, how long to
  // wait for the new view before giving up (capped by the call's deadline).
  absl::Duration view_wait = absl::Seconds(5);
  // How long decided outcomes are kept for peers in doubt: longer than any
  // operation timeout plus view_wait.
  absl::Duration outcome_retention = absl::Minutes(5);
};

struct DataPlaneHooks {
  // After every successful all-reduce.
  std::function<void(const ReduceResult&)> on_success;
  WorkerMetrics* metrics = nullptr;  // may be null
  // The outcome of `key` at the member reachable at `address` (its Decide),
  // for a worker in doubt (StepPeers::ask_outcome). Empty: a worker in doubt
  // aborts.
  StepPeers::Ask ask_outcome;
};

class DataPlane {
 public:
  DataPlane(ViewTracker* views, DataPlaneHooks hooks,
            DataPlaneOptions options = {});
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Maps segment `shm_name` for bucket `name` (and unlinks the name), and
  // checks with every member that they registered the same bucket as their
  // same-numbered registration of the job. A bucket registered again
  // replaces the old registration (its process is gone or starts over) and
  // starts with no residual. InvalidArgument for bad specs, a segment of the
  // wrong size, or a disagreement; PermissionDenied for a segment that is not
  // this user's alone.
  // `index` numbers the caller's registrations in the job (0, 1, ... for
  // every attempt): the members' registrations with equal numbers are
  // compared, counting from the first under the current membership (so a
  // restarted member's trainer, counting from 0, meets the others).
  // `options` are part of what must agree.
  // `client` names the registering client (TakenOver) and says whether it
  // holds a lock on the segment while it lives (ForgetAbandoned).
  absl::StatusOr<Membership> Register(const BucketName& name,
                                      const std::vector<TensorSpec>& tensors,
                                      const std::string& shm_name,
                                      uint64_t index, absl::Time deadline,
                                      const BucketOptions& options = {},
                                      const BucketClient& client = {});

  // Whether `client_id` registers a bucket of `name`'s job where another
  // client has stepped one of the job's buckets under the current members,
  // or left one behind when it died (ForgetAbandoned): a new trainer
  // process in place of one that died or hung, whose peers wait on its old
  // registrations.
  bool TakenOver(const BucketName& name, const std::string& client_id) const;
  // Whether `client_id` has stepped a bucket of `name`'s job.
  bool Stepped(const BucketName& name, const std::string& client_id) const;
  // Unregisters the buckets of `name`'s job that other clients than
  // `client_id` registered, and forgets the steps dead ones left (a new
  // trainer took over: the old one's are dead, and their peers' steps must
  // not count against this worker).
  void UnregisterOthers(const BucketName& name, const std::string& client_id);

  // Unregisters the buckets whose client held a lock on the segment and no
  // longer does (BucketClient::locks_segment): the process died, or freed
  // the set without Unregister. Returns their names. A bucket a call still
  // runs on is left for a later pass. The next step of each that had
  // stepped is kept (at most kMaxOrphans, the oldest dropped first) until
  // another client takes the job over (TakenOver, UnregisterOthers): peers
  // that start it wait on a trainer that will never join, and Absent says
  // so at once. Never waits; call it periodically (the daemon's reaper).
  std::vector<BucketName> ForgetAbandoned();
  static constexpr size_t kMaxOrphans = 1024;

  // Unmaps the bucket and forgets its residual. NotFound if unknown. With
  // `shm_name`, only the registration made with that segment: a later one
  // (the name registered again) is left alone, and OK is returned.
  absl::Status Unregister(const BucketName& name,
                          absl::string_view shm_name = "");

  // Copies the bucket's residual into its segment's residual region (save),
  // or the region's values into the residual, replacing it (load), for a
  // training checkpoint. Waits for a call running on the bucket until
  // `deadline`. InvalidArgument for an unknown bucket, or one loaded with a
  // non-finite value (nothing changes then).
  absl::Status SaveResidual(const BucketName& name, absl::Time deadline);
  absl::Status LoadResidual(const BucketName& name, absl::Time deadline);

  // Errors are the step's. DataLoss on every member while a member's
  // replica of the job is behind: a step of one of its buckets was applied
  // on the others after its client had given up (its result never reached
  // the trainer), or it could not learn a step's outcome; or while the
  // members' last applied steps of the bucket differ (one was out of the
  // group while the others went on, or applied a step they gave up, and is
  // back as the same process); until a Broadcast of one of the job's
  // buckets from a rank whose replica is whole. A
  // refused step's gradient is kept in the residual.
  absl::StatusOr<ReduceResult> AllReduce(const ReduceCall& call,
                                         absl::Time deadline);

  // Copies the bucket's values from `root` to every member (empty bucket: a
  // barrier). `sequence` numbers the job's broadcasts and barriers.
  absl::StatusOr<Membership> Broadcast(const BucketName& name,
                                       uint64_t sequence, int root,
                                       absl::Time deadline);

  // This worker's outcome of `key`, for a peer in doubt that counts the
  // members `gone` as gone (StepProtocol::Decide, for the registrations this
  // worker holds).
  Outcome Decide(const OutcomeKey& key,
                 const std::vector<std::string>& gone = {});

  // The residual's L2 norm per bucket ("job/bucket"); -1 for a bucket busy
  // with an operation (not waited for).
  std::vector<std::pair<std::string, double>> ResidualNorms() const;

  // Why this worker's trainer counts as absent, or nullopt: the peers of
  // the current view started the next step of a bucket (one that has
  // stepped before, and that no call of this worker runs) at least
  // `join_timeout` ago, and this worker's client has not; or they started
  // a step that this worker refused before its agreement (its view not
  // ready, the plan unable to run here, a registration older than the
  // view), so that it tells its peers by stepping out instead of leaving
  // them to their operation timeout; or, without waiting, they started the
  // next step of a bucket whose client died (ForgetAbandoned). Its first
  // step after a registration is never counted (start-up is slow and
  // uneven). Needs a transport that
  // tracks UnclaimedSince (gRPC's, the loopback's).
  std::optional<std::string> Absent(absl::Duration join_timeout) const;

 private:
  // The job's buckets that have stepped, registered by `client_id`
  // (`theirs`) or by another client.
  std::vector<std::shared_ptr<Bucket>> SteppedBuckets(
      absl::string_view job, absl::string_view client_id, bool theirs) const;
  absl::StatusOr<std::shared_ptr<Bucket>> Find(const BucketName& name) const;
  // Runs `body` on bucket `name` once no other call runs on it (until
  // `deadline`: Hold) and it is Usable; releases the bucket after.
  template <typename T>
  absl::StatusOr<T> WithBucket(
      const BucketName& name, absl::Time deadline,
      const std::function<bool()>& cancelled,
      absl::FunctionRef<absl::StatusOr<T>(Bucket&)> body);
  // Waits for an operation in flight on `bucket`, then drops its residual.
  void Forget(Bucket& bucket);
  // Forget, for a bucket the caller holds (Hold); releases it.
  void ForgetHeld(Bucket& bucket);
  // Takes `bucket` out of buckets_ if it is the registration there still;
  // returns whether it was.
  bool RemoveLocked(const Bucket& bucket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why this worker's trainer counts as absent by an orphan (see Absent).
  std::optional<std::string> OrphanStarted(
      const std::vector<std::shared_ptr<Group>>& groups) const;
  // engine::GatherSmall on `group`.
  absl::StatusOr<std::vector<std::string>> GatherSmall(
      const Group& group, uint64_t operation, std::string mine,
      absl::Time deadline, bool same_size = false, double* waited = nullptr);
  absl::StatusOr<ReduceResult> Run(const ReduceCall& call, Bucket& bucket,
                                   absl::Time deadline);
  // Broadcast of a bucket this call holds.
  absl::StatusOr<Membership> BroadcastHeld(Bucket& bucket, uint64_t sequence,
                                           int root, absl::Time deadline);
  // The caller's `number` for `key` ("job#register", "job#sequence"),
  // counted from 0 under `group`'s membership.
  uint64_t Renumber(const std::string& key, const Group& group,
                    uint64_t number);
  // `group`, if every member of it registered `bucket` (the same process);
  // FailedPrecondition naming one that did not.
  absl::StatusOr<std::shared_ptr<Group>> RegisteredOn(
      const Bucket& bucket, std::shared_ptr<Group> group) const;
  // What one attempt of a step learns on its way.
  struct StepState {
    ReduceResult out;
    bool refused_by_vote = false;
  };
  // The engine's request for an attempt: the agreement before it and the
  // vote after it run on `g`, their figures into *state.
  engine::Request StepRequest(const ReduceCall& call, Bucket& bucket,
                              const Group& g, absl::Span<const float> gradient,
                              absl::Time deadline, StepState* state);
  // After every member voted to apply the step: its result into the
  // segment, its figures recorded (or, when the client has given up, the
  // job marked as having missed it).
  absl::StatusOr<ReduceResult> Applied(const ReduceCall& call, Bucket& bucket,
                                       const Group& g,
                                       const sparse::SparseBlock& result,
                                       ReduceResult out);
  // One attempt of a step on `g` (period_seconds: ReduceResult's);
  // *retriable tells whether its failure came from a membership change (not
  // from a member's vote).
  absl::StatusOr<ReduceResult> Attempt(const ReduceCall& call, Bucket& bucket,
                                       const Group& g,
                                       absl::Span<const float> gradient,
                                       absl::Time deadline,
                                       double period_seconds, bool* retriable);
  // The members' vote on `result` (StepProtocol::Vote).
  absl::Status Commit(const Group& g, const Bucket& bucket,
                      const ReduceCall& call, const sparse::SparseBlock& result,
                      absl::Time deadline, bool* refused_by_vote);
  // Sets bucket.last_step_refused (whether this worker refused its last
  // step before the agreement; Absent watches such a step too).
  static void MarkRefused(Bucket& bucket, bool refused);
  // missed_: notes that the replica of `bucket`'s job missed `step`; the
  // job's mark as StepRecord::missed (1 + the step, or 0 when none); and
  // forgets it, with the last applied step of each of the job's buckets
  // (a Broadcast of one of the job's buckets made it whole).
  void MarkMissed(const Bucket& bucket, uint64_t step);
  uint64_t MissedMark(const Bucket& bucket) const;
  void MarkWhole(const Bucket& bucket);
  void WriteResult(const ReduceCall& call, const Bucket& bucket,
                   const sparse::SparseBlock& result, int world_size);

  ViewTracker* const views_;
  const DataPlaneHooks hooks_;
  const DataPlaneOptions options_;
  engine::Engine engine_;
  StepRecorder recorder_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Bucket>> buckets_
      ABSL_GUARDED_BY(mu_);
  // Registrations, broadcasts and barriers are numbered by the caller (its
  // own counters); the members compare equal numbers. Under a new membership
  // (View.membership_epoch) numbers count from 0 again, from the first the
  // caller sends, so that a restarted member's trainer, which counts from 0,
  // meets the others: key -> the membership and the caller's number that is
  // 0 under it.
  struct Numbering {
    uint64_t membership_epoch = 0;
    uint64_t base = 0;
  };
  absl::flat_hash_map<std::string, Numbering> numbering_ ABSL_GUARDED_BY(mu_);
  // A step each job's replica may have missed: applied on the others after
  // its client had given up, or whose outcome could not be learned
  // (DataLoss). The agreement tells every member, which then refuse the
  // job's steps with DataLoss until a Broadcast of one of its buckets
  // brings the parameters again.
  absl::flat_hash_map<std::string, uint64_t> missed_ ABSL_GUARDED_BY(mu_);
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
  // The next step of a bucket forgotten with its dead client, until its
  // name registers again (ForgetAbandoned).
  struct Orphan {
    BucketName name;
    std::string client_id;  // the dead client's
    uint64_t step = 0;
    // AgreeOperation of `step`, and of the step before when this worker
    // refused it (peers wait on either, as Absent watches).
    std::vector<uint64_t> agree;
  };
  std::vector<Orphan> orphans_ ABSL_GUARDED_BY(mu_);
  StepProtocol protocol_;
};

// The id of operation (kind, scope, number) on the wire: a stable 64-bit
// hash (FNV-1a), the same in every process. The scope of a bucket's
// operations names its registration (job, bucket and the id the members
// agreed on at Register), so a new registration never reuses an id.
uint64_t OperationId(absl::string_view kind, absl::string_view scope,
                     uint64_t number);

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_DATA_PLANE_H_

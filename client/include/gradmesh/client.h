// gradmesh client SDK: how a training process sums its gradients through the
// worker daemon of its node.
//
// A process connects to its worker (found from the environment that
// `gradmesh run` sets), registers its gradient buckets once, then each step
// writes the gradient into a bucket's shared memory and all-reduces it. The
// tensor data never crosses a socket: the worker daemon maps the same pages,
// reads the gradient there once and writes the result back there.
//
//   auto client = gradmesh::Client::Connect();          // GRADMESH_WORKER...
//   if (!client.ok()) ...
//   auto set = (*client)->Register("layer1", {{"weight", 4096}, {"bias", 64}});
//   for (uint64_t step = 0; step < steps; ++step) {
//     ComputeGradient((*set)->values());                // zero copies
//     gradmesh::Handle h = (*client)->AllReduceAsync(**set, step,
//                                                    {.op = ReduceOp::kMean});
//     ...                                               // other buckets
//     absl::StatusOr<gradmesh::ReduceInfo> done = h.Wait();
//     if (!done.ok()) ...  // see "Errors"; the gradient is in the residual
//     ApplyUpdate((*set)->values());                    // the dense result
//   }
//
// Semantics:
//   - Operations are named (job, bucket, step) and matched across workers by
//     name, never by arrival order: several buckets of a step may be in
//     flight at once and finish in any order. Steps of a bucket strictly
//     increase; counted one by one, they also time the training step for
//     `--algo=auto` (which otherwise weighs the all-reduce alone). Residuals
//     (error feedback) belong to (job, bucket); a new job name on live workers
//     starts with none.
//   - Every process registers the same buckets (names, tensor names and
//     sizes) in the same order; Register returns when all have. Registering
//     a bucket again (a restarted process, the same job run again) starts it
//     over: no residual, steps from 0.
//   - The result is the SUM of the selected gradient values over the workers
//     (kMean divides it by the world size), identical on every worker. Dense:
//     written over values() (zeros where nothing was selected). Sparse: the
//     indices (into values(), ascending) and values, nonzeros entries long.
//
// A step is all or nothing on the workers: either every member applies it
// (and every waiting caller gets the same result) or none does. When
// membership changes under a step, the workers run it again on the new view
// (ReduceInfo::epoch tells which), so a member that dies mid-step usually
// costs a delay, not an error.
//
// Errors (absl::Status codes, by what the caller should do):
//   - Aborted: the step was not applied anywhere (membership changed and no
//     new view came in time, or another member's caller gave up). Go on with
//     the next step (rank() and size() may have changed): the failed step's
//     gradient is in the residual already.
//   - Unavailable: the worker or a peer is gone or shutting down. When this
//     client's own worker can't be reached any more, IsWorkerGone says so:
//     that trainer should stop (its worker's registrations are gone); the
//     other members go on without it. Calls never wait for a worker that is
//     gone, once connected.
//   - FailedPrecondition: a member joined, or its worker restarted, after the
//     bucket was registered (the new process has no registration). Every
//     process gets it at the same step. Each then saves the residual if it
//     wants it kept (SaveResidual), destroys the TensorSet, registers again
//     (collective, the newcomer's trainer too), loads the residual back, and
//     takes the parameters through Broadcast; steps of the new registration
//     count from 0 on every process (step numbers must agree). The refused
//     step's gradient is in the residual.
//   - DeadlineExceeded: ClientOptions::timeout passed. Cancelled: the client
//     was destroyed with the call in flight. After either, the memory is the
//     caller's again: a worker that had not started the step drops it
//     without reading the gradient (it is not kept); one that had started
//     it votes it down on every member, so nobody applies it. (A caller
//     that gives up after its worker voted to apply, or while the worker is
//     still learning the outcome past the deadline, can miss a step the
//     others applied; the bucket's next AllReduce then fails with DataLoss
//     on every process, below.)
//   - DataLoss: a replica may differ from the others (the message names its
//     rank): a step was applied on the other members after its caller had
//     given up on it, or its worker could not learn whether its peers
//     applied one. Every process gets it at the same step (the next one,
//     when the worker's own vote ended in DataLoss: that process alone
//     goes on), on every bucket of the job, until all take the parameters
//     through Broadcast (of any of the job's sets) from a rank the message
//     names as whole (a Broadcast from the rank behind is refused the same
//     way); the refused step's gradient is in the residual.
//   - InvalidArgument: bad names or sizes; buckets that differ between
//     workers (reported on every worker, without a hang); NaN or Inf in any
//     worker's gradient (policy: the step is skipped on every worker,
//     non-finite values are dropped and the finite ones kept in the
//     residual); a step number not after the bucket's last (each number is
//     used once: after a failure, continue with the next one).
//   Whenever a step fails (other than by the client giving up before the
//   worker started it), the gradient pushed with it stays in the worker's
//   residual and the next step carries it: nothing is lost. (So a step
//   pushed twice under one number counts twice.)
//
// Thread safety: a Client may be used from several threads. A TensorSet's
// memory belongs to the daemon from AllReduceAsync until its Handle is
// waited for: do not touch it in between. Handles are used from one thread.
#ifndef GRADMESH_CLIENT_INCLUDE_GRADMESH_CLIENT_H_
#define GRADMESH_CLIENT_INCLUDE_GRADMESH_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace gradmesh {

struct TensorSpec {
  std::string name;
  uint64_t size = 0;  // float32 values
};

enum class ReduceOp { kSum, kMean };
enum class ResultLayout { kDense, kSparse };

// How a bucket's top-k selections treat its tensors.
//   kPerTensorQuota (SAFusion's sparsification ahead of fusion): every
//     selection the algorithm makes over a range of the bucket splits its
//     quota over the tensors in that range in proportion to their share of
//     it, at least one value each while the quota has one per tensor, and
//     selects each tensor's top values within its own part; so a tensor of
//     small gradients beside one of large gradients is not left out. Applies
//     to SparDL and TopkA; gTopk, TopkDSA, Ok-Topk and Gaussiank select over
//     the whole bucket (as kAfterFusion) whatever the setting, and dense
//     needs no selection.
//   kAfterFusion: the fused bucket is one vector and its top-k is global (the
//     usual sparsify-after-fusion); ReduceInfo::tensors_missing shows what
//     that costs.
enum class Fusion { kPerTensorQuota, kAfterFusion };

struct RegisterOptions {
  Fusion fusion = Fusion::kPerTensorQuota;
  // Sum exactly (the dense ring: every value, bitwise identical on every
  // process, no residual) whatever the plan's algorithm. Buckets of fewer
  // values than the plan's exact_below (Plan::exact_below) are exact anyway.
  bool exact = false;
  // Sum the last exact_tensors tensors exactly and the rest by the plan, in
  // one operation a step: small tensors that a top-k would leave out, kept
  // exact at the cost of one all-reduce, where a bucket of their own would
  // be a second one. At most the number of tensors (InvalidArgument
  // otherwise).
  uint32_t exact_tensors = 0;
};

struct ClientOptions {
  // The worker: "unix:/path" or "host:port". Empty: $GRADMESH_WORKER.
  std::string worker;
  // The job: operations and residuals are per job. Empty: $GRADMESH_JOB, or
  // "default".
  std::string job;
  // Mutual TLS for a host:port worker (all three or none). Empty:
  // $GRADMESH_TLS_CA, $GRADMESH_TLS_CERT, $GRADMESH_TLS_KEY.
  std::string tls_ca, tls_cert, tls_key;
  // The worker's SDK token (its --sdk_token_file), which every call over TCP
  // needs; calls over the unix socket need none. Empty: $GRADMESH_TOKEN.
  std::string token;
  // Limit of every call, waiting for the worker and its peers included.
  absl::Duration timeout = absl::Minutes(5);
};

// The worker's current view and plan.
struct Plan {
  uint64_t epoch = 0;
  int rank = -1;  // -1: not a member (yet)
  int world_size = 0;
  std::string algorithm;
  double density = 0;
  int teams = 0;
  std::string encoding;
  bool autotuning = false;
  uint64_t exact_below = 0;  // buckets of fewer values are summed exactly
  // Buckets of exactly these sizes are summed exactly too: `--algo=auto`
  // found the dense ring faster for them.
  std::vector<uint64_t> dense_sizes;
  // Steps 0 to warmup_steps - 1 of every bucket are summed exactly too.
  uint64_t warmup_steps = 0;
  // per_tensor (a bucket's selections give each tensor its quota, unless it
  // was registered after_fusion) or after_fusion (every bucket one vector).
  std::string fusion;
  std::string note;
};

// What one all-reduce did.
struct ReduceInfo {
  uint64_t nonzeros = 0;  // entries of the result
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 0;
  std::string algorithm;
  int teams = 0;
  double seconds = 0;  // the worker's own time for the operation
  // Of `seconds`, the time blocked waiting for peers (the members' agreement
  // before the operation included); the rest is the worker's own work.
  double wait_seconds = 0;
  // The operation's communication rounds and payload bytes: the algorithm's
  // schedule, as the papers count it (the agreement's one small all-gather
  // of ceil(log2 P) rounds is not included).
  int rounds = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t tensors = 0;          // in the bucket
  uint64_t tensors_missing = 0;  // tensors with no entry in the result
};

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  ResultLayout layout = ResultLayout::kDense;
  bool return_residual = false;  // also fill TensorSet::residual()
};

class Client;

// Whether `status` (from a Client call) says that the client's worker is
// gone: after a call failed, it refused a connection within a second and
// accepted none (a worker that is alive but stalled is not gone: its calls
// fail at their deadline).
bool IsWorkerGone(const absl::Status& status);

// A registered bucket: tensors fused in registration order, in memory shared
// with the worker. Destroying it unregisters the bucket (its residual is
// forgotten) and unmaps the memory; a registration of the same name made
// since (Register again) stays.
class TensorSet {
 public:
  ~TensorSet();
  TensorSet(const TensorSet&) = delete;
  TensorSet& operator=(const TensorSet&) = delete;

  const std::string& bucket() const;
  const std::vector<TensorSpec>& tensors() const;
  uint64_t size() const;  // values in all tensors

  // Every tensor, fused: write the gradient here; dense results land here.
  absl::Span<float> values();
  // Tensor i's part of values(), which starts at offset(i).
  absl::Span<float> tensor(size_t i);
  uint64_t offset(size_t i) const;

  // Copies `gradient` (size() values) into values(): the one-copy way in.
  // InvalidArgument for another size.
  absl::Status CopyFrom(absl::Span<const float> gradient);

  // The sparse result of the last kSparse all-reduce (ReduceInfo::nonzeros
  // entries).
  absl::Span<const uint32_t> sparse_indices(uint64_t nonzeros) const;
  absl::Span<const float> sparse_values(uint64_t nonzeros) const;

  // The residual the last all-reduce with return_residual (or the last
  // Client::SaveResidual) left.
  absl::Span<const float> residual() const;

 private:
  friend class Client;
  struct State;
  explicit TensorSet(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// An all-reduce in flight.
class Handle {
 public:
  Handle();
  ~Handle();
  Handle(Handle&&) noexcept;
  Handle& operator=(Handle&&) noexcept;

  // Blocks until the operation ends and returns its outcome. Once: a second
  // call is FailedPrecondition.
  absl::StatusOr<ReduceInfo> Wait();
  // Whether Wait would return at once.
  bool Done() const;

 private:
  friend class Client;
  struct Call;
  explicit Handle(std::shared_ptr<Call> call);
  std::shared_ptr<Call> call_;
};

class Client {
 public:
  // Connects to the worker and waits (up to options.timeout) until it is a
  // member of a view, so that rank() and size() are known. InvalidArgument
  // when no worker is given, Unavailable/DeadlineExceeded when none answers.
  // A trainer process holds one client per job: a registration from a new
  // client in a job whose buckets another client has stepped is taken for
  // a restarted trainer (the worker drops the old client's buckets and
  // rejoins the group as a new member, and every process registers again).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      ClientOptions options = {});

  // Cancels the calls in flight and waits for them to end.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Registers bucket `bucket` of this job: creates its shared memory,
  // has the worker map it, and checks with every worker that they register
  // the same bucket (its options included).
  absl::StatusOr<std::unique_ptr<TensorSet>> Register(
      const std::string& bucket, const std::vector<TensorSpec>& tensors,
      const RegisterOptions& options = {});

  // Starts summing `set` across the workers for `step`; returns at once.
  Handle AllReduceAsync(TensorSet& set, uint64_t step,
                        const AllReduceOptions& options = {});
  // The same, waiting for the result.
  absl::StatusOr<ReduceInfo> AllReduce(TensorSet& set, uint64_t step,
                                       const AllReduceOptions& options = {});

  // Copies `set`'s values from rank `root` to every worker (initial
  // parameters). Every process calls Broadcast and Barrier in the same order.
  absl::Status Broadcast(TensorSet& set, int root);
  // Returns when every worker's process has called Barrier.
  absl::Status Barrier();

  // For a training checkpoint: copies the worker's residual (error feedback)
  // of `set` into set.residual() (zeros before its first step), or replaces
  // it with `residual` (size() values, all finite: InvalidArgument
  // otherwise, nothing changed). Each process saves and loads its own
  // worker's residual; load before the first step after a restart.
  absl::Status SaveResidual(TensorSet& set);
  absl::Status LoadResidual(TensorSet& set, absl::Span<const float> residual);

  // The worker's current view and plan.
  absl::StatusOr<Plan> GetPlan();
  // As of the latest call that reported them (Connect sets both).
  int rank() const;
  int size() const;
  const std::string& job() const;

 private:
  friend class TensorSet;
  friend class Handle;
  struct Impl;
  explicit Client(std::shared_ptr<Impl> impl);
  // Broadcast of `bucket` from `root`; an empty bucket is a barrier.
  absl::Status BroadcastBucket(const std::string& bucket, int root);
  // The Residual RPC for `set`: save, or load what its region holds.
  absl::Status ResidualCall(TensorSet& set, bool load);
  std::shared_ptr<Impl> impl_;
};

}  // namespace gradmesh

#endif  // GRADMESH_CLIENT_INCLUDE_GRADMESH_CLIENT_H_

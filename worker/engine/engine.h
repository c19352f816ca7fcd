// Engine: one worker's all-reduce operations, end to end.
//
// It owns the residual (error feedback) of every named gradient buffer and
// one Collective per buffer, and applies the operation timeout. Operations on
// distinct buffers may run concurrently (one per buffer at a time; a second
// call on a busy buffer waits for the first). Each call names the group it
// runs on (a transport and options), so that operations of an old and a new
// membership epoch may overlap while the daemon switches views.
//
//   Engine engine;
//   const GroupConfig group{.transport = t, .options = {.epoch = 3}};
//   GM_ASSIGN_OR_RETURN(SparseBlock sum,
//                       engine.AllReduce(group, {.buffer = "fc1",
//                                                .gradient = grad,
//                                                .operation = op}, &stats));
//
// Operation ids: every rank must give the same request the same id (the
// daemon derives it from the operation's name: job, step, bucket), and the id
// must be unique among the operations of an epoch.
//
// The gradient is read once: the collective's first pass adds it into the
// residual and counts its non-finite values, which are left out (they never
// enter the residual).
//
// Thread-safe. The transports must outlive the calls that use them.
#ifndef GRADMESH_WORKER_ENGINE_ENGINE_H_
#define GRADMESH_WORKER_ENGINE_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collectives/registry.h"
#include "worker/transport/transport.h"

namespace gradmesh::engine {

struct EngineOptions {
  collectives::AlgorithmOptions algorithm;
  absl::Duration timeout = absl::Seconds(60);  // per operation
  uint64_t epoch = 0;  // membership epoch; a new one rebuilds the collectives
};

// Where an operation runs.
struct GroupConfig {
  transport::Transport* transport = nullptr;
  EngineOptions options;
};

// InvalidArgument if the algorithm would reject `options` at this group size.
absl::Status CheckOptions(const GroupConfig& group);

// `group` running the dense ring in fp32 instead of its algorithm: an exact
// sum, bitwise identical on every member, that leaves no residual (for
// small buckets and those registered exact).
GroupConfig ExactConfig(const GroupConfig& group);
//   the name a result of ExactConfig reports as its algorithm;
inline constexpr absl::string_view kExactAlgorithm = "dense";

// What the daemon reads of the table of algorithms (collectives/registry.h)
// and of a result, without naming the algorithms' code:
//   whether `algorithm` splits its selections' quotas per tensor;
bool SplitsPerTensor(absl::string_view algorithm);
//   the bytes the dense ring's cost formula gives for `values` values on
//   `world_size` workers (the yardstick of the traffic saved);
double DenseRingModelBytes(int world_size, uint64_t values);
//   the tensors (first indices `starts` of a buffer of n values) with no
//   entry in `result` (collectives/tensor_quota.h).
uint64_t CountMissingTensors(absl::Span<const uint64_t> starts, uint64_t n,
                             const sparse::SparseBlock& result);

// One operation on one buffer.
struct Request {
  absl::string_view buffer;
  absl::Span<const float> gradient;
  uint64_t operation = 0;
  // The operation fails with DeadlineExceeded past this time or the group's
  // timeout, whichever comes first.
  absl::Time deadline = absl::InfiniteFuture();
  // Called once the gradient is in the residual, with the number of
  // non-finite values left out. A non-OK status fails the operation without
  // running it (the residual keeps old residual + the finite gradient).
  std::function<absl::Status(uint64_t nonfinite)> agree;
  // Called once the result is known here, before the residual changes (the
  // algorithm's Proposal is applied only after it); a non-OK status fails
  // the operation, the residual holding residual + (finite) gradient.
  std::function<absl::Status(const sparse::SparseBlock& result)> commit;
  // Called last, success or failure, still holding the buffer: sees the
  // residual the operation left.
  std::function<void(absl::Span<const float> residual)> residual_out;
  // The first index of each tensor fused in the buffer, for selections that
  // split their quota per tensor (AlgorithmOptions::tensor_starts). Read
  // when the buffer's collective is built (its first call in an epoch); a
  // buffer keeps its tensors for life. Empty: one vector.
  absl::Span<const uint64_t> tensor_starts;
};

class Engine {
 public:
  Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Sums the request's gradient across `group` (see collective.h for the
  // semantics), and ends the operation on the transport when it returns. The
  // first call for a buffer fixes its size; a call with another size is
  // InvalidArgument and changes nothing. On any other error the buffer's
  // residual holds residual + (finite) gradient.
  absl::StatusOr<sparse::SparseBlock> AllReduce(const GroupConfig& group,
                                                const Request& request,
                                                collectives::OpStats* stats);

  // Adds `gradient` (its finite values) to the residual of `buffer` without
  // reducing it, for a request that cannot run: nothing is lost, the next
  // call carries it. InvalidArgument for a size that does not match.
  absl::Status Keep(absl::string_view buffer, absl::Span<const float> gradient);

  // Replaces the residual of `buffer` (created with that size if new) with
  // `residual`. InvalidArgument for a size that does not match. Waits for an
  // operation in flight on it.
  absl::Status SetResidual(absl::string_view buffer,
                           absl::Span<const float> residual);

  // Forgets `buffer` and its residual (its job has ended). Waits for an
  // operation in flight on it.
  void Drop(absl::string_view buffer);

  // The names of the buffers seen so far.
  std::vector<std::string> buffers() const;

  // Calls `read` with the residual of `buffer` (empty if unknown). Blocks
  // while an operation runs on it, unless `if_idle`, when it skips a busy
  // buffer and returns false.
  bool ReadResidual(absl::string_view buffer,
                    absl::FunctionRef<void(absl::Span<const float>)> read,
                    bool if_idle = false) const;

 private:
  struct Buffer {
    explicit Buffer(uint64_t size) : n(size), residual(size, 0.0f) {}
    const uint64_t n;
    absl::Mutex mu;  // held for a whole operation
    std::unique_ptr<collectives::Collective> collective ABSL_GUARDED_BY(mu);
    // The collective is made again for another epoch, algorithm or exact
    // tail (a plan's warm-up sums a bucket exactly, then by the plan).
    uint64_t collective_epoch ABSL_GUARDED_BY(mu) = 0;
    std::string collective_algorithm ABSL_GUARDED_BY(mu);
    uint64_t collective_tail ABSL_GUARDED_BY(mu) = 0;  // exact_tail
    std::vector<float> residual ABSL_GUARDED_BY(mu);
  };

  // The phases of one operation on `collective`: accumulate, agree, reduce,
  // commit, apply (see Request).
  static absl::StatusOr<sparse::SparseBlock> Run(
      collectives::Collective& collective, const Request& request,
      const collectives::OpContext& context, absl::Span<float> residual,
      collectives::OpStats* stats);
  // The buffer, created with `n` zeros if new; InvalidArgument if its size
  // differs.
  absl::StatusOr<std::shared_ptr<Buffer>> FindOrCreate(absl::string_view name,
                                                       uint64_t n);
  std::shared_ptr<Buffer> Find(absl::string_view name) const;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Buffer>> buffers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::engine

#endif  // GRADMESH_WORKER_ENGINE_ENGINE_H_

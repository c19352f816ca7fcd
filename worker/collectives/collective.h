// Collective: one sparse all-reduce algorithm as seen by one worker.
//
// Semantics shared by every algorithm:
//   - AllReduce returns the SUM over workers of the values the algorithm
//     selects (callers divide by P for a mean), as a SparseBlock over the
//     whole gradient [0, n). Every worker returns the bitwise identical block.
//   - Error feedback: on entry `residual` holds what the previous iteration
//     left; the algorithm works on gradient + residual and leaves the new
//     residual there. Summed over workers, inputs = result + residuals (up to
//     float rounding).
//   - An operation runs in two phases, so that an algorithm never calls up
//     into its caller: Accumulate adds the gradient into the residual (the
//     accumulator), then Reduce runs the schedule and proposes a result and
//     how the residual changes (Proposal). The caller applies the proposal,
//     or drops it (a member refused the step): the accumulator then stays
//     the residual, and nothing is lost. AllReduce does all three.
//   - On error nothing is lost: `residual` then holds old residual + gradient
//     (the whole input is fed back next time; non-finite values are never
//     added) and the status says why, with codes chosen for the caller:
//     Unavailable (peer gone), DeadlineExceeded, Aborted, InvalidArgument
//     (bad size or a malformed peer message). The caller decides whether to
//     Abort the transport.
//
// A Collective instance belongs to one worker and one gradient buffer (it may
// keep state across iterations, such as B-SAG's h) and is not thread-safe;
// distinct instances may run concurrently on distinct operation ids.
#ifndef GRADMESH_WORKER_COLLECTIVES_COLLECTIVE_H_
#define GRADMESH_WORKER_COLLECTIVES_COLLECTIVE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/collectives/plan.h"
#include "worker/collectives/schedule.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/sparse_block.h"
#include "worker/transport/transport.h"

namespace gradmesh::collectives {

// Where and until when one operation runs.
struct OpContext {
  transport::Transport* transport = nullptr;
  uint64_t epoch = 0;
  uint64_t operation = 0;
  absl::Time deadline = absl::InfiniteFuture();
  // Added to every step of the schedule's tags: the parts of a composite
  // operation (exact_tail.h) run apart. Schedules tag below kPartSteps.
  uint32_t first_step = 0;
};

// What Reduce proposes once its schedule has run.
struct Proposal {
  sparse::SparseBlock result;
  // Turns the accumulator into the new residual, given `result`: called at
  // most once (it may add into the residual), on Reduce's accumulator,
  // while the instance lives and before its next call (it may read the
  // instance's working state).
  absl::AnyInvocable<void(const sparse::SparseBlock& result,
                          absl::Span<float> residual) &&>
      apply;
};

// Figures of one operation that belong to one algorithm; each is set by the
// algorithm named and absent otherwise.
struct OpFigures {
  // SparDL: nonzeros of this worker's block after SRS, and after SAG (with
  // teams); B-SAG's h and the count N of its gathered union.
  std::optional<int64_t> srs_nonzeros, sag_nonzeros, bsag_h, bsag_gathered;
  // TopkA and Gaussiank: the local selection's size.
  std::optional<int64_t> selected;
  // Ok-Topk: local and global selections; whether this operation
  // re-evaluated the thresholds, re-partitioned the regions, balanced.
  std::optional<int64_t> local_selected, global_selected, thresholds_evaluated,
      repartitioned, balanced;
  // TopkDSA: partitions gathered dense; whether this worker's was dense.
  std::optional<int64_t> dense_partitions, own_dense;

  // Calls `visit` with the name and value of every figure that is set, in
  // the order above (for reports such as replay's stats.json).
  void ForEach(absl::FunctionRef<void(absl::string_view name, int64_t value)>
                   visit) const;
};

// What one operation cost this worker and what it produced.
struct OpStats {
  int rounds = 0;  // communication steps (one exchange each)
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;  // payload bytes, as counted by the transport
  uint64_t bytes_received = 0;
  // The sparse blocks received from peers, counted as plain COO (8 bytes a
  // value) whatever the wire format: bytes received "without encoding".
  uint64_t coo_bytes_received = 0;
  uint64_t result_nonzeros = 0;
  // Wall time of the top-k selections over dense data (the kernels' share).
  double topk_seconds = 0;
  // Wall time blocked in Recv for peers' messages: the operation's time
  // minus this is what the worker computed (or spent sending).
  double wait_seconds = 0;
  OpFigures figures;
};

// Adds the wall time of its scope to *seconds.
class ScopedTimer {
 public:
  explicit ScopedTimer(double* seconds)
      : seconds_(seconds), start_(absl::Now()) {}
  ~ScopedTimer() { *seconds_ += absl::ToDoubleSeconds(absl::Now() - start_); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double* const seconds_;
  const absl::Time start_;
};

// topk.TopKAbs(x, k, 0), its time added to stats->topk_seconds.
sparse::SparseBlock TimedTopKAbs(const kernels::TopKSelector& topk,
                                 absl::Span<const float> x, uint64_t k,
                                 OpStats* stats);

class Collective {
 public:
  virtual ~Collective() = default;

  // The first phase: resets `stats` (not null) and adds the finite values
  // of `gradient` into `residual` in one pass, which then holds the
  // accumulator; returns how many values were not finite (left out).
  // InvalidArgument, and nothing changes, unless both hold the n the
  // instance was created for.
  virtual absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                              absl::Span<float> residual,
                                              OpStats* stats) = 0;

  // The second phase, exactly once after each Accumulate, on the span it
  // filled: runs the schedule over the accumulator (left unchanged) and
  // proposes the result. On error nothing is proposed.
  virtual absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                          const OpContext& context,
                                          OpStats* stats) = 0;

  // Accumulate, Reduce and the proposal applied: one all-reduce where
  // nobody votes (tools and tests).
  absl::StatusOr<sparse::SparseBlock> AllReduce(
      absl::Span<const float> gradient, absl::Span<float> residual,
      const OpContext& context, OpStats* stats);

  // Where this instance's top-k selections run (the CPU until set; it must
  // outlive the instance). Set before the first call.
  void set_topk(const kernels::TopKSelector& topk) { topk_ = &topk; }

 protected:
  const kernels::TopKSelector& topk() const { return *topk_; }

 private:
  const kernels::TopKSelector* topk_ = &kernels::CpuTopK();
};

// Runs the steps of one operation over its transport and accounts for them.
// Each call is one round, under the tag (epoch, operation, step): Exchange
// queues the payloads for `send_to`, then waits for `recv_count` messages from
// `recv_from`; Send and Receive do one half each (tree schedules). Pipelined
// schedules move a round in several messages (pieces), each under a step of
// its own, with SendPiece and ReceivePiece, and count the round once with
// CountRound.
class StepRunner {
 public:
  StepRunner(const OpContext& context, OpStats* stats);

  absl::Status Send(uint32_t step, int send_to,
                    std::vector<std::string> payloads);
  absl::StatusOr<std::vector<std::string>> Receive(uint32_t step, int recv_from,
                                                   int recv_count);

  absl::StatusOr<std::vector<std::string>> Exchange(
      uint32_t step, int send_to, std::vector<std::string> payloads,
      int recv_from, int recv_count);

  OpStats* stats() const { return stats_; }

  // One payload each way.
  absl::StatusOr<std::string> Exchange(uint32_t step, int send_to,
                                       std::string payload, int recv_from);

  void CountRound() { ++stats_->rounds; }
  absl::Status SendPiece(uint32_t step, int send_to, std::string payload);
  absl::StatusOr<std::string> ReceivePiece(uint32_t step, int recv_from);

 private:
  absl::Status SendPayloads(uint32_t step, int send_to,
                            std::vector<std::string> payloads);
  absl::StatusOr<std::vector<std::string>> ReceivePayloads(uint32_t step,
                                                           int recv_from,
                                                           int recv_count);

  const OpContext& context_;
  OpStats* const stats_;
};

// Phases number their steps kPhaseSteps apart in the message tags
// (schedule.h), so a world holds at most this many workers.
inline constexpr int kMaxWorldSize = kPhaseSteps;

// Shared input checks: InvalidArgument unless 0 <= rank < world_size <=
// kMaxWorldSize, the density lies in (0, 1] and n fits uint32 indices.
absl::Status ValidateCommon(int world_size, int rank, uint64_t n,
                            double density);

// InvalidArgument unless gradient and residual both hold n values.
absl::Status ValidateSizes(absl::string_view algorithm, uint64_t n,
                           absl::Span<const float> gradient,
                           absl::Span<const float> residual);

// `status` with "message from rank <peer>: " in front, for errors caused by
// what a peer sent.
absl::Status PeerError(const absl::Status& status, int peer);

// residual += gradient where gradient is finite, in one pass; returns how
// many values were not finite (left out).
uint64_t AccumulateFinite(absl::Span<const float> gradient,
                          absl::Span<float> residual);

// The common Accumulate: checks the sizes (InvalidArgument, and nothing
// changes), resets `stats` (not null) and returns
// AccumulateFinite(gradient, residual).
absl::StatusOr<uint64_t> AccumulateChecked(absl::string_view algorithm,
                                           uint64_t n,
                                           absl::Span<const float> gradient,
                                           absl::Span<float> residual,
                                           OpStats* stats);

// A locally selected block left, as rounded for the wire (wire.h): the
// residual becomes 0 at its entries, plus what rounding took off (`loss`).
// Entries that rounded to zero never left and keep their value.
void LeaveSelected(const sparse::SparseBlock& sent,
                   const sparse::SparseBlock& loss, absl::Span<float> residual);

// The sum of `blocks` in their order (blocks[0] + blocks[1] + ...), so that
// every worker summing the same blocks gets the bitwise identical result.
sparse::SparseBlock SumInOrder(std::vector<sparse::SparseBlock> blocks);

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_COLLECTIVE_H_

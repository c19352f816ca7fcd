// Ok-Topk (paper 003, Algorithms 1 and 2): O(k) sparse all-reduce with
// threshold reuse, for any P >= 1.
//
// Iteration t (1-based) on worker w, with accumulator acc = gradient +
// residual:
//  - every tau' iterations ((t-1) mod tau' == 0) the local threshold is
//    re-evaluated exactly: the k-th largest |acc|; in between it is reused;
//  - local selection: every nonzero with |acc| >= local threshold (about k,
//    not exactly k);
//  - every tau iterations the P regions are re-balanced: each worker cuts its
//    selected indices into P runs of equal count (region r starts at the
//    selected index of rank floor(r m / P)), the P-1 boundaries are
//    all-gathered and averaged (integer mean, in rank order), and made
//    non-decreasing. Before the first re-balance, and for a worker with
//    nothing selected, the regions are the equal BlockRange split;
//  - split and reduce: the part of the selection in region r goes to worker
//    r directly, with destination rotation (step s: to w + s, from w - s);
//    each owner sums the P parts in rank order (bitwise reproducible);
//  - every tau' iterations the global threshold is re-evaluated exactly: the
//    reduced regions are all-gathered and the k-th largest |value| taken;
//  - each owner keeps the reduced values with |v| >= global threshold; their
//    counts are all-gathered; when the largest exceeds 4x the mean, the
//    values are first re-balanced point to point so that worker j holds
//    positions [j T/P, (j+1) T/P) of the global order (balance and
//    allgatherv), otherwise they are all-gathered as they are (allgatherv).
//    All-gathers use recursive doubling for power-of-two P, Bruck otherwise;
//  - the residual is acc, zeroed only at indexes both selected locally and
//    present in the global result (Algorithm 2, line 6).
// The paper outlines the boundary rule only; the equal-count cut and the
// integer mean above are this implementation's reading of it.
//
// Bytes: within [2 k (P-1)/P, 6 k (P-1)/P] words of 4 bytes when the regions
// are balanced and the thresholds select about k; more on the iterations
// that re-evaluate the thresholds (an extra all-gather of the reduced
// regions) and when the regions are skewed, as the SparDL paper points out.
// Figures (OpFigures): local_selected, global_selected, balanced,
// thresholds_evaluated, repartitioned (0 or 1 each for the last three).
#ifndef GRADMESH_WORKER_COLLECTIVES_OKTOPK_H_
#define GRADMESH_WORKER_COLLECTIVES_OKTOPK_H_

#include <memory>
#include <vector>

#include "worker/collectives/collective.h"
#include "worker/collectives/primitives.h"
#include "worker/collectives/schedule.h"
#include "worker/collectives/wire.h"

namespace gradmesh::collectives {

struct OkTopkOptions {
  double density = 0.01;
  int tau = 64;        // region re-balancing period
  int tau_prime = 32;  // threshold re-evaluation period
  WireFormat wire;     // how blocks travel (wire.h)
};

class OkTopk : public Collective {
 public:
  static absl::StatusOr<std::unique_ptr<OkTopk>> Create(
      int world_size, int rank, uint64_t n, const OkTopkOptions& options);

  absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                      absl::Span<float> residual,
                                      OpStats* stats) override;
  absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                  const OpContext& context,
                                  OpStats* stats) override;

 private:
  OkTopk(int world_size, int rank, uint64_t n, const OkTopkOptions& options);

  sparse::IndexRange Region(int r) const {
    return {boundaries_[r], boundaries_[r + 1]};
  }
  absl::Status Repartition(StepRunner& runner,
                           const sparse::SparseBlock& local);
  absl::StatusOr<sparse::SparseBlock> SplitAndReduce(
      StepRunner& runner, const sparse::SparseBlock& local);
  absl::Status EvaluateGlobalThreshold(StepRunner& runner,
                                       const sparse::SparseBlock& reduced);
  absl::StatusOr<sparse::SparseBlock> BalanceAndAllGather(
      StepRunner& runner, sparse::SparseBlock mine, OpStats* stats);
  // Moves `mine` (this rank's part of the concatenation) as `balance` says;
  // returns this rank's balanced chunk.
  absl::StatusOr<sparse::SparseBlock> Rebalance(StepRunner& runner,
                                                const Balance& balance,
                                                const sparse::SparseBlock& mine,
                                                OpStats* stats);

  const int world_size_;
  const int rank_;
  const uint64_t n_;
  const uint64_t k_;
  const OkTopkOptions options_;
  const Group world_;
  const BlockCodec codec_;
  uint64_t iteration_ = 0;  // all-reduces started (past the size check)
  float local_threshold_ = 0;
  float global_threshold_ = 0;
  std::vector<uint64_t> boundaries_;  // P + 1 values, 0 .. n
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_OKTOPK_H_

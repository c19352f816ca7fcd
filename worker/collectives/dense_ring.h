// Dense ring all-reduce: ring reduce-scatter, then ring all-gather, for any
// P >= 1. The reference every sparse method must beat.
//
// The gradient is cut into P chunks (BlockRange), moved by the ring schedule
// (schedule.h: PlanRingReduceScatter, PlanRingAllGather): reduce-scatter
// step s (0..P-2) adds the chunk (w - s - 1) mod P received from w - 1 into
// its own (own + received), so chunk c is summed in the order g_c, then
// g_(c+1), ... and ends complete at worker c - 1.
//
// The steps are pipelined: a chunk moves in pieces of about 256k values (1
// MiB, one frame at the default --chunk_bytes), and each piece goes on to w + 1
// as soon as it is added (or, in the all-gather, stored), since every step
// sends the chunk received in the step before. The link then does not idle
// while a whole large chunk is added or encoded. (Smaller pieces cost more in
// per-message work than they hid on 2 cores: docs/benchmarks.md.)
// Both ends cut a chunk into the same pieces (from its range alone); each
// piece is one message with a tag of its own.
//
// Result: the exact sum, as a block of all n entries (zeros included); the
// residual is zero afterwards. Rounds 2(P-1); bytes received
// 4 (2n - |chunk w| - |chunk w+1|), about 2 n (P-1)/P words of 4 bytes;
// messages received: the pieces of the 2(P-1) chunks received.
#ifndef GRADMESH_WORKER_COLLECTIVES_DENSE_RING_H_
#define GRADMESH_WORKER_COLLECTIVES_DENSE_RING_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/collectives/collective.h"
#include "worker/collectives/schedule.h"

namespace gradmesh::collectives {

class DenseRing : public Collective {
 public:
  static absl::StatusOr<std::unique_ptr<DenseRing>> Create(int world_size,
                                                           int rank,
                                                           uint64_t n);

  absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                      absl::Span<float> residual,
                                      OpStats* stats) override;
  absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                  const OpContext& context,
                                  OpStats* stats) override;

 private:
  DenseRing(int world_size, int rank, uint64_t n)
      : world_size_(world_size), rank_(rank), n_(n), sum_(n) {}

  // One step of the ring: its phase and index in the phase, its blocks,
  // and whether it adds what it receives (reduce-scatter) or stores it
  // (all-gather).
  struct RingStep {
    int phase;
    uint32_t index;
    Step step;
    bool add;

    // The tag step of the step's piece `piece`: each piece has its own, so
    // a piece lost, repeated or overtaken is never taken for another.
    uint32_t PieceTag(int piece) const;
  };

  std::vector<RingStep> PlanSteps() const;
  // Receives the pieces of `step`'s chunk, adding or storing each, and passes
  // each on as the matching piece of `next` (null: the last step).
  absl::Status RunStep(StepRunner& runner, const RingStep& step,
                       const RingStep* next);
  // Adds or stores one received piece into `target`.
  absl::Status Take(const RingStep& step, absl::string_view bytes,
                    absl::Span<float> target);

  const int world_size_;
  const int rank_;
  const uint64_t n_;
  std::vector<float> sum_;
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_DENSE_RING_H_

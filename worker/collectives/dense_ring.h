// Dense ring all-reduce: ring reduce-scatter, then ring all-gather, for any
// P >= 1. The reference every sparse method must beat.
//
// The gradient is cut into P chunks (BlockRange), moved by the ring schedule
// (schedule.h: PlanRingReduceScatter, PlanRingAllGather): reduce-scatter
// step s (0..P-2) adds the chunk (w - s - 1) mod P received from w - 1 into
// its own (own + received), so chunk c is summed in the order g_c, then
// g_(c+1), ... and ends complete at worker c - 1.
//
// Result: the exact sum, as a block of all n entries (zeros included); the
// residual is zero afterwards. Rounds 2(P-1); bytes received
// 4 (2n - |chunk w| - |chunk w+1|), about 2 n (P-1)/P words of 4 bytes.
#ifndef GRADMESH_WORKER_COLLECTIVES_DENSE_RING_H_
#define GRADMESH_WORKER_COLLECTIVES_DENSE_RING_H_

#include <memory>
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

  // Sends chunk step.send.first to step.send_to and stores (or, when `add`,
  // adds) the chunk step.recv.first received from step.recv_from.
  absl::Status RingStep(StepRunner& runner, uint32_t tag, const Step& step,
                        bool add);

  const int world_size_;
  const int rank_;
  const uint64_t n_;
  std::vector<float> sum_;
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_DENSE_RING_H_

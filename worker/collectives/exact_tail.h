// ExactTail: one operation that sums the last values of a buffer exactly and
// the rest by a sparse algorithm, so that a bucket whose small tensors are
// kept exact costs one operation a step (one agreement, one vote), not two
// buckets' worth; the ring's schedule runs after the algorithm's.
//
// The buffer [0, n) is cut at head = n - tail: the inner algorithm runs on
// [0, head) as if that range were its whole buffer (its tensors those of the
// buffer that start below head), with its own error feedback; the dense ring
// (dense_ring.h) sums [head, n) exactly and leaves no residual there. The
// result is the inner result followed by the ring's `tail` entries, their
// indices shifted by head; every worker gets it bitwise identical, and mass
// is conserved as in each part (collective.h). The bits are those of the
// two ranges summed as two buffers of their own under the same operation id
// (TopkDSA's quantization seeds from the id).
//
// The inner algorithm runs first, then the ring, tagged from kPartSteps
// (OpContext::first_step): the parts never share a tag. Stats are the sum
// of the two parts' counts; figures are the inner algorithm's. n must fit
// the blocks' uint32 indices (checked).
#ifndef GRADMESH_WORKER_COLLECTIVES_EXACT_TAIL_H_
#define GRADMESH_WORKER_COLLECTIVES_EXACT_TAIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/collectives/collective.h"

namespace gradmesh::collectives {

class ExactTail : public Collective {
 public:
  // `inner` sums [0, n - tail) (it was made for that many values), the ring
  // [n - tail, n); 0 < tail < n (checked).
  static std::unique_ptr<ExactTail> Create(std::unique_ptr<Collective> inner,
                                           int world_size, int rank, uint64_t n,
                                           uint64_t tail);

  absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                      absl::Span<float> residual,
                                      OpStats* stats) override;
  absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                  const OpContext& context,
                                  OpStats* stats) override;

 private:
  ExactTail(std::unique_ptr<Collective> inner, std::unique_ptr<Collective> ring,
            uint64_t n, uint64_t head)
      : inner_(std::move(inner)), ring_(std::move(ring)), n_(n), head_(head) {}

  const std::unique_ptr<Collective> inner_;
  const std::unique_ptr<Collective> ring_;
  const uint64_t n_;
  const uint64_t head_;  // n - tail: where the exact range begins
};

// The tensor starts of [0, head) as a buffer of its own: those of `starts`
// below head.
std::vector<uint64_t> StartsBelow(absl::Span<const uint64_t> starts,
                                  uint64_t head);

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_EXACT_TAIL_H_

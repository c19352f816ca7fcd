// gTopk (Shi et al., as the Ok-Topk and SparDL papers use it): a reduction
// tree with re-selection of the top k at every level, then a broadcast of the
// final k values.
//
// The paper pairs workers by recursive halving and so needs P to be a power
// of two. Here the tree is the binomial tree, which works for any P: at
// level t (0-based), worker w with w mod 2^(t+1) == 2^t sends its current
// block to w - 2^t and is done; worker w with w mod 2^(t+1) == 0 and
// w + 2^t < P receives that block, sums (own first, so the sum is
// deterministic), keeps the top k and puts the rest into its residual
// (nothing the tree drops is lost). Rank 0 ends with the global top k and
// broadcasts it down the same tree. For P a power of two this is the
// paper's schedule.
//
// Each worker's residual: its accumulator minus its own top k, plus what it
// discarded while reducing. On error it is the untouched accumulator.
// Rounds: at most 2 ceil(log2 P) per worker (rank 0 has exactly that).
// Bytes received: at most 8 k per receive, so at most 8 k (ceil(log2 P) + 1)
// per worker and 8 k ceil(log2 P) at rank 0 (Table I: 4 k log P words along
// the critical path).
#ifndef GRADMESH_WORKER_COLLECTIVES_GTOPK_H_
#define GRADMESH_WORKER_COLLECTIVES_GTOPK_H_

#include <memory>

#include "worker/collectives/collective.h"
#include "worker/collectives/wire.h"

namespace gradmesh::collectives {

class GTopk : public Collective {
 public:
  static absl::StatusOr<std::unique_ptr<GTopk>> Create(
      int world_size, int rank, uint64_t n, double density,
      const WireFormat& wire = {});

  absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                      absl::Span<float> residual,
                                      OpStats* stats) override;
  absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                  const OpContext& context,
                                  OpStats* stats) override;

 private:
  GTopk(int world_size, int rank, uint64_t n, uint64_t k,
        const WireFormat& wire)
      : world_size_(world_size), rank_(rank), n_(n), k_(k), codec_(wire) {}

  const int world_size_;
  const int rank_;
  const uint64_t n_;
  const uint64_t k_;
  const BlockCodec codec_;
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_GTOPK_H_

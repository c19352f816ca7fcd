// TopkA (SparCML's sparse all-gather) and Gaussiank (its threshold-selecting
// variant, Ok-Topk paper Section 2), for any P >= 1.
//
// Each worker selects from its accumulator (gradient + residual):
//   - TopkA: the exact top-k by |x| (kernels/topk.h);
//   - Gaussiank: every nonzero with |x| >= t, t = sigma * PPF(1 - k / 2n),
//     where sigma is the standard deviation of the accumulator and PPF the
//     standard normal percent-point function; t is scaled by 0.9 until at
//     least ceil(3k/4) values are selected (or every nonzero is), as the
//     Ok-Topk paper does for a fair comparison; after 50 such passes the
//     exact threshold of the top ceil(3k/4) is taken. The count varies.
// then all-gathers the selected blocks (recursive doubling when P is a power
// of two, Bruck otherwise) and sums them in rank order 0..P-1, so every
// worker gets the bitwise identical sum. The residual is the accumulator
// minus the worker's own selection; the result holds up to P k values.
//
// Rounds: log2 P (recursive doubling) or ceil(log2 P) (Bruck).
// Bytes received: 8 x (values selected by the other P-1 workers), at most
// 2 k (P-1) words of 4 bytes for TopkA.
// Figures (OpFigures): selected, the number of values this worker selected.
#ifndef GRADMESH_WORKER_COLLECTIVES_TOPKA_H_
#define GRADMESH_WORKER_COLLECTIVES_TOPKA_H_

#include <memory>

#include "worker/collectives/collective.h"
#include "worker/collectives/tensor_quota.h"
#include "worker/collectives/wire.h"

namespace gradmesh::collectives {

enum class LocalSelection { kExactTopK, kGaussian };

class TopkAllGather : public Collective {
 public:
  static absl::StatusOr<std::unique_ptr<TopkAllGather>> Create(
      int world_size, int rank, uint64_t n, double density,
      LocalSelection selection, const WireFormat& wire = {},
      std::vector<uint64_t> tensor_starts = {});

  absl::StatusOr<uint64_t> Accumulate(absl::Span<const float> gradient,
                                      absl::Span<float> residual,
                                      OpStats* stats) override;
  absl::StatusOr<Proposal> Reduce(absl::Span<const float> accumulator,
                                  const OpContext& context,
                                  OpStats* stats) override;

 private:
  TopkAllGather(int world_size, int rank, uint64_t n, uint64_t k,
                LocalSelection selection, const WireFormat& wire,
                std::vector<uint64_t> tensor_starts)
      : world_size_(world_size),
        rank_(rank),
        n_(n),
        k_(k),
        selection_(selection),
        codec_(wire),
        tensors_(std::move(tensor_starts)) {}

  const int world_size_;
  const int rank_;
  const uint64_t n_;
  const uint64_t k_;
  const LocalSelection selection_;
  const BlockCodec codec_;
  // kExactTopK's quota per tensor (tensor_quota.h); kGaussian ignores it.
  const TensorQuotas tensors_;
};

// The standard normal percent-point function (inverse CDF) for p in (0, 1),
// accurate to about 1e-9 (Acklam's rational approximation with one Halley
// refinement step).
double NormalPpf(double p);

// Gaussiank's selection, described above.
sparse::SparseBlock GaussianSelect(
    absl::Span<const float> x, uint64_t k,
    const kernels::TopKSelector& topk = kernels::CpuTopK());

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_TOPKA_H_

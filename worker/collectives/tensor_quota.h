// Top-k selections that give each tensor of a fused buffer its own quota
// (SAFusion, paper 002: sparsification ahead of tensor fusion).
//
// A buffer fuses several tensors end to end. A plain top-k over a range of it
// ranks every value together, so a tensor whose gradients are small beside a
// neighbour's may lose every entry ("tensor missing", paper 002 Section 2.4).
// Here a selection of k values over a range splits k over the tensors that
// range covers, in proportion to the length each has in it, and selects each
// tensor's own top values within its part. So each tensor keeps about the
// density it would keep if sparsified alone, before fusion, while the
// collective still works on the fused buffer and its block schedule.
//
// The split (Split): q_j = floor(k * len_j / L) for the parts j of lengths
// len_j (L their sum), the rest of k handed out one each by the largest
// fractional remainder (ties: lower part first). Then, while k has one value
// per part, every part left at 0 takes one from the part with the largest
// quota (ties: lower part), so that no tensor goes without. The quotas add
// up to exactly min(k, L); a part with fewer nonzeros than its quota selects
// them all, so a selection may return fewer than k entries (the quota of an
// all-zero tensor is not handed to its neighbours). Deterministic: every
// worker splits alike.
//
// Thread-safety: immutable after construction.
#ifndef GRADMESH_WORKER_COLLECTIVES_TENSOR_QUOTA_H_
#define GRADMESH_WORKER_COLLECTIVES_TENSOR_QUOTA_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::collectives {

class TensorQuotas {
 public:
  // One part of a selection's range: a tensor's share of it and its quota.
  struct Part {
    sparse::IndexRange range;
    uint64_t quota = 0;
  };

  // `starts`: the first index of each tensor of the buffer, ascending, the
  // first 0 (checked). Empty or {0}: the buffer is one vector and every
  // selection is a plain top-k.
  explicit TensorQuotas(std::vector<uint64_t> starts = {});

  // Whether selections are split per tensor (more than one tensor).
  bool per_tensor() const { return starts_.size() > 1; }

  // The parts of `range` (one per tensor it overlaps, in order) and their
  // quotas out of k (see the header comment). One part when !per_tensor().
  std::vector<Part> Split(uint64_t k, sparse::IndexRange range) const;

  // Top-k by |value| of the dense x, which holds [begin, begin + x.size()),
  // split per tensor; sorted by index, global indices.
  sparse::SparseBlock TopK(const kernels::TopKSelector& topk,
                           absl::Span<const float> x, uint64_t k,
                           uint64_t begin) const;

  // Splits `block` (entries within `range`, checked; sorted) into its
  // per-tensor top k (`kept`) and the rest (`dropped`); kept + dropped ==
  // block.
  void SplitTopK(const kernels::TopKSelector& topk,
                 const sparse::SparseBlock& block, uint64_t k,
                 sparse::IndexRange range, sparse::SparseBlock* kept,
                 sparse::SparseBlock* dropped) const;

 private:
  std::vector<uint64_t> starts_;
};

// The number of tensors (first indices `starts`, in a buffer of n values)
// with no entry in `result`, which is sorted by index. Empty tensors count
// as present. Empty `starts`: the buffer is one tensor.
uint64_t CountMissingTensors(absl::Span<const uint64_t> starts, uint64_t n,
                             const sparse::SparseBlock& result);

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_TENSOR_QUOTA_H_

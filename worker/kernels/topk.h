// Exact top-k selection by absolute value: the CPU implementation (radix
// select, topk_cpu.cc); the CUDA one, on device memory, is in topk_cuda.h.
//
// Semantics shared by every implementation of the project, so that they all
// select the same set:
//   - entries are ranked by |value|, larger first; equal magnitudes are broken
//     by the lower index first;
//   - entries whose value is exactly zero (+0 or -0) are never selected: a
//     zero carries no gradient, so a span with fewer than k nonzeros yields
//     all of its nonzeros;
//   - the output is sorted by index.
// Inputs must be free of NaN (callers validate external data).
//
// Thread-safety: pure functions.
#ifndef GRADMESH_WORKER_KERNELS_TOPK_H_
#define GRADMESH_WORKER_KERNELS_TOPK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::kernels {

// Top-k of a dense span. The selected entry x[i] gets the global index
// base_index + i.
sparse::SparseBlock TopKAbs(absl::Span<const float> x, size_t k,
                            uint32_t base_index);

// Segmented top-k: for every segment (a range of positions in x) its own
// top quotas[s]; global index = base_index + position in x. Segments may be
// empty; a quota of 0 selects nothing, one >= the segment's nonzeros selects
// them all.
std::vector<sparse::SparseBlock> SegmentedTopKAbs(
    absl::Span<const float> x, absl::Span<const sparse::IndexRange> segments,
    absl::Span<const uint64_t> quotas, uint32_t base_index);

// Splits `block` into its top-k entries (`kept`) and the rest (`dropped`),
// both sorted by index. kept + dropped == block entry by entry.
void SplitTopKAbs(const sparse::SparseBlock& block, size_t k,
                  sparse::SparseBlock* kept, sparse::SparseBlock* dropped);

// Threshold selection (Ok-Topk, Gaussiank): every nonzero entry with
// |x| >= threshold, sorted by index, global index = base_index + i. The count
// is whatever the data gives: not necessarily k.
sparse::SparseBlock SelectAbsAtLeast(absl::Span<const float> x, float threshold,
                                     uint32_t base_index);

// The k-th largest |x| over the nonzero entries (the threshold that selects
// the top k); +infinity when k == 0 or there is no nonzero entry, and the
// smallest nonzero magnitude when there are fewer than k.
float KthLargestAbs(absl::Span<const float> x, size_t k);

// Where the top-k selections of host data run: an injected seam, so that a
// process (its --topk flag) or a test picks the implementation for the
// algorithms it creates (AlgorithmOptions::topk). The functions above are
// CpuTopK()'s.
class TopKSelector {
 public:
  virtual ~TopKSelector() = default;
  // The ascending positions of the top k nonzero |x| (the semantics above).
  // Thread-safe.
  virtual std::vector<uint32_t> Positions(absl::Span<const float> x,
                                          size_t k) const = 0;

  // The selections above, on Positions.
  sparse::SparseBlock TopKAbs(absl::Span<const float> x, size_t k,
                              uint32_t base_index) const;
  std::vector<sparse::SparseBlock> SegmentedTopKAbs(
      absl::Span<const float> x, absl::Span<const sparse::IndexRange> segments,
      absl::Span<const uint64_t> quotas, uint32_t base_index) const;
  void SplitTopKAbs(const sparse::SparseBlock& block, size_t k,
                    sparse::SparseBlock* kept,
                    sparse::SparseBlock* dropped) const;
  float KthLargestAbs(absl::Span<const float> x, size_t k) const;
};

// The CPU implementation (radix select): one instance for the process.
const TopKSelector& CpuTopK();

}  // namespace gradmesh::kernels

#endif  // GRADMESH_WORKER_KERNELS_TOPK_H_

// SparseBlock: a sparse slice of a gradient, and the arithmetic on it.
//
// A SparseBlock holds strictly increasing global uint32 indices, each with one
// float32 value. Indices are global positions in the (fused) gradient, so
// blocks of different ranges can be merged or scattered into a dense buffer
// without any offset bookkeeping.
//
// Invariants (checked by Validate, assumed by everything else):
//   indices.size() == values.size(), indices strictly increasing.
// Entries whose value is exactly zero are allowed (a sum may cancel out).
//
// Thread-safety: plain value type; no internal synchronization.
#ifndef GRADMESH_WORKER_SPARSE_SPARSE_BLOCK_H_
#define GRADMESH_WORKER_SPARSE_SPARSE_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace gradmesh::sparse {

// A half-open range [begin, end) of global gradient indices.
struct IndexRange {
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t size() const { return end - begin; }
  bool Contains(uint64_t i) const { return begin <= i && i < end; }
  friend bool operator==(const IndexRange&, const IndexRange&) = default;
};

struct SparseBlock {
  std::vector<uint32_t> indices;
  std::vector<float> values;

  size_t size() const { return indices.size(); }
  bool empty() const { return indices.empty(); }
  void clear() {
    indices.clear();
    values.clear();
  }
  void reserve(size_t n) {
    indices.reserve(n);
    values.reserve(n);
  }
  // Appends one entry; the caller keeps the indices increasing.
  void push_back(uint32_t index, float value) {
    indices.push_back(index);
    values.push_back(value);
  }
  friend bool operator==(const SparseBlock&, const SparseBlock&) = default;
};

// Returns OK when `block` satisfies the invariants and every index lies in
// `range`; InvalidArgument naming the first violation otherwise.
absl::Status Validate(const SparseBlock& block, IndexRange range);

// Returns a + b. Where both hold an index the value is a.value + b.value (in
// that order, so the result is deterministic). O(|a| + |b|).
SparseBlock Add(const SparseBlock& a, const SparseBlock& b);

// dense[i] += value for every entry. Every index must be < dense.size().
void ScatterAdd(const SparseBlock& block, absl::Span<float> dense);

// Writes the dense form of `block` restricted to `range` into `dense`
// (dense.size() == range.size()): zeros, then the block's values.
void Densify(const SparseBlock& block, IndexRange range,
             absl::Span<float> dense);

// The entries of `block` whose indices fall in `range`. O(log |block| + out).
SparseBlock Slice(const SparseBlock& block, IndexRange range);

// Fnv1aWords (common/fnv1a.h) over the indices' then the values' bytes:
// bitwise equal blocks give equal digests in every process (+0 and -0
// differ), for comparing results across processes. Workers of builds with
// another digest must not be mixed in one cluster (docs/benchmarks.md).
uint64_t Digest(const SparseBlock& block);

}  // namespace gradmesh::sparse

#endif  // GRADMESH_WORKER_SPARSE_SPARSE_BLOCK_H_

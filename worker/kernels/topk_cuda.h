// Exact top-k by absolute value on device memory (CUDA), with the semantics
// of topk.h: |x| descending, ties to the lower index, zeros never selected,
// output sorted by index.
//
// Per segment, all on one stream and without a host round trip inside a
// selection: three histogram passes (11 + 11 + 9 bits of the |x| bit
// pattern, shared-memory histograms, a one-block scan per level to pick
// the boundary bin) find the k-th key T and how many ties at T to take; an
// order-preserving CUB select lists the ties, a one-thread kernel turns "the
// first m ties" into a cut-off index; a second order-preserving select takes
// every position with key > T, or key == T at or below the cut-off. Indices
// and values go to pinned host buffers with their count; the stream is
// synchronized once per segment.
//
// The header is C++17 (the .cu files are compiled as such). Not thread-safe:
// one CudaTopK per thread. Built only with GRADMESH_CUDA.
#ifndef GRADMESH_WORKER_KERNELS_TOPK_CUDA_H_
#define GRADMESH_WORKER_KERNELS_TOPK_CUDA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace gradmesh::kernels {

// One segment of the device array: positions [begin, end), and its quota.
struct TopKSegment {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t quota = 0;
};

// What was selected in one segment: global indices (base_index + position)
// ascending, with their values.
struct TopKSelection {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

class CudaTopK {
 public:
  // Reserves device scratch and pinned buffers for segments of up to
  // `max_segment` values. Unavailable without a usable device.
  static absl::StatusOr<std::unique_ptr<CudaTopK>> Create(size_t max_segment);
  ~CudaTopK();

  // The top `quota` of every segment of the device array `device_x` (n
  // values). InvalidArgument for a segment outside [0, n) or longer than
  // max_segment; Internal for a CUDA error.
  absl::StatusOr<std::vector<TopKSelection>> SegmentedTopKAbs(
      const float* device_x, size_t n, absl::Span<const TopKSegment> segments,
      uint32_t base_index);

  // Copies `host_x` to the device and returns the ascending positions of its
  // top k (the host-data path used when CUDA is forced).
  absl::StatusOr<std::vector<uint32_t>> TopKPositionsOfHostData(
      absl::Span<const float> host_x, size_t k);

  struct State;

 private:
  explicit CudaTopK(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace gradmesh::kernels

#endif  // GRADMESH_WORKER_KERNELS_TOPK_CUDA_H_

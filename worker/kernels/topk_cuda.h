// Exact top-k by absolute value on device memory (CUDA), with the semantics
// of topk.h: |x| descending, ties to the lower index, zeros never selected,
// output sorted by index.
//
// Per segment, all on one stream and without a host round trip inside a
// selection, two passes over the values: a histogram of bits 30..20 of the
// |x| bit pattern picks the bin that holds the k-th key; then every key at
// or above that bin (the candidates: about k plus one bin) is kept, in
// position order within each tile of 4096 values, while the next 11 bits
// of the keys in the bin are counted. The last 9 bits, the k-th key T and
// the ties at T to take come from the candidates alone; a scan of the
// tiles' counts places each tile's part of the selection (keys above T,
// then the first ties by position).
// topk_cuda_kernels.cuh has the kernels.
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
  // `max_segment` values. Unavailable without a device; Internal for other
  // CUDA errors (a device older than sm_80 has no kernel image).
  static absl::StatusOr<std::unique_ptr<CudaTopK>> Create(size_t max_segment);
  ~CudaTopK();

  // The top `quota` of every segment of the device array `device_x` (n
  // values). InvalidArgument for a segment outside [0, n) or longer than
  // max_segment; Internal for a CUDA error. Indices and values go through
  // pinned host buffers: one synchronization per segment.
  absl::StatusOr<std::vector<TopKSelection>> SegmentedTopKAbs(
      const float* device_x, size_t n, absl::Span<const TopKSegment> segments,
      uint32_t base_index);

  // A selection left on the device, in buffers this object owns until the
  // next call that selects: `*count` ascending positions (relative to the
  // values given) and their values.
  struct DeviceSelection {
    const uint32_t* positions = nullptr;
    const float* values = nullptr;
    const int* count = nullptr;  // device memory
  };

  // Enqueues the top `quota` of |device_x[0, len)| on this object's stream
  // and returns without waiting; Synchronize() waits for it. The stream is
  // a blocking one: device_x must be ready when work on the legacy default
  // stream would see it (written there, or synchronized). len and quota
  // must be at least 1 and len at most max_segment (InvalidArgument).
  absl::StatusOr<DeviceSelection> EnqueueTopKAbs(const float* device_x,
                                                 size_t len, uint64_t quota);
  absl::Status Synchronize();

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

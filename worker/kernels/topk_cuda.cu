#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cub/device/device_scan.cuh>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/kernels/topk_cuda.h"
#include "worker/kernels/topk_cuda_kernels.cuh"

namespace gradmesh::kernels {
namespace {

using topk::kBins;
using topk::kThreads;
using topk::kTileItems;
using topk::kUnroll;
using topk::kWarps;

absl::Status Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

int Tiles(size_t len) {
  return static_cast<int>((len + kTileItems - 1) / kTileItems);
}

}  // namespace

struct CudaTopK::State {
  size_t max_segment = 0;
  cudaStream_t stream = nullptr;
  int histogram_grid = 1;  // blocks that fill the device
  int candidate_grid = 1;
  unsigned long long* hist = nullptr;  // kBins
  topk::Cut* cut = nullptr;
  topk::Counters* counters = nullptr;
  int* chunk_memory = nullptr;                 // base and size per tile
  unsigned long long* chunk_counts = nullptr;  // counts, then earlier
  topk::Chunks chunks;
  void* scan_temp = nullptr;  // cub::DeviceScan's
  size_t scan_bytes = 0;
  uint32_t* candidate_positions = nullptr;
  float* candidate_values = nullptr;
  uint32_t* positions = nullptr;  // the selection
  float* values = nullptr;
  int* count = nullptr;
  uint32_t* host_positions = nullptr;  // pinned
  float* host_values = nullptr;        // pinned
  int* host_count = nullptr;           // pinned

  absl::Status Allocate();
  // Enqueues the selection of the top `quota` of |x[0, len)| into
  // positions, values and count.
  absl::Status Enqueue(const float* x, size_t len, uint64_t quota);
  // Copies at most `bound` selected entries and their count to the host:
  // one synchronization. Returns the count.
  absl::StatusOr<int> CopyOut(size_t bound);

  ~State() {
    if (stream != nullptr) cudaStreamSynchronize(stream);  // nothing in flight
    for (void* p :
         {static_cast<void*>(hist), static_cast<void*>(cut),
          static_cast<void*>(counters), static_cast<void*>(chunk_memory),
          static_cast<void*>(chunk_counts), scan_temp,
          static_cast<void*>(candidate_positions),
          static_cast<void*>(candidate_values), static_cast<void*>(positions),
          static_cast<void*>(values), static_cast<void*>(count)}) {
      cudaFree(p);
    }
    cudaFreeHost(host_positions);
    cudaFreeHost(host_values);
    cudaFreeHost(host_count);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

CudaTopK::CudaTopK(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaTopK::~CudaTopK() = default;

absl::Status CudaTopK::State::Allocate() {
  const size_t m = max_segment;
  const size_t tiles = Tiles(m);
  const cudaError_t errors[] = {
      cudaStreamCreate(&stream),
      cudaMalloc(&hist, kBins * sizeof(*hist)),
      cudaMalloc(&cut, sizeof(*cut)),
      cudaMalloc(&counters, sizeof(*counters)),
      cudaMalloc(&chunk_memory, 2 * tiles * sizeof(int)),
      cudaMalloc(&chunk_counts, 2 * tiles * sizeof(unsigned long long)),
      cudaMalloc(&candidate_positions, m * sizeof(uint32_t)),
      cudaMalloc(&candidate_values, m * sizeof(float)),
      cudaMalloc(&positions, m * sizeof(uint32_t)),
      cudaMalloc(&values, m * sizeof(float)),
      cudaMalloc(&count, sizeof(int)),
      cudaMallocHost(&host_positions, m * sizeof(uint32_t)),
      cudaMallocHost(&host_values, m * sizeof(float)),
      cudaMallocHost(&host_count, sizeof(int))};
  for (cudaError_t error : errors) {
    GM_RETURN_IF_ERROR(Check(error, "CudaTopK allocation"));
  }
  chunks.base = chunk_memory;
  chunks.size = chunk_memory + tiles;
  chunks.counts = chunk_counts;
  chunks.earlier = chunk_counts + tiles;
  GM_RETURN_IF_ERROR(Check(
      cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, chunks.counts,
                                    chunks.earlier, static_cast<int>(tiles)),
      "scan size"));
  GM_RETURN_IF_ERROR(Check(cudaMalloc(&scan_temp, scan_bytes), "scan"));
  int device = 0, sms = 0, per_sm = 0;
  GM_RETURN_IF_ERROR(Check(cudaGetDevice(&device), "device"));
  GM_RETURN_IF_ERROR(Check(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
      "multiprocessors"));
  GM_RETURN_IF_ERROR(Check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                               &per_sm, topk::TopHistogram, kThreads, 0),
                           "occupancy"));
  histogram_grid = std::max(1, sms * per_sm);
  candidate_grid = std::max(1, 2 * sms);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaTopK>> CudaTopK::Create(size_t max_segment) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::UnavailableError("no CUDA device");
  }
  if (max_segment > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("segments above ", INT_MAX, " values are not supported"));
  }
  auto s = std::make_unique<State>();
  s->max_segment = std::max<size_t>(max_segment, 1);
  GM_RETURN_IF_ERROR(s->Allocate());
  return std::unique_ptr<CudaTopK>(new CudaTopK(std::move(s)));
}

absl::Status CudaTopK::State::Enqueue(const float* x, size_t len,
                                      uint64_t quota) {
  const int tiles = Tiles(len);
  const int warp_blocks = (tiles + kWarps - 1) / kWarps;
  const int histogram_blocks = static_cast<int>(std::min<size_t>(
      histogram_grid, (len + kThreads * kUnroll - 1) / (kThreads * kUnroll)));
  // An error left on this thread by an earlier call (a failed allocation)
  // would fail the CUB scan below, which checks for one: clear it.
  cudaGetLastError();
  topk::Reset<<<kBins / kThreads, kThreads, 0, stream>>>(hist, cut, counters);
  topk::TopHistogram<<<histogram_blocks, kThreads, 0, stream>>>(x, len, hist);
  topk::Boundary<<<1, kThreads, 0, stream>>>(hist, true, quota, cut);
  topk::Candidates<<<tiles, kThreads, 0, stream>>>(
      x, static_cast<long long>(len), cut, counters, chunks,
      candidate_positions, candidate_values, hist);
  topk::Boundary<<<1, kThreads, 0, stream>>>(hist, false, quota, cut);
  topk::CandidateHistogram<<<candidate_grid, kThreads, 0, stream>>>(
      candidate_values, quota, hist, cut, counters);
  topk::TileCounts<<<warp_blocks, kThreads, 0, stream>>>(candidate_values,
                                                         chunks, tiles, cut);
  GM_RETURN_IF_ERROR(Check(cudaGetLastError(), "top-k launch"));
  size_t bytes = scan_bytes;
  GM_RETURN_IF_ERROR(
      Check(cub::DeviceScan::ExclusiveSum(scan_temp, bytes, chunks.counts,
                                          chunks.earlier, tiles, stream),
            "tile scan"));
  topk::WriteSelection<<<warp_blocks, kThreads, 0, stream>>>(
      candidate_positions, candidate_values, chunks, tiles, cut, positions,
      values, count);
  return Check(cudaGetLastError(), "top-k launch");
}

absl::StatusOr<int> CudaTopK::State::CopyOut(size_t bound) {
  // At most `bound` entries are selected, so that many are copied out with
  // the count, before it is known.
  GM_RETURN_IF_ERROR(Check(cudaMemcpyAsync(host_count, count, sizeof(int),
                                           cudaMemcpyDeviceToHost, stream),
                           "count copy"));
  GM_RETURN_IF_ERROR(
      Check(cudaMemcpyAsync(host_positions, positions, bound * sizeof(uint32_t),
                            cudaMemcpyDeviceToHost, stream),
            "positions copy"));
  GM_RETURN_IF_ERROR(
      Check(cudaMemcpyAsync(host_values, values, bound * sizeof(float),
                            cudaMemcpyDeviceToHost, stream),
            "values copy"));
  GM_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream), "top-k"));
  const int count = *host_count;
  if (count < 0 || static_cast<size_t>(count) > bound) {
    return absl::InternalError(
        absl::StrCat("top-k selected ", count, " values, more than ", bound));
  }
  return count;
}

absl::StatusOr<CudaTopK::DeviceSelection> CudaTopK::EnqueueTopKAbs(
    const float* device_x, size_t len, uint64_t quota) {
  State& s = *state_;
  if (len == 0 || len > s.max_segment || quota == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top ", quota, " of ", len,
                     " values: both must be at "
                     "least 1, and the values at most ",
                     s.max_segment));
  }
  GM_RETURN_IF_ERROR(s.Enqueue(device_x, len, quota));
  return DeviceSelection{s.positions, s.values, s.count};
}

absl::Status CudaTopK::Synchronize() {
  return Check(cudaStreamSynchronize(state_->stream), "top-k");
}

absl::StatusOr<std::vector<TopKSelection>> CudaTopK::SegmentedTopKAbs(
    const float* device_x, size_t n, absl::Span<const TopKSegment> segments,
    uint32_t base_index) {
  State& s = *state_;
  std::vector<TopKSelection> out(segments.size());
  for (size_t seg = 0; seg < segments.size(); ++seg) {
    const TopKSegment& range = segments[seg];
    if (range.end > n || range.begin > range.end ||
        range.end - range.begin > s.max_segment) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment [", range.begin, ", ", range.end, ") outside [0, ", n,
          ") or above ", s.max_segment, " values"));
    }
    const size_t len = range.end - range.begin;
    if (len == 0 || range.quota == 0) continue;
    GM_RETURN_IF_ERROR(s.Enqueue(device_x + range.begin, len, range.quota));
    GM_ASSIGN_OR_RETURN(const int count,
                        s.CopyOut(std::min<size_t>(range.quota, len)));
    TopKSelection& block = out[seg];
    block.indices.resize(count);
    block.values.assign(s.host_values, s.host_values + count);
    const uint32_t offset = base_index + static_cast<uint32_t>(range.begin);
    for (int j = 0; j < count; ++j) {
      block.indices[j] = offset + s.host_positions[j];
    }
  }
  return out;
}

absl::StatusOr<std::vector<uint32_t>> CudaTopK::TopKPositionsOfHostData(
    absl::Span<const float> host_x, size_t k) {
  State& s = *state_;
  if (host_x.size() > s.max_segment) {
    return absl::InvalidArgumentError(absl::StrCat(
        host_x.size(), " values exceed this CudaTopK's ", s.max_segment));
  }
  float* device_x = nullptr;
  absl::Status status = Check(
      cudaMalloc(&device_x, std::max<size_t>(1, host_x.size()) * sizeof(float)),
      "upload buffer");
  if (status.ok()) {
    status = Check(
        cudaMemcpyAsync(device_x, host_x.data(), host_x.size() * sizeof(float),
                        cudaMemcpyHostToDevice, s.stream),
        "upload");
  }
  absl::StatusOr<std::vector<TopKSelection>> selected =
      status.ok() ? SegmentedTopKAbs(device_x, host_x.size(),
                                     {TopKSegment{0, host_x.size(), k}}, 0)
                  : absl::StatusOr<std::vector<TopKSelection>>(status);
  cudaFree(device_x);
  if (!selected.ok()) return selected.status();
  return std::move((*selected)[0].indices);
}

}  // namespace gradmesh::kernels

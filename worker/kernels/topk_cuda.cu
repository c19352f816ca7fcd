#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <climits>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/kernels/topk_cuda.h"

namespace gradmesh::kernels {
namespace {

constexpr int kTopShift = 20;
constexpr int kMidShift = 9;
constexpr uint32_t kMidMask = 0x7ff;
constexpr uint32_t kLowMask = 0x1ff;
constexpr int kBins = 2048;
constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t Key(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

// The selection's progress, on the device.
struct Cut {
  unsigned long long need;  // keys still to take at or below the prefix
  uint32_t prefix;          // key bits fixed so far
  uint32_t take_all;        // fewer nonzeros than k: take them all
  uint32_t kth;             // the k-th largest key, once known
  unsigned long long ties;  // keys equal to kth to take
  long long cutoff;         // last position whose tie is taken (-1: none)
};

// Histogram of one level: `shift`/`mask` pick the bits, `match_shift` and the
// cut's prefix restrict it to the boundary bin of the previous level
// (match_shift 32: every nonzero key).
__global__ void Histogram(const float* x, size_t n, int shift, uint32_t mask,
                          int match_shift, const Cut* cut,
                          unsigned long long* hist) {
  __shared__ unsigned int local[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint32_t prefix = cut->prefix;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t key = Key(x[i]);
    if (key == 0) continue;
    if (match_shift < 32 && (key >> match_shift) != prefix) continue;
    atomicAdd(&local[(key >> shift) & mask], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
  }
}

// Picks the boundary bin of a level, in one block: extends the prefix by
// `bits` bits and lowers `need` by the count above the bin. On the first
// level it also decides take_all; on the last it fixes kth and ties. Thread t
// holds bins bins-1-2t and bins-2-2t, so the bins run in descending order and
// an exclusive sum gives each bin the count above it; the boundary is the one
// bin with above < need <= above + count.
constexpr int kBoundaryThreads = kBins / 2;
static_assert(2 * kBoundaryThreads >= kBins, "two bins a thread cover all");

__global__ void __launch_bounds__(kBoundaryThreads)
    Boundary(const unsigned long long* hist, int bins, int bits, bool first,
             bool last, unsigned long long k, Cut* cut) {
  using Scan = cub::BlockScan<unsigned long long, kBoundaryThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int found_bin;
  __shared__ unsigned long long found_above;
  unsigned long long counts[2], above[2], total;
  for (int j = 0; j < 2; ++j) {
    const int bin = bins - 1 - (2 * static_cast<int>(threadIdx.x) + j);
    counts[j] = bin >= 0 ? hist[bin] : 0;
  }
  Scan(scan).ExclusiveSum(counts, above, total);
  if (threadIdx.x == 0) {
    if (first) {
      cut->need = k;
      cut->prefix = 0;
      cut->take_all = total <= k;
      cut->cutoff = -1;
    }
    found_bin = 0;
    found_above = 0;
  }
  __syncthreads();  // makes thread 0's writes visible to the block
  if (cut->take_all) return;
  const unsigned long long need = cut->need;
  for (int j = 0; j < 2; ++j) {
    if (above[j] < need && need <= above[j] + counts[j]) {
      found_bin = bins - 1 - (2 * static_cast<int>(threadIdx.x) + j);
      found_above = above[j];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    cut->need = need - found_above;
    cut->prefix = (cut->prefix << bits) | static_cast<uint32_t>(found_bin);
    if (last) {
      cut->kth = cut->prefix;
      cut->ties = cut->need;
    }
  }
}

struct IsTie {
  const float* x;
  const Cut* cut;
  __device__ bool operator()(uint32_t i) const {
    return !cut->take_all && Key(x[i]) == cut->kth;
  }
};

__global__ void TieCutoff(const uint32_t* ties, const int* num_ties, Cut* cut) {
  if (cut->take_all || cut->ties == 0 || *num_ties == 0) return;
  const long long m = static_cast<long long>(cut->ties);
  cut->cutoff = m <= *num_ties ? ties[m - 1] : ties[*num_ties - 1];
}

struct IsSelected {
  const float* x;
  const Cut* cut;
  __device__ bool operator()(uint32_t i) const {
    const uint32_t key = Key(x[i]);
    if (key == 0) return false;
    if (cut->take_all) return true;
    return key > cut->kth ||
           (key == cut->kth && static_cast<long long>(i) <= cut->cutoff);
  }
};

__global__ void Gather(const float* x, const uint32_t* positions,
                       const int* count, float* values) {
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < *count;
       j += gridDim.x * blockDim.x) {
    values[j] = x[positions[j]];
  }
}

absl::Status Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

}  // namespace

struct CudaTopK::State {
  size_t max_segment = 0;
  cudaStream_t stream = nullptr;
  unsigned long long* hist = nullptr;  // kBins
  Cut* cut = nullptr;
  uint32_t* scratch_positions = nullptr;  // ties, then the selection
  float* values = nullptr;
  int* counts = nullptr;  // [0] ties, [1] selected
  void* temp = nullptr;
  size_t temp_bytes = 0;
  uint32_t* host_positions = nullptr;  // pinned
  float* host_values = nullptr;        // pinned
  int* host_count = nullptr;           // pinned

  // Finds the cut of the top `quota` of |x[0, len)| by three histogram
  // levels (bits 30..20, 19..9, 8..0) into `cut`.
  absl::Status FindCut(const float* x, size_t len, uint64_t quota, int grid);
  // Selects the entries above the cut (and the ties it admits), gathers
  // their values and copies at most `bound` of them and their count to the
  // host: one synchronization. Returns the count.
  absl::StatusOr<int> SelectAndCopy(const float* x, size_t len, size_t bound,
                                    int grid);

  ~State() {
    cudaFree(hist);
    cudaFree(cut);
    cudaFree(scratch_positions);
    cudaFree(values);
    cudaFree(counts);
    cudaFree(temp);
    cudaFreeHost(host_positions);
    cudaFreeHost(host_values);
    cudaFreeHost(host_count);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

CudaTopK::CudaTopK(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaTopK::~CudaTopK() = default;

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
  const size_t m = s->max_segment;
  const cudaError_t errors[] = {
      cudaStreamCreate(&s->stream),
      cudaMalloc(&s->hist, kBins * sizeof(*s->hist)),
      cudaMalloc(&s->cut, sizeof(Cut)),
      cudaMalloc(&s->scratch_positions, 2 * m * sizeof(uint32_t)),
      cudaMalloc(&s->values, m * sizeof(float)),
      cudaMalloc(&s->counts, 2 * sizeof(int)),
      cudaMallocHost(&s->host_positions, m * sizeof(uint32_t)),
      cudaMallocHost(&s->host_values, m * sizeof(float)),
      cudaMallocHost(&s->host_count, sizeof(int))};
  absl::Status status;
  for (cudaError_t error : errors) {
    if (status.ok()) status = Check(error, "CudaTopK allocation");
  }
  if (status.ok()) {
    // Both selects share one temporary buffer, sized for the larger.
    size_t bytes_a = 0, bytes_b = 0;
    thrust::counting_iterator<uint32_t> first(0);
    status = Check(cub::DeviceSelect::If(
                       nullptr, bytes_a, first, s->scratch_positions, s->counts,
                       static_cast<int>(m), IsTie{nullptr, nullptr}, s->stream),
                   "select size");
    if (status.ok()) {
      status = Check(
          cub::DeviceSelect::If(nullptr, bytes_b, first, s->scratch_positions,
                                s->counts, static_cast<int>(m),
                                IsSelected{nullptr, nullptr}, s->stream),
          "select size");
    }
    s->temp_bytes = std::max(bytes_a, bytes_b);
    if (status.ok()) {
      status = Check(cudaMalloc(&s->temp, s->temp_bytes), "temp");
    }
  }
  if (!status.ok()) return status;
  return std::unique_ptr<CudaTopK>(new CudaTopK(std::move(s)));
}

absl::Status CudaTopK::State::FindCut(const float* x, size_t len,
                                      uint64_t quota, int grid) {
  const int shifts[] = {kTopShift, kMidShift, 0};
  const uint32_t masks[] = {kMidMask, kMidMask, kLowMask};
  const int match[] = {32, kTopShift, kMidShift};
  const int bits[] = {11, 11, 9};
  absl::Status status;
  for (int level = 0; level < 3 && status.ok(); ++level) {
    status = Check(cudaMemsetAsync(hist, 0, kBins * sizeof(*hist), stream),
                   "clear histogram");
    if (status.ok() && level == 0) {
      status =
          Check(cudaMemsetAsync(cut, 0, sizeof(Cut), stream), "clear cut");
    }
    Histogram<<<grid, kThreads, 0, stream>>>(x, len, shifts[level],
                                             masks[level], match[level], cut,
                                             hist);
    Boundary<<<1, kBoundaryThreads, 0, stream>>>(
        hist, static_cast<int>(masks[level] + 1), bits[level], level == 0,
        level == 2, quota, cut);
    if (status.ok()) status = Check(cudaGetLastError(), "histogram launch");
  }
  return status;
}

absl::StatusOr<int> CudaTopK::State::SelectAndCopy(const float* x, size_t len,
                                                   size_t bound, int grid) {
  thrust::counting_iterator<uint32_t> first(0);
  size_t bytes = temp_bytes;
  GM_RETURN_IF_ERROR(Check(
      cub::DeviceSelect::If(temp, bytes, first, scratch_positions, counts,
                            static_cast<int>(len), IsTie{x, cut}, stream),
      "select ties"));
  TieCutoff<<<1, 1, 0, stream>>>(scratch_positions, counts, cut);
  GM_RETURN_IF_ERROR(Check(cudaGetLastError(), "tie cut-off launch"));
  uint32_t* selected = scratch_positions + max_segment;
  bytes = temp_bytes;
  GM_RETURN_IF_ERROR(Check(
      cub::DeviceSelect::If(temp, bytes, first, selected, counts + 1,
                            static_cast<int>(len), IsSelected{x, cut}, stream),
      "select"));
  Gather<<<grid, kThreads, 0, stream>>>(x, selected, counts + 1, values);
  GM_RETURN_IF_ERROR(Check(cudaGetLastError(), "gather launch"));
  // At most `bound` entries are selected, so that many are copied out with
  // the count, before it is known.
  GM_RETURN_IF_ERROR(Check(cudaMemcpyAsync(host_count, counts + 1, sizeof(int),
                                           cudaMemcpyDeviceToHost, stream),
                           "count copy"));
  GM_RETURN_IF_ERROR(
      Check(cudaMemcpyAsync(host_positions, selected, bound * sizeof(uint32_t),
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

absl::StatusOr<std::vector<TopKSelection>> CudaTopK::SegmentedTopKAbs(
    const float* device_x, size_t n, absl::Span<const TopKSegment> segments,
    uint32_t base_index) {
  State& s = *state_;
  std::vector<TopKSelection> out(segments.size());
  const int blocks = 4 * 132;  // enough to fill an H100's 132 SMs
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
    const float* x = device_x + range.begin;
    const int grid = static_cast<int>(
        std::min<size_t>(blocks, (len + kThreads - 1) / kThreads));
    GM_RETURN_IF_ERROR(s.FindCut(x, len, range.quota, grid));
    GM_ASSIGN_OR_RETURN(
        const int count,
        s.SelectAndCopy(x, len, std::min<size_t>(range.quota, len), grid));
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

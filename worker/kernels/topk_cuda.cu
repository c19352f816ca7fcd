#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cub/block/block_scan.cuh>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/kernels/tile_compaction.cuh"
#include "worker/kernels/topk_cuda.h"

namespace gradmesh::kernels {
namespace {

constexpr int kTopShift = 20;
constexpr int kMidShift = 9;
constexpr uint32_t kMidMask = 0x7ff;
constexpr uint32_t kLowMask = 0x1ff;
constexpr int kBins = 2048;
constexpr int kThreads = 256;
// Copies of the first level's shared histogram, so that lanes counting the
// same bin in one instruction mostly hit different words.
constexpr int kCopies = 4;
// Values each thread of the first level loads before counting them.
constexpr int kUnroll = 8;

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

// Adds a block's shared counts to the global histogram.
__device__ void FlushCounts(const unsigned* local, int bins, int copies,
                            unsigned long long* hist) {
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    unsigned sum = 0;
    for (int c = 0; c < copies; ++c) sum += local[b * copies + c];
    if (sum != 0) atomicAdd(&hist[b], sum);
  }
}

// Clears the histogram and the cut, and marks the three compactions' tiles
// not yet scanned. One thread per tile or bin, whichever is more.
__global__ void Reset(TileState a, TileState b, TileState c, int tiles,
                      unsigned long long* hist, Cut* cut) {
  a.InitializeStatus(tiles);
  b.InitializeStatus(tiles);
  c.InitializeStatus(tiles);
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kBins) hist[i] = 0;
  if (i == 0) *cut = Cut{};
}

// First level: histogram of bits 30..20 of every nonzero key.
__global__ void __launch_bounds__(kThreads)
    TopHistogram(const float* x, size_t n, unsigned long long* hist) {
  __shared__ unsigned local[kBins * kCopies];
  for (int b = threadIdx.x; b < kBins * kCopies; b += kThreads) local[b] = 0;
  __syncthreads();
  const int copy = threadIdx.x % kCopies;
  const size_t stride = size_t{gridDim.x} * kThreads * kUnroll;
  for (size_t base = size_t{blockIdx.x} * kThreads * kUnroll + threadIdx.x;
       base < n; base += stride) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + static_cast<size_t>(u) * kThreads;
      v[u] = i < n ? x[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t key = Key(v[u]);
      if (key != 0) atomicAdd(&local[(key >> kTopShift) * kCopies + copy], 1u);
    }
  }
  __syncthreads();
  FlushCounts(local, kBins, kCopies, hist);
}

// Picks the boundary bin of a level, in one block, and clears the histogram
// for the next level: extends the prefix by `bits` bits and lowers `need` by
// the count above the bin. On the first level it also decides take_all; on
// the last it fixes kth and ties. Thread t holds bins bins-1-2t and
// bins-2-2t, so the bins run in descending order and an exclusive sum gives
// each bin the count above it; the boundary is the one bin with
// above < need <= above + count.
constexpr int kBoundaryThreads = kBins / 2;
static_assert(2 * kBoundaryThreads >= kBins, "two bins a thread cover all");

__global__ void __launch_bounds__(kBoundaryThreads)
    Boundary(unsigned long long* hist, int bins, int bits, bool first,
             bool last, unsigned long long k, Cut* cut) {
  using Scan = cub::BlockScan<unsigned long long, kBoundaryThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int found_bin;
  __shared__ unsigned long long found_above;
  unsigned long long counts[2], above[2], total;
  for (int j = 0; j < 2; ++j) {
    const int bin = bins - 1 - (2 * static_cast<int>(threadIdx.x) + j);
    counts[j] = 0;
    if (bin >= 0) {
      counts[j] = hist[bin];
      hist[bin] = 0;
    }
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

// The candidates, in one pass over x: every nonzero key at or above the
// first level's boundary bin, in position order (positions and values), and
// the second level's histogram of the keys in that bin. With take_all,
// every nonzero key.
__global__ void __launch_bounds__(kTileThreads)
    Candidates(const float* x, long long n, const Cut* cut, TileState state,
               uint32_t* positions, float* values, int* count,
               unsigned long long* hist) {
  __shared__ TileStorage storage;
  __shared__ unsigned local[kBins];
  for (int b = threadIdx.x; b < kBins; b += kTileThreads) local[b] = 0;
  __syncthreads();
  const int tile = blockIdx.x;
  const bool take_all = cut->take_all;
  const uint32_t bin = cut->prefix;
  float v[kTileRounds];
  bool flags[kTileRounds];
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    const long long i = TileItem(tile, r);
    v[r] = i < n ? x[i] : 0.0f;
  }
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    const uint32_t key = Key(v[r]);
    flags[r] = key != 0 && (take_all || (key >> kTopShift) >= bin);
    if (key != 0 && !take_all && (key >> kTopShift) == bin) {
      atomicAdd(&local[(key >> kMidShift) & kMidMask], 1u);
    }
  }
  int offsets[kTileRounds];
  const int end = TileOffsets(flags, tile, state, storage, offsets);
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    if (!flags[r]) continue;
    positions[offsets[r]] = static_cast<uint32_t>(TileItem(tile, r));
    values[offsets[r]] = v[r];
  }
  if (threadIdx.x == 0 && tile == gridDim.x - 1) *count = end;
  FlushCounts(local, kBins, 1, hist);  // TileOffsets synchronized the block
}

// Third level: histogram of bits 8..0 of the candidates in the second
// level's boundary bin.
__global__ void __launch_bounds__(kThreads)
    CandidateHistogram(const float* values, const int* count, const Cut* cut,
                       unsigned long long* hist) {
  __shared__ unsigned local[kLowMask + 1];
  if (cut->take_all) return;
  for (int b = threadIdx.x; b <= kLowMask; b += kThreads) local[b] = 0;
  __syncthreads();
  const uint32_t prefix = cut->prefix;
  const int n = *count;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < n;
       i += gridDim.x * kThreads) {
    const uint32_t key = Key(values[i]);
    if ((key >> kMidShift) == prefix) atomicAdd(&local[key & kLowMask], 1u);
  }
  __syncthreads();
  FlushCounts(local, kLowMask + 1, 1, hist);
}

// Loads the candidates of this thread's rounds (key 0 past the end).
__device__ __forceinline__ void LoadCandidates(const float* values, int n,
                                               int tile,
                                               uint32_t (&keys)[kTileRounds]) {
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    const long long i = TileItem(tile, r);
    keys[r] = i < n ? Key(values[i]) : 0;
  }
}

// The cut-off among the ties: the position of the `ties`-th candidate
// whose key is kth.
__global__ void __launch_bounds__(kTileThreads)
    TieCutoff(const uint32_t* positions, const float* values, const int* count,
              Cut* cut, TileState state) {
  __shared__ TileStorage storage;
  const int n = *count;
  const int tile = blockIdx.x;
  if (cut->take_all || cut->ties == 0 ||
      static_cast<long long>(tile) * kTileItems >= n) {
    return;
  }
  const uint32_t kth = cut->kth;
  const long long last = static_cast<long long>(cut->ties) - 1;
  uint32_t keys[kTileRounds];
  LoadCandidates(values, n, tile, keys);
  bool flags[kTileRounds];
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) flags[r] = keys[r] == kth;
  int offsets[kTileRounds];
  TileOffsets(flags, tile, state, storage, offsets);
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    if (flags[r] && offsets[r] == last) {
      cut->cutoff = positions[TileItem(tile, r)];
    }
  }
}

// The selection: the candidates above kth, and the ties up to the cut-off,
// in position order; the count is written by the last candidate's tile (or
// tile 0 when there are none).
__global__ void __launch_bounds__(kTileThreads)
    Select(const uint32_t* positions, const float* values, const int* count,
           const Cut* cut, TileState state, uint32_t* out_positions,
           float* out_values, int* out_count) {
  __shared__ TileStorage storage;
  const int n = *count;
  const int tile = blockIdx.x;
  if (n == 0 && tile == 0 && threadIdx.x == 0) *out_count = 0;
  if (static_cast<long long>(tile) * kTileItems >= n) return;
  uint32_t keys[kTileRounds];
  LoadCandidates(values, n, tile, keys);
  bool flags[kTileRounds];
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    const long long i = TileItem(tile, r);
    flags[r] =
        keys[r] != 0 && (cut->take_all || keys[r] > cut->kth ||
                         (keys[r] == cut->kth && positions[i] <= cut->cutoff));
  }
  int offsets[kTileRounds];
  const int end = TileOffsets(flags, tile, state, storage, offsets);
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    if (!flags[r]) continue;
    const long long i = TileItem(tile, r);
    out_positions[offsets[r]] = positions[i];
    out_values[offsets[r]] = values[i];
  }
  if (threadIdx.x == 0 && tile == (n - 1) / kTileItems) *out_count = end;
}

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
  Cut* cut = nullptr;
  void* tile_memory = nullptr;
  TileState tiles[3];  // candidates, ties, selection
  uint32_t* candidate_positions = nullptr;
  float* candidate_values = nullptr;
  uint32_t* positions = nullptr;  // the selection
  float* values = nullptr;
  int* counts = nullptr;               // [0] candidates, [1] selected
  uint32_t* host_positions = nullptr;  // pinned
  float* host_values = nullptr;        // pinned
  int* host_count = nullptr;           // pinned

  absl::Status Allocate();
  // Enqueues the selection of the top `quota` of |x[0, len)| into
  // positions, values and counts[1].
  absl::Status Enqueue(const float* x, size_t len, uint64_t quota);
  // Copies at most `bound` selected entries and their count to the host:
  // one synchronization. Returns the count.
  absl::StatusOr<int> CopyOut(size_t bound);

  ~State() {
    for (void* p :
         {static_cast<void*>(hist), static_cast<void*>(cut), tile_memory,
          static_cast<void*>(candidate_positions),
          static_cast<void*>(candidate_values), static_cast<void*>(positions),
          static_cast<void*>(values), static_cast<void*>(counts)}) {
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
  size_t tile_bytes = 0;
  GM_RETURN_IF_ERROR(
      Check(TileState::AllocationSize(Tiles(m), tile_bytes), "tile state"));
  tile_bytes = (tile_bytes + 255) / 256 * 256;
  const cudaError_t errors[] = {
      cudaStreamCreate(&stream),
      cudaMalloc(&hist, kBins * sizeof(*hist)),
      cudaMalloc(&cut, sizeof(Cut)),
      cudaMalloc(&tile_memory, 3 * tile_bytes),
      cudaMalloc(&candidate_positions, m * sizeof(uint32_t)),
      cudaMalloc(&candidate_values, m * sizeof(float)),
      cudaMalloc(&positions, m * sizeof(uint32_t)),
      cudaMalloc(&values, m * sizeof(float)),
      cudaMalloc(&counts, 2 * sizeof(int)),
      cudaMallocHost(&host_positions, m * sizeof(uint32_t)),
      cudaMallocHost(&host_values, m * sizeof(float)),
      cudaMallocHost(&host_count, sizeof(int))};
  for (cudaError_t error : errors) {
    GM_RETURN_IF_ERROR(Check(error, "CudaTopK allocation"));
  }
  for (int i = 0; i < 3; ++i) {
    GM_RETURN_IF_ERROR(
        Check(tiles[i].Init(Tiles(m),
                            static_cast<char*>(tile_memory) + i * tile_bytes,
                            tile_bytes),
              "tile state"));
  }
  int device = 0, sms = 0, per_sm = 0;
  GM_RETURN_IF_ERROR(Check(cudaGetDevice(&device), "device"));
  GM_RETURN_IF_ERROR(Check(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
      "multiprocessors"));
  GM_RETURN_IF_ERROR(Check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                               &per_sm, TopHistogram, kThreads, 0),
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
  const int tile_count = Tiles(len);
  const int reset_blocks =
      (std::max(tile_count, kBins) + kThreads - 1) / kThreads;
  Reset<<<reset_blocks, kThreads, 0, stream>>>(tiles[0], tiles[1], tiles[2],
                                               tile_count, hist, cut);
  const int histogram_blocks = static_cast<int>(std::min<size_t>(
      histogram_grid, (len + kThreads * kUnroll - 1) / (kThreads * kUnroll)));
  TopHistogram<<<histogram_blocks, kThreads, 0, stream>>>(x, len, hist);
  Boundary<<<1, kBoundaryThreads, 0, stream>>>(hist, kMidMask + 1, 11, true,
                                               false, quota, cut);
  Candidates<<<tile_count, kTileThreads, 0, stream>>>(
      x, static_cast<long long>(len), cut, tiles[0], candidate_positions,
      candidate_values, counts, hist);
  Boundary<<<1, kBoundaryThreads, 0, stream>>>(hist, kMidMask + 1, 11, false,
                                               false, quota, cut);
  CandidateHistogram<<<candidate_grid, kThreads, 0, stream>>>(
      candidate_values, counts, cut, hist);
  Boundary<<<1, kBoundaryThreads, 0, stream>>>(hist, kLowMask + 1, 9, false,
                                               true, quota, cut);
  TieCutoff<<<tile_count, kTileThreads, 0, stream>>>(
      candidate_positions, candidate_values, counts, cut, tiles[1]);
  Select<<<tile_count, kTileThreads, 0, stream>>>(
      candidate_positions, candidate_values, counts, cut, tiles[2], positions,
      values, counts + 1);
  return Check(cudaGetLastError(), "top-k launch");
}

absl::StatusOr<int> CudaTopK::State::CopyOut(size_t bound) {
  // At most `bound` entries are selected, so that many are copied out with
  // the count, before it is known.
  GM_RETURN_IF_ERROR(Check(cudaMemcpyAsync(host_count, counts + 1, sizeof(int),
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
  return DeviceSelection{s.positions, s.values, s.counts + 1};
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

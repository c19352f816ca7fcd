// The kernels of CudaTopK (topk_cuda.h), in the order they run for one
// selection of the top k of |x[0, n)|:
//
//   Reset              clears the histogram, the cut and the counters
//   TopHistogram       pass 1 over x: histogram of key bits 30..20; its last
//                      block picks the boundary bin (level 1)
//   Candidates         pass 2 over x, one block per tile of kTileItems: the
//                      nonzero keys at or above the boundary bin, kept in
//                      position order within the tile, in a chunk reserved
//                      with one atomic (chunks land in any order); and the
//                      histogram of bits 19..9 of the keys in the bin
//   Boundary           level 2
//   CandidateHistogram bits 8..0 of the candidates left in the bin; its last
//                      block picks level 3: the k-th key and the ties to take
//   TileCounts         per tile: candidates above the k-th key, and ties
//   TileScan           one block: the ties each tile takes (the first ones by
//                      position) and each tile's offset in the output
//   WriteSelection     per tile: the selection, in position order
//
// Only the two passes read all of x; the rest work on the candidates
// (about k plus one bin of the histogram) or on one entry per tile. A key is
// the |x| bit pattern, so keys order as |x| does, NaN above infinity.
#ifndef GRADMESH_WORKER_KERNELS_TOPK_CUDA_KERNELS_CUH_
#define GRADMESH_WORKER_KERNELS_TOPK_CUDA_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

namespace gradmesh::kernels::topk {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRounds = 16;  // loads per thread in a tile
constexpr int kTileItems = kThreads * kRounds;
constexpr int kTopShift = 20;
constexpr int kMidShift = 9;
constexpr uint32_t kMidMask = 0x7ff;
constexpr uint32_t kLowMask = 0x1ff;
constexpr int kBins = 2048;
constexpr int kBinsPerThread = kBins / kThreads;
// Copies of the first level's shared histogram, so that lanes counting the
// same bin in one instruction mostly hit different words.
constexpr int kCopies = 4;
constexpr int kUnroll = 8;  // loads per thread before counting, level 1
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 8;

__device__ __forceinline__ uint32_t Key(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

// The selection's progress. Zero before a selection: kth stays 0 when every
// nonzero key is taken (take_all), so "key > kth" selects them all.
struct Cut {
  unsigned long long need;  // keys still to take at or below the prefix
  uint32_t prefix;          // key bits fixed so far
  uint32_t take_all;        // no more nonzero keys than k
  uint32_t kth;             // the k-th largest key, once known
  unsigned long long ties;  // keys equal to kth to take
};

struct Counters {
  int candidates;    // reserved so far by Candidates
  unsigned done[2];  // blocks finished: TopHistogram, CandidateHistogram
};

// Per tile of x: where its candidates are, and what it contributes.
struct Chunks {
  int* base;    // first candidate
  int* size;    // candidates
  int* above;   // candidates above kth
  int* ties;    // candidates equal to kth
  int* taken;   // ties selected
  int* offset;  // first output position
};

// Item `r` of this thread in its tile: each round of a warp is 32
// consecutive items (coalesced), and warps and rounds follow position order.
__device__ __forceinline__ long long TileItem(int tile, int r) {
  return static_cast<long long>(tile) * kTileItems +
         ((threadIdx.x / 32) * kRounds + r) * 32 + threadIdx.x % 32;
}

// Adds a block's shared counts (`copies` per bin) to the global histogram.
__device__ void FlushCounts(const unsigned* local, int bins, int copies,
                            unsigned long long* hist) {
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    unsigned sum = 0;
    for (int c = 0; c < copies; ++c) sum += local[b * copies + c];
    if (sum != 0) atomicAdd(&hist[b], sum);
  }
}

// True in the block that finishes last; each block calls it once, from all
// its threads, after its global writes, which the last block then sees.
__device__ bool LastBlock(unsigned* done) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1) == gridDim.x - 1;
  __syncthreads();
  return last;
}

// Picks the boundary bin of a level with kThreads threads, and clears the
// histogram for the next level: extends the prefix by `bits` bits and lowers
// `need` by the count above the bin. The first level also sets take_all;
// the last fixes kth and ties. Thread t holds bins bins-1-8t ... bins-8-8t,
// so the bins run in descending order and an exclusive sum gives each bin
// the count above it; the boundary is the one bin with
// above < need <= above + count.
__device__ void PickBoundary(unsigned long long* hist, int bins, int bits,
                             bool first, bool last, unsigned long long k,
                             Cut* cut) {
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int found_bin;
  __shared__ unsigned long long found_above;
  unsigned long long counts[kBinsPerThread], above[kBinsPerThread], total;
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int bin = bins - 1 - (kBinsPerThread * threadIdx.x + j);
    counts[j] = 0;
    if (bin >= 0) {
      counts[j] = __ldcg(&hist[bin]);
      hist[bin] = 0;
    }
  }
  Scan(scan).ExclusiveSum(counts, above, total);
  if (threadIdx.x == 0) {
    if (first) {
      cut->need = k;
      cut->take_all = total <= k;
    }
    found_bin = 0;
    found_above = 0;
  }
  __syncthreads();  // makes thread 0's writes visible to the block
  if (cut->take_all) return;
  const unsigned long long need = cut->need;
  for (int j = 0; j < kBinsPerThread; ++j) {
    if (above[j] < need && need <= above[j] + counts[j]) {
      found_bin = bins - 1 - (kBinsPerThread * threadIdx.x + j);
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

__global__ void Reset(unsigned long long* hist, Cut* cut, Counters* counters) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kBins) hist[i] = 0;
  if (i == 0) {
    *cut = Cut{};
    *counters = Counters{};
  }
}

__global__ void __launch_bounds__(kThreads)
    TopHistogram(const float* x, size_t n, unsigned long long k,
                 unsigned long long* hist, Cut* cut, Counters* counters) {
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
  if (LastBlock(&counters->done[0])) {
    PickBoundary(hist, kBins, 11, true, false, k, cut);
  }
}

// Ranks of this thread's flagged rounds among the tile's flagged items, in
// position order; returns the tile's count.
struct RankStorage {
  int warp_counts[kWarps];
  int warp_offsets[kWarps];
  int total;
  int base;
};

__device__ int BlockRanks(const bool (&flags)[kRounds], RankStorage& storage,
                          int (&ranks)[kRounds]) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1;
  int warp_count = 0;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const unsigned ballot = __ballot_sync(0xffffffffu, flags[r]);
    ranks[r] = warp_count + __popc(ballot & below);
    warp_count += __popc(ballot);
  }
  if (lane == 0) storage.warp_counts[warp] = warp_count;
  __syncthreads();
  if (warp == 0) {
    const int count = lane < kWarps ? storage.warp_counts[lane] : 0;
    int inclusive = count;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (lane < kWarps) storage.warp_offsets[lane] = inclusive - count;
    if (lane == 31) storage.total = inclusive;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRounds; ++r) ranks[r] += storage.warp_offsets[warp];
  return storage.total;
}

__global__ void __launch_bounds__(kThreads)
    Candidates(const float* x, long long n, const Cut* cut, Counters* counters,
               Chunks chunks, uint32_t* positions, float* values,
               unsigned long long* hist) {
  __shared__ RankStorage storage;
  __shared__ unsigned local[kBins];
  for (int b = threadIdx.x; b < kBins; b += kThreads) local[b] = 0;
  __syncthreads();
  const int tile = blockIdx.x;
  const bool take_all = cut->take_all;
  const uint32_t bin = cut->prefix;
  float v[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const long long i = TileItem(tile, r);
    v[r] = i < n ? x[i] : 0.0f;
  }
  bool flags[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const uint32_t key = Key(v[r]);
    flags[r] = key != 0 && (take_all || (key >> kTopShift) >= bin);
    if (key != 0 && !take_all && (key >> kTopShift) == bin) {
      atomicAdd(&local[(key >> kMidShift) & kMidMask], 1u);
    }
  }
  int ranks[kRounds];
  const int count = BlockRanks(flags, storage, ranks);
  if (threadIdx.x == 0) {
    storage.base = count == 0 ? 0 : atomicAdd(&counters->candidates, count);
    chunks.base[tile] = storage.base;
    chunks.size[tile] = count;
  }
  __syncthreads();
  const int base = storage.base;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    if (!flags[r]) continue;
    positions[base + ranks[r]] = static_cast<uint32_t>(TileItem(tile, r));
    values[base + ranks[r]] = v[r];
  }
  FlushCounts(local, kBins, 1, hist);
}

__global__ void __launch_bounds__(kThreads)
    Boundary(unsigned long long* hist, int bins, int bits, bool last,
             unsigned long long k, Cut* cut) {
  PickBoundary(hist, bins, bits, false, last, k, cut);
}

__global__ void __launch_bounds__(kThreads)
    CandidateHistogram(const float* values, unsigned long long k,
                       unsigned long long* hist, Cut* cut, Counters* counters) {
  __shared__ unsigned local[kLowMask + 1];
  if (!cut->take_all) {
    for (int b = threadIdx.x; b <= kLowMask; b += kThreads) local[b] = 0;
    __syncthreads();
    const uint32_t prefix = cut->prefix;
    const int n = counters->candidates;
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < n;
         i += gridDim.x * kThreads) {
      const uint32_t key = Key(values[i]);
      if ((key >> kMidShift) == prefix) atomicAdd(&local[key & kLowMask], 1u);
    }
    __syncthreads();
    FlushCounts(local, kLowMask + 1, 1, hist);
  }
  if (LastBlock(&counters->done[1])) {
    PickBoundary(hist, kLowMask + 1, 9, false, true, k, cut);
  }
}

// The tile of this thread's warp (one warp per tile), or -1 past the last.
__device__ __forceinline__ int WarpTile(int tiles) {
  const int tile = blockIdx.x * kWarps + threadIdx.x / 32;
  return tile < tiles ? tile : -1;
}

__global__ void __launch_bounds__(kThreads)
    TileCounts(const float* values, Chunks chunks, int tiles, const Cut* cut) {
  const int tile = WarpTile(tiles);
  if (tile < 0) return;
  const uint32_t kth = cut->kth;
  const int begin = chunks.base[tile];
  const int end = begin + chunks.size[tile];
  unsigned above = 0, ties = 0;
  for (int i = begin + threadIdx.x % 32; i < end; i += 32) {
    const uint32_t key = Key(values[i]);
    above += key > kth;
    ties += key == kth;
  }
  above = __reduce_add_sync(0xffffffffu, above);
  ties = __reduce_add_sync(0xffffffffu, ties);
  if (threadIdx.x % 32 == 0) {
    chunks.above[tile] = static_cast<int>(above);
    chunks.ties[tile] = static_cast<int>(ties);
  }
}

// One block of kScanThreads: tiles take the ties in position order, up to
// cut->ties, and each tile's output starts after the earlier tiles'.
__global__ void __launch_bounds__(kScanThreads)
    TileScan(Chunks chunks, int tiles, const Cut* cut, int* out_count) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  const long long need = static_cast<long long>(cut->ties);
  long long ties_before = 0;
  int out_before = 0;
  for (int start = 0; start < tiles; start += kScanThreads * kScanItems) {
    int ties[kScanItems], above[kScanItems];
    for (int j = 0; j < kScanItems; ++j) {
      const int t = start + threadIdx.x * kScanItems + j;
      ties[j] = t < tiles ? chunks.ties[t] : 0;
      above[j] = t < tiles ? chunks.above[t] : 0;
    }
    int earlier[kScanItems], total;
    Scan(scan).ExclusiveSum(ties, earlier, total);
    __syncthreads();
    int selected[kScanItems];
    for (int j = 0; j < kScanItems; ++j) {
      const long long left = need - (ties_before + earlier[j]);
      const int taken =
          static_cast<int>(left <= 0 ? 0 : (left < ties[j] ? left : ties[j]));
      const int t = start + threadIdx.x * kScanItems + j;
      if (t < tiles) chunks.taken[t] = taken;
      selected[j] = above[j] + taken;
    }
    ties_before += total;
    Scan(scan).ExclusiveSum(selected, earlier, total);
    __syncthreads();
    for (int j = 0; j < kScanItems; ++j) {
      const int t = start + threadIdx.x * kScanItems + j;
      if (t < tiles) chunks.offset[t] = out_before + earlier[j];
    }
    out_before += total;
  }
  if (threadIdx.x == 0) *out_count = out_before;
}

__global__ void __launch_bounds__(kThreads)
    WriteSelection(const uint32_t* positions, const float* values,
                   Chunks chunks, int tiles, const Cut* cut,
                   uint32_t* out_positions, float* out_values) {
  const int tile = WarpTile(tiles);
  if (tile < 0) return;
  const uint32_t kth = cut->kth;
  const unsigned below = (1u << (threadIdx.x % 32)) - 1;
  const int begin = chunks.base[tile];
  const int end = begin + chunks.size[tile];
  int out = chunks.offset[tile];
  int ties_left = chunks.taken[tile];
  for (int first = begin; first < end; first += 32) {
    const int i = first + threadIdx.x % 32;
    const uint32_t key = i < end ? Key(values[i]) : 0;
    const unsigned tie_ballot =
        __ballot_sync(0xffffffffu, key == kth && i < end);
    const bool tie_taken =
        key == kth && i < end &&
        static_cast<int>(__popc(tie_ballot & below)) < ties_left;
    const bool selected = (key > kth && i < end) || tie_taken;
    const unsigned ballot = __ballot_sync(0xffffffffu, selected);
    if (selected) {
      out_positions[out + __popc(ballot & below)] = positions[i];
      out_values[out + __popc(ballot & below)] = values[i];
    }
    out += __popc(ballot);
    ties_left -= static_cast<int>(__popc(tie_ballot));
  }
}

}  // namespace gradmesh::kernels::topk

#endif  // GRADMESH_WORKER_KERNELS_TOPK_CUDA_KERNELS_CUH_

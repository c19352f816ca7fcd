// The kernels of CudaTopK (topk_cuda.h), in the order they run for one
// selection of the top k of |x[0, n)|:
//
//   Reset              clears the histogram, the cut and the counters
//   TopHistogram       pass 1 over x: histogram of key bits 30..20
//   Boundary           the boundary bin of level 1
//   Candidates         pass 2 over x, one block per tile of kTileItems: the
//                      nonzero keys at or above the boundary bin, kept in
//                      position order within the tile, in a chunk reserved
//                      with one atomic (chunks land in any order); and the
//                      histogram of bits 19..9 of the keys in the bin
//   Boundary           level 2
//   CandidateHistogram bits 8..0 of the candidates left in the bin; its last
//                      block picks level 3: the k-th key and the ties to take
//   TileCounts         per tile: candidates above the k-th key, and ties,
//                      packed in one word (above << 32 | ties)
//   (cub::DeviceScan)  exclusive sum of the packed counts: both prefixes
//   WriteSelection     per tile: the selection (keys above the k-th, then
//                      the first ties by position) at its place
//
// Only the two passes read all of x; the rest work on the candidates
// (about k plus one bin of the histogram) or on one entry per tile. A key is
// the |x| bit pattern, so keys order as |x| does, NaN above infinity.
// Included by topk_cuda.cu alone; needs sm_80 (__reduce_add_sync).
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
  int candidates;  // reserved so far by Candidates
  unsigned done;   // CandidateHistogram's blocks finished
};

// Per tile of x: where its candidates are, and their counts above kth and
// at kth, packed as above << 32 | ties (sums of them stay packed: both are
// below 2^31), alone and summed over the earlier tiles.
struct Chunks {
  int* base;
  int* size;
  unsigned long long* counts;
  unsigned long long* earlier;
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
  if (threadIdx.x == 0) {
    last = atomicAdd(done, 1) == gridDim.x - 1;
    __threadfence();  // what the others wrote before counting, seen after
  }
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

// Counts a tile's flagged items: bit r of `flags` is this thread's round
// r. Returns the tile's count; storage.warp_offsets[w] is the count before
// warp w.
struct RankStorage {
  int warp_counts[kWarps];
  int warp_offsets[kWarps];
  int total;
  int base;
};

__device__ int CountTile(unsigned flags, RankStorage& storage) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int warp_count = 0;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    warp_count += __popc(__ballot_sync(0xffffffffu, (flags >> r) & 1));
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
  return storage.total;
}

__global__ void __launch_bounds__(kThreads, 8)
    Candidates(const float* x, long long n, const Cut* cut, Counters* counters,
               Chunks chunks, uint32_t* positions, float* values,
               unsigned long long* hist) {
  __shared__ RankStorage storage;
  const int tile = blockIdx.x;
  const bool take_all = cut->take_all;
  const uint32_t bin = cut->prefix;
  float v[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const long long i = TileItem(tile, r);
    v[r] = i < n ? x[i] : 0.0f;
  }
  unsigned flags = 0;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const uint32_t key = Key(v[r]);
    if (key != 0 && (take_all || (key >> kTopShift) >= bin)) flags |= 1u << r;
    if (key != 0 && !take_all && (key >> kTopShift) == bin) {
      // Few keys share a bin, except where many |x| are equal (clipped or
      // quantized values): then these atomics queue on one address.
      atomicAdd(&hist[(key >> kMidShift) & kMidMask], 1ull);
    }
  }
  const int count = CountTile(flags, storage);
  if (threadIdx.x == 0) {
    storage.base = count == 0 ? 0 : atomicAdd(&counters->candidates, count);
    chunks.base[tile] = storage.base;
    chunks.size[tile] = count;
  }
  __syncthreads();
  const unsigned below = (1u << (threadIdx.x % 32)) - 1;
  int out = storage.base + storage.warp_offsets[threadIdx.x / 32];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const bool flagged = (flags >> r) & 1;
    const unsigned ballot = __ballot_sync(0xffffffffu, flagged);
    if (flagged) {
      positions[out + __popc(ballot & below)] =
          static_cast<uint32_t>(TileItem(tile, r));
      values[out + __popc(ballot & below)] = v[r];
    }
    out += __popc(ballot);
  }
}

__global__ void __launch_bounds__(kThreads)
    Boundary(unsigned long long* hist, bool first, unsigned long long k,
             Cut* cut) {
  PickBoundary(hist, kBins, 11, first, false, k, cut);
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
    for (long long i = blockIdx.x * kThreads + threadIdx.x; i < n;
         i += gridDim.x * kThreads) {
      const uint32_t key = Key(values[i]);
      if ((key >> kMidShift) == prefix) atomicAdd(&local[key & kLowMask], 1u);
    }
    __syncthreads();
    FlushCounts(local, kLowMask + 1, 1, hist);
  }
  if (LastBlock(&counters->done)) {
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
  for (long long i = begin + threadIdx.x % 32; i < end; i += 32) {
    const uint32_t key = Key(values[i]);
    above += key > kth;
    ties += key == kth;
  }
  above = __reduce_add_sync(0xffffffffu, above);
  ties = __reduce_add_sync(0xffffffffu, ties);
  if (threadIdx.x % 32 == 0) {
    chunks.counts[tile] = (static_cast<unsigned long long>(above) << 32) | ties;
  }
}

// Each tile writes its candidates above kth and the ties it takes: the
// ties go to the earliest tiles first, up to cut->ties, so a tile's output
// starts after the earlier tiles' candidates above kth and the ties they
// took. The last tile writes the count.
__global__ void __launch_bounds__(kThreads)
    WriteSelection(const uint32_t* positions, const float* values,
                   Chunks chunks, int tiles, const Cut* cut,
                   uint32_t* out_positions, float* out_values, int* out_count) {
  const int tile = WarpTile(tiles);
  if (tile < 0) return;
  const uint32_t kth = cut->kth;
  const long long need = static_cast<long long>(cut->ties);
  const unsigned long long earlier = chunks.earlier[tile];
  const long long ties_before = static_cast<long long>(earlier & 0xffffffffu);
  const long long ties_here =
      static_cast<long long>(chunks.counts[tile] & 0xffffffffu);
  int out = static_cast<int>((earlier >> 32) + min(need, ties_before));
  int ties_left =
      static_cast<int>(max(0ll, min(need - ties_before, ties_here)));
  const unsigned below = (1u << (threadIdx.x % 32)) - 1;
  const int begin = chunks.base[tile];
  const int end = begin + chunks.size[tile];
  for (long long first = begin; first < end; first += 32) {
    const long long i = first + threadIdx.x % 32;
    const uint32_t key = i < end ? Key(values[i]) : 0;
    const bool tie = key == kth && i < end;
    const unsigned tie_ballot = __ballot_sync(0xffffffffu, tie);
    const bool selected =
        (key > kth && i < end) ||
        (tie && static_cast<int>(__popc(tie_ballot & below)) < ties_left);
    const unsigned ballot = __ballot_sync(0xffffffffu, selected);
    if (selected) {
      out_positions[out + __popc(ballot & below)] = positions[i];
      out_values[out + __popc(ballot & below)] = values[i];
    }
    out += __popc(ballot);
    ties_left -= static_cast<int>(__popc(tie_ballot));
  }
  if (tile == tiles - 1 && threadIdx.x % 32 == 0) *out_count = out;
}

}  // namespace gradmesh::kernels::topk

#endif  // GRADMESH_WORKER_KERNELS_TOPK_CUDA_KERNELS_CUH_

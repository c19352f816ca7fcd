// Order-preserving compaction in one pass (CUDA): each block takes one tile
// of kTileItems consecutive items, flags some, and learns where its flagged
// items go in the output from a decoupled look-back over the earlier tiles
// (CUB's ScanTileState and TilePrefixCallbackOp). Every pass over an array
// reads it once, with coalesced loads: item r of lane l in warp w is item
// (w * kTileRounds + r) * 32 + l of the tile, so each round of a warp is one
// 128-byte line.
//
// A kernel using it runs kTileThreads threads per block, one block per tile,
// tile = blockIdx.x, on a ScanTileState whose InitializeStatus ran for at
// least gridDim.x tiles since its last use. Blocks past the data may return
// before calling it; a block that calls it must call it from all its threads.
#ifndef GRADMESH_WORKER_KERNELS_TILE_COMPACTION_CUH_
#define GRADMESH_WORKER_KERNELS_TILE_COMPACTION_CUH_

#include <cub/agent/single_pass_scan_operators.cuh>
#include <cuda/std/functional>

namespace gradmesh::kernels {

constexpr int kTileThreads = 256;
constexpr int kTileWarps = kTileThreads / 32;
constexpr int kTileRounds = 16;
constexpr int kTileItems = kTileThreads * kTileRounds;

using TileState = cub::ScanTileState<int>;

struct TileStorage {
  using Prefix = cub::TilePrefixCallbackOp<int, ::cuda::std::plus<>, TileState>;
  typename Prefix::TempStorage prefix;
  int warp_counts[kTileWarps];
  int warp_offsets[kTileWarps];
  int tile_offset;
  int tile_count;
};

// Position of round `r` of this thread in its tile.
__device__ __forceinline__ long long TileItem(int tile, int r) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  return static_cast<long long>(tile) * kTileItems +
         (warp * kTileRounds + r) * 32 + lane;
}

// Sets offsets[r] to the output position of every flagged round (in item
// order, after all flagged items of earlier tiles) and returns the number
// of flagged items up to the end of this tile.
__device__ __forceinline__ int TileOffsets(const bool (&flags)[kTileRounds],
                                           int tile, TileState& state,
                                           TileStorage& storage,
                                           int (&offsets)[kTileRounds]) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1;
  int warp_count = 0;
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) {
    const unsigned ballot = __ballot_sync(0xffffffffu, flags[r]);
    offsets[r] = warp_count + __popc(ballot & below);
    warp_count += __popc(ballot);
  }
  if (lane == 0) storage.warp_counts[warp] = warp_count;
  __syncthreads();
  if (warp == 0) {
    const int count = lane < kTileWarps ? storage.warp_counts[lane] : 0;
    int inclusive = count;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (lane < kTileWarps) storage.warp_offsets[lane] = inclusive - count;
    const int tile_count = __shfl_sync(0xffffffffu, inclusive, 31);
    int tile_offset = 0;
    if (tile == 0) {
      if (lane == 0) state.SetInclusive(0, tile_count);
    } else {
      TileStorage::Prefix prefix(state, storage.prefix, ::cuda::std::plus<>{},
                                 tile);
      tile_offset = prefix(tile_count);  // valid in lane 0
    }
    if (lane == 0) {
      storage.tile_offset = tile_offset;
      storage.tile_count = tile_count;
    }
  }
  __syncthreads();
  const int base = storage.tile_offset + storage.warp_offsets[warp];
#pragma unroll
  for (int r = 0; r < kTileRounds; ++r) offsets[r] += base;
  return storage.tile_offset + storage.tile_count;
}

}  // namespace gradmesh::kernels

#endif  // GRADMESH_WORKER_KERNELS_TILE_COMPACTION_CUH_

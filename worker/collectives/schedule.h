// Schedules as data: who sends which blocks to whom at every step.
//
// Pure integer functions of (group size, position): no I/O, no threads, so
// they are checked exhaustively for every group size up to 1024. Positions
// and block numbers are 0-based and taken modulo the group size p; the
// executor maps positions to ranks.
//
// Spar-Reduce-Scatter (SparDL, Section III-B), p = 6, position w:
//
//   bags of w:  B0 = {w}   B1 = {w+1}   B2 = {w+2, w+3}   B3 = {w+4, w+5}
//   l = ceil(log2 p) = 3, E = p - 2^(l-1) = 2 blocks in the last bag
//
//   step i   distance 2^(l-i)   sends bag        receives (blocks w, w+1, ..)
//   1        4                  B3 to w+4        E blocks from w-4
//   2        2                  B2 to w+2        2 blocks from w-2
//   3        1                  B1 to w+1        1 block from w-1
//
// (The paper's Example 2 names worker 2 as worker 1's step-1 source; by
// Theorem 1 it is worker 1 - 4 = worker 3, 1-based. The theorem is followed.)
// The bag received at step i always starts at block w and is a subset of the
// blocks w still holds; after l steps w holds block w alone.
//
// Bruck all-gather (Bruck et al.), group size p, position w: after step s
// position w holds blocks w .. w+2^s-1. At step s it sends the first
// min(2^s, p-2^s) of them to w-2^s and receives as many from w+2^s
// (blocks w+2^s ..). ceil(log2 p) steps; every block arrives exactly once.
//
// Recursive doubling (R-SAG): at step t, group member g exchanges with
// g XOR 2^t; log2(p) steps, p a power of two.
#ifndef GRADMESH_WORKER_COLLECTIVES_SCHEDULE_H_
#define GRADMESH_WORKER_COLLECTIVES_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "worker/sparse/sparse_block.h"

namespace gradmesh::collectives {

// ceil(log2(p)) for p >= 1.
int CeilLog2(int p);
bool IsPowerOfTwo(int p);

// Block b of `parts` contiguous blocks of [0, n): begin = floor(b * n / parts).
// Sizes differ by at most one; blocks may be empty when n < parts.
sparse::IndexRange BlockRange(uint64_t n, int parts, int b);

// Quota of block b when k values are split over `parts` blocks: floor(k/parts),
// plus one for the first k mod parts blocks, capped at `block_size`. The
// quotas add up to at most k.
uint64_t BlockQuota(uint64_t k, int parts, int b, uint64_t block_size);

// `count` consecutive blocks starting at `first`, modulo the group size.
struct BlockRun {
  int first = 0;
  int count = 0;
  friend bool operator==(const BlockRun&, const BlockRun&) = default;
};

// One step of a pairwise schedule, in group positions.
struct Step {
  int send_to = 0;
  int recv_from = 0;
  BlockRun send;
  BlockRun recv;
  friend bool operator==(const Step&, const Step&) = default;
};

// The Spar-Reduce-Scatter steps of position w in a group of p (p >= 1).
std::vector<Step> PlanSparReduceScatter(int p, int w);

// The Bruck all-gather steps of position w in a group of p (p >= 1).
std::vector<Step> PlanBruckAllGather(int p, int w);

// The partner of member g at each recursive-doubling step (p a power of two).
std::vector<int> PlanRecursiveDoubling(int p, int g);

// d teams of P/d consecutive ranks: rank = team * team_size + position.
// Consecutive ranks share a team, so the heavier in-team traffic (SRS and
// the final all-gather) stays between neighbours, which usually share a host
// or a switch.
struct TeamLayout {
  int world_size = 1;
  int teams = 1;

  int team_size() const { return world_size / teams; }
  int team_of(int rank) const { return rank / team_size(); }
  int position_of(int rank) const { return rank % team_size(); }
  int rank_of(int team, int position) const {
    return team * team_size() + position;
  }
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_SCHEDULE_H_

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
//
// Binomial tree (gTopk), p = 6, levels = ceil(log2 p) = 3:
//
//   level 0:  1 -> 0   3 -> 2   5 -> 4        (w % 2 == 1 sends to w - 1)
//   level 1:  2 -> 0            6 absent      (w % 4 == 2 sends to w - 2)
//   level 2:  4 -> 0                          (w % 8 == 4 sends to w - 4)
//
// Reduce: a position receives from w + 2^t at every level t below the one
// where it sends to its parent (the root never sends). Broadcast runs the
// same edges from the top level down, in the other direction.
//
// Ring (dense all-reduce), p positions, w sends to w+1, receives from w-1:
// reduce-scatter step s (0..p-2) sends block w-s and receives block w-s-1,
// so after p-1 steps w holds the sum of block w+1; all-gather step s sends
// block w+1-s and receives block w-s.
//
// Rotation (SparCML's split, Ok-Topk): step s (1..p-1) sends to w+s and
// receives from w-s, so that no position is the target of two senders at
// once.
//
// Ok-Topk's balance: ranks hold counts[r] values, concatenated in rank order;
// when the largest count passes 4x the mean, rank j ends with positions
// [j*total/p, (j+1)*total/p) of the concatenation, each moved by the
// rotation from the rank that holds it.
//
// Tag spaces: every message of one operation is tagged with a step number;
// an algorithm's phases number their steps from PhaseStep(phase, 0), each
// phase kPhaseSteps apart, so no schedule may take more than kPhaseSteps
// steps in a phase.
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

// BlockQuota at round `round` of a run: when k < parts, some blocks get no
// quota, so the k units move on by one block per round and every block
// carries one within `parts` rounds (no residual grows without bound). With
// k >= parts every block has a quota and nothing moves.
uint64_t RotatedBlockQuota(uint64_t k, int parts, int b, uint64_t block_size,
                           uint64_t round);

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

// Steps of one phase of an operation: a phase takes at most this many, so a
// world holds at most this many workers (a ring or rotation phase takes
// p - 1 steps).
inline constexpr uint32_t kPhaseSteps = 1u << 12;
// Every tag step of one schedule lies below it (phases below
// kPartSteps / kPhaseSteps, checked), so a composite operation can run a
// second schedule from it (OpContext::first_step).
inline constexpr uint32_t kPartSteps = 1u << 31;

// The tag step of `step` in phase `phase` (phases 0, 1, 2, ... of one
// algorithm's operation). step < kPhaseSteps (checked).
uint32_t PhaseStep(int phase, uint32_t step = 0);

// One edge of a binomial tree, as one position sees it.
struct TreeStep {
  int level = 0;  // the tag step within the phase
  int peer = 0;
  bool send = false;  // false: receive from peer
  friend bool operator==(const TreeStep&, const TreeStep&) = default;
};

// The reduce steps of position w in a tree of p (p >= 1), in order: receive
// from each child, then (unless w is the root 0) send to the parent.
std::vector<TreeStep> PlanTreeReduce(int p, int w);

// The broadcast steps of position w, root 0: receive from the parent, then
// send to each child, the farthest first.
std::vector<TreeStep> PlanTreeBroadcast(int p, int w);

// The ring's steps of position w (p >= 1): send_to w+1, recv_from w-1, one
// block each way (BlockRun count 1). p - 1 steps each.
std::vector<Step> PlanRingReduceScatter(int p, int w);
std::vector<Step> PlanRingAllGather(int p, int w);

// The rotation's steps of position w: step s (1..p-1, at index s-1) sends
// to w+s and receives from w-s; send = {w+s, 1} (the destination's block),
// recv = {w, 1}.
std::vector<Step> PlanRotation(int p, int w);

// Positions [begin, end) of a concatenation.
struct PositionRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  friend bool operator==(const PositionRange&, const PositionRange&) = default;
};

// Ok-Topk's balance of the concatenation of counts[0..p-1]; made by
// PlanBalance (p >= 1).
struct Balance {
  std::vector<uint64_t> offsets;  // p + 1 prefix sums of the counts
  bool needed = false;            // the largest count passes 4x the mean

  uint64_t total() const { return offsets.back(); }
  // The positions that rank `from` sends to rank `to` when balancing (from
  // == to: what it keeps); empty when they share none.
  PositionRange Transfer(int from, int to) const;
};
Balance PlanBalance(const std::vector<uint64_t>& counts);

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

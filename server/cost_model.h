// The alpha-beta cost model of SparDL (paper 000, Section III-D, Table I),
// used by the coordinator to rank the team counts d it autotunes.
//
// A worker's all-reduce costs `rounds` latencies alpha plus the bytes it
// receives times beta. For P workers in d teams of p = P/d, k =
// collectives::SelectionSize(n, density) and 8 bytes a value (4-byte index,
// 4-byte value; Table I's "2k beta" counts 4-byte words):
//
//   rounds = 2 ceil(log2 p) + SAG rounds,  SAG = log2 d (R-SAG, d a power of
//            two) or ceil(log2 d) (B-SAG); d = 1 has no SAG phase
//   values = k (P-d)/P                     SRS inside the team
//          + SAG values                    across teams, see below
//          + k (P-d)/P                     Bruck all-gather inside the team
//   bytes  = 8 values
//
//   R-SAG: (dk/P) log2 d, eq. (5): log2 d exchanges of blocks of dk/P.
//   B-SAG: (d-1) k/P, the Bruck all-gather of d top-h blocks at h = k/P.
//
// B-SAG's cost is a range in the paper (it depends on how much the teams'
// indexes overlap). We model Algorithm 2's operating point for disjoint
// indexes: h = k/P, so the gathered union holds L = dk/P values and the
// final all-gather moves full blocks of dk/P, as with R-SAG. That lies inside
// eq. (10)'s range, 2(d-1)(P-d)/(Pd) k words above its lower bound and
// 2(d-1)^2/P k words below its upper bound. (Table I prints the lower bound
// as 2(d^2+P-2d)/(Pd) k; summing eqs. (6), (8) and (9) gives 2(Pd+P-2d)/(Pd) k,
// which is also the only form that reduces to SparDL's 4(P-1)/P k at d = 1.)
//
//   CommCost cost = SparDlCost(/*world_size=*/8, /*teams=*/2, n, 0.01);
//   double seconds = ModelSeconds(cost, LinkModel{});
//
// Pure functions; thread-safe.
#ifndef GRADMESH_SERVER_COST_MODEL_H_
#define GRADMESH_SERVER_COST_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace gradmesh::server {

struct LinkModel {
  double alpha_s = 50e-6;                 // latency per round, seconds
  double beta_s_per_byte = 1.0 / 1.25e9;  // seconds per byte (10 Gbit/s)
};

// What one all-reduce costs one worker.
struct CommCost {
  int rounds = 0;
  double bytes = 0;  // received
};

// SparDL's cost for `teams` (d) teams over `world_size` (P) workers and a
// gradient of n values, per the formula above: the table of algorithms'
// spardl entry (collectives/registry.h) at its model point. d must divide P
// (checked: the caller picks d from ValidTeamCounts).
CommCost SparDlCost(int world_size, int teams, uint64_t n, double density);

// The dense ring's cost (the table's dense entry): 2 (P-1) rounds and
// 2 (P-1)/P n values of 4 bytes.
CommCost DenseRingCost(int world_size, uint64_t n);

// rounds * alpha + bytes * beta.
double ModelSeconds(const CommCost& cost, const LinkModel& link);

// One measured all-reduce of one worker.
struct LinkSample {
  int rounds = 0;
  double bytes = 0;
  double seconds = 0;
};

// Least squares of seconds ~ alpha * rounds + beta * bytes (no intercept).
// Returns `fallback` unless the samples span two directions in the (rounds,
// bytes) plane (the normal equations are well conditioned) and both fitted
// coefficients are positive.
LinkModel FitLinkModel(absl::Span<const LinkSample> samples,
                       const LinkModel& fallback);

// The team counts SparDL accepts for P workers: the divisors of P, ascending
// (empty for P < 1).
std::vector<int> ValidTeamCounts(int world_size);

// One candidate d as the autotune ranks it.
struct TeamCountModel {
  int teams = 0;
  CommCost cost;
  double seconds = 0;    // ModelSeconds(cost, link)
  bool skipped = false;  // modeled over skip_factor x the best
};

// Every valid d for P workers, ranked the way the coordinator's autotune
// ranks its candidates (coordinator.h) and `gradmesh sim` reports the
// model's pick: by modeled seconds, ties to the smaller d, so the first is
// the model's choice. With n = 0 (not known yet) the bytes are 0, the rounds
// rank and nothing is skipped. skip_factor >= 1.
std::vector<TeamCountModel> RankTeamCounts(int world_size, uint64_t n,
                                           double density,
                                           const LinkModel& link,
                                           double skip_factor);

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_COST_MODEL_H_

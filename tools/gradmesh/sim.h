// `gradmesh sim`: the real algorithms on a simulated network.
//
// Simulate runs P in-process workers (one thread each, the engine and the
// algorithm as a worker daemon runs them, without the daemon's own passes
// over shared memory and its agreement round of ceil(log2 P) small
// messages) over a
// transport::SimulatedNetwork, whose clocks say what each all-reduce would
// take on alpha-beta links with this machine's (or the given) cost per value
// of computation. Rounds and bytes are what the schedules really sent.
//
// Large P x n. Every worker holds its gradient, residual and the algorithm's
// buffers in this process, so when P x n is too large for `max_values` the
// case runs at a smaller n' (SimulatedValues) and the network counts every
// byte and every value n/n' times (SimOptions::scale). k' = density x n'
// keeps the density, so block quotas, index overlaps and the result's
// density are those of the smaller run: rounds are exact, bytes and compute
// scale linearly, which holds while each block quota stays well above 1
// (SimResult::min_block_quota says how far it is).
//
//   SimCase c{.algorithm = {.algorithm = "spardl", .density = 0.01,
//                           .teams = 8},
//             .workers = 512, .n = 25'000'000};
//   GM_ASSIGN_OR_RETURN(SimResult r, Simulate(c));
#ifndef GRADMESH_TOOLS_GRADMESH_SIM_H_
#define GRADMESH_TOOLS_GRADMESH_SIM_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collectives/registry.h"
#include "worker/transport/simulated.h"

namespace gradmesh::tools {

struct SimCase {
  collectives::AlgorithmOptions algorithm;  // algorithm, density, teams...
  int workers = 4;                          // P, 1..collectives::kMaxWorldSize
  uint64_t n = 1 << 20;                     // values per worker, as modeled
  // Values held across all workers, at most: bounds the memory (about 4
  // bytes a value, 2-3 GiB at the default).
  uint64_t max_values = uint64_t{1} << 29;
  int iterations = 3;  // 1..kMaxSimIterations; residuals carry over
  uint64_t seed = 1;   // of the synthetic gradients (synthetic.h)
  // Real time an operation may take before it fails (a schedule that
  // waits for a message never sent ends here).
  absl::Duration timeout = absl::Minutes(10);
  transport::SimLink link;
  transport::SimCompute compute;
};

inline constexpr int kMaxSimIterations = 1000;

struct SimResult {
  uint64_t simulated_n = 0;  // n', per worker
  double scale = 1;          // n / n'
  // The smallest quota the algorithm selects at n' (SparDL: d k'/P): the
  // scaled figures are rough when it is near 1.
  double min_block_quota = 0;
  // Per iteration, the slowest worker's clock at the end.
  std::vector<double> seconds;
  double mean_seconds = 0;
  // The seconds of the slowest worker's clock charged for computation, mean
  // over the iterations.
  double compute_seconds = 0;
  // Rounds: the most of any worker in any iteration. Bytes received by a
  // worker: the most over workers and the mean over workers, each averaged
  // over the iterations and scaled to n.
  int max_rounds = 0;
  double max_bytes_received = 0;
  double mean_bytes_received = 0;
};

// n' for a case: n, or the largest that keeps P x (the memory a worker
// needs, in values) within max_values. A worker needs about 3 n' (gradient,
// residual, working copy); the all-gather algorithms (topka, gaussiank) also
// hold every worker's k' values at 8 bytes each, 2 P k'. Not counted: about
// 1 MiB a worker thread for the top-k kernel's histograms while it selects.
// 0 for a case with no valid P or density.
uint64_t SimulatedValues(const SimCase& c);

// OK, or InvalidArgument with a message naming the flag at fault (the
// `gradmesh sim` flag names).
absl::Status ValidateCase(const SimCase& c);

// Runs the case. ValidateCase's errors; the algorithm's error if a worker
// failed (DeadlineExceeded past c.timeout).
absl::StatusOr<SimResult> Simulate(const SimCase& c);

// This machine's cost per value of each kind of work on one core while
// every core works (one measuring thread per core up to 16, the threads
// starting each kind together, each on its own 16Mi
// synthetic values: 64 MiB, beyond the caches, as a gradient is, and memory
// bandwidth shared as when workers compute at once): top-k at 1% of each
// 1Mi chunk (select), sparse::Add of two 10% selections (merge),
// AccumulateFinite (accumulate); each the best of repeated timings over
// about 0.2 s, averaged over the threads. Takes a few seconds.
transport::SimCompute Calibrate();

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_SIM_H_

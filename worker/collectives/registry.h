// The table of algorithms: one entry per algorithm holds everything the rest
// of the system knows about it (its name, what it honours, its cost formula,
// its factory), so that `gradmesh replay`, `sim`, the daemons and the
// coordinator's model all read the same facts.
//
// Adding an algorithm: its own files (a Collective, its header with its
// schedule), one entry in registry.cc with its cost formula and factory, its
// tests (docs/design.md).
//
// Costs: SparDL's Table I (paper 000) for SparDL, TopkA, TopkDSA, gTopk and
// Ok-Topk, and the ring's 2 (P-1) rounds and 2 (P-1)/P n values for the
// dense ring. Bytes count 8 a sparse value (Table I's "2k beta" counts
// 4-byte words: an index and a value) and 4 a dense one; log P is read as
// ceil(log2 P), the rounds of the Bruck and tree schedules for any P. Where
// Table I gives a range (TopkDSA, Ok-Topk, SparDL with B-SAG), min_bytes <
// max_bytes. SparDL with B-SAG: the lower bound is the sum of eqs. (6), (8)
// and (9), 2 (Pd + P - 2d)/(Pd) k words, not the table's misprint, and the
// coordinator's model takes Algorithm 2's operating point h = k/P
// (server/cost_model.h).
//
// Everything here is immutable; thread-safe.
#ifndef GRADMESH_WORKER_COLLECTIVES_REGISTRY_H_
#define GRADMESH_WORKER_COLLECTIVES_REGISTRY_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/collectives/collective.h"
#include "worker/collectives/plan.h"
#include "worker/collectives/wire.h"

namespace gradmesh::collectives {

struct AlgorithmOptions {
  std::string algorithm = "spardl";
  double density = 0.01;      // k / n, in (0, 1]
  int teams = 1;              // SparDL's d
  int oktopk_tau = 64;        // Ok-Topk region re-balancing period
  int oktopk_tau_prime = 32;  // Ok-Topk threshold re-evaluation period
  int quantize_bits = 0;      // TopkDSA's dense phase: 0 (off), 2, 4 or 8
  uint64_t seed = 1;          // seeds randomized rounding
  WireFormat wire;            // how sparse blocks travel (wire.h)
  // Where the algorithm's top-k selections run; null: the CPU
  // (kernels::CpuTopK). Outlives the algorithm.
  const kernels::TopKSelector* topk = nullptr;
  // The first index of each tensor fused in the buffer, for the algorithms
  // that split every selection's quota per tensor (SparDL, TopkA:
  // tensor_quota.h); the others select over the whole buffer. Empty: one
  // vector.
  std::vector<uint64_t> tensor_starts;
  // The last exact_tail values are summed exactly by the dense ring in the
  // same operation, the algorithm running on the rest (exact_tail.h). 0:
  // none; the whole buffer: the dense ring alone.
  uint64_t exact_tail = 0;
};

// One all-reduce's cost for one worker, by formula.
struct FormulaCost {
  int rounds = 0;
  double min_bytes = 0;  // received by a worker
  double max_bytes = 0;
  // The point of [min_bytes, max_bytes] the coordinator's model uses.
  double model_bytes = 0;

  bool exact() const { return min_bytes == max_bytes; }
};

struct AlgorithmEntry {
  absl::string_view name;
  // Honours AlgorithmOptions::tensor_starts (splits its selections' quotas
  // per tensor), teams d > 1, quantize_bits.
  bool tensor_quotas = false;
  bool teams = false;
  bool quantizes = false;
  // Every worker receives every worker's selection (memory grows with P).
  bool gathers_every_worker = false;
  // The smallest selection it makes, for P workers in d teams, n values and
  // k = SelectionSize(n, density); n where it selects nothing.
  double (*smallest_selection)(int world_size, int teams, uint64_t n,
                               double k) = nullptr;
  // The cost formula above, for d dividing P; null: none (Gaussiank).
  FormulaCost (*cost)(int world_size, int teams, uint64_t n,
                      double density) = nullptr;
  // InvalidArgument for options the algorithm rejects.
  absl::StatusOr<std::unique_ptr<Collective>> (*create)(
      const AlgorithmOptions& options, int world_size, int rank,
      uint64_t n) = nullptr;
};

// The options of `plan`'s algorithm (tensor_starts empty); InvalidArgument
// for a bad encoding or value type.
absl::StatusOr<AlgorithmOptions> AlgorithmOptionsOf(const Plan& plan);

// Every algorithm, in the order the docs list them.
absl::Span<const AlgorithmEntry> Algorithms();

// The entry named `name`, or null.
const AlgorithmEntry* FindAlgorithm(absl::string_view name);

// The names of Algorithms(), in order.
std::vector<std::string> AlgorithmNames();

// The entry's cost formula; nullopt for an unknown algorithm or one without
// a formula.
std::optional<FormulaCost> TableOneCost(absl::string_view algorithm,
                                        int world_size, int teams, uint64_t n,
                                        double density);

// Creates the algorithm `options.algorithm` for `rank` of `world_size` over n
// values (behind an ExactTail when options.exact_tail says so).
// InvalidArgument for an unknown name, options the algorithm does not honour
// (teams, quantize_bits) or rejects, or an exact tail longer than n.
absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const AlgorithmOptions& options, int world_size, int rank, uint64_t n);

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_REGISTRY_H_

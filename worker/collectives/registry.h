// Creates a Collective by algorithm name, so that every algorithm is
// selectable wherever one is (the engine, `gradmesh replay`, the daemon).
#ifndef GRADMESH_WORKER_COLLECTIVES_REGISTRY_H_
#define GRADMESH_WORKER_COLLECTIVES_REGISTRY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
  // The first index of each tensor fused in the buffer, for the algorithms
  // that split every selection's quota per tensor (SparDL, TopkA:
  // tensor_quota.h); the others select over the whole buffer. Empty: one
  // vector.
  std::vector<uint64_t> tensor_starts;
};

// The names CreateCollective accepts.
// InvalidArgument for an unknown name or options the algorithm rejects.
// Whether `algorithm` splits its selections per tensor when given
// AlgorithmOptions::tensor_starts (SparDL and TopkA).
bool AppliesTensorQuotas(const std::string& algorithm);

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const AlgorithmOptions& options, int world_size, int rank, uint64_t n);

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_REGISTRY_H_

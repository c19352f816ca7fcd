// What a plan names, apart from the algorithms' code: the selection size k
// for a density and the wire format of sparse blocks. The algorithms
// themselves are in the table of registry.h.
#ifndef GRADMESH_WORKER_COLLECTIVES_PLAN_H_
#define GRADMESH_WORKER_COLLECTIVES_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/sparse/codec.h"

namespace gradmesh::collectives {

// Plan::fusion's values.
inline constexpr absl::string_view kPerTensor = "per_tensor";
inline constexpr absl::string_view kAfterFusion = "after_fusion";

// The plan every member of a view runs, as the coordinator publishes it and
// every worker reads it: the one plan type of the system (its proto is
// gradmesh.v1.Plan, converted in proto/plan_proto.h alone).
struct Plan {
  std::string algorithm = "spardl";  // a registry.h AlgorithmNames() entry
  double density = 0.01;             // k / n, in (0, 1]
  int teams = 1;                     // SparDL's d
  std::string encoding = "coo";      // WireFormat::Parse names
  std::string values = "fp32";
  int quantize_bits = 0;      // TopkDSA's dense phase: 0 (off), 2, 4 or 8
  int oktopk_tau = 64;        // Ok-Topk region re-balancing period
  int oktopk_tau_prime = 32;  // Ok-Topk threshold re-evaluation period
  uint64_t seed = 1;          // seeds randomized rounding
  // Buckets of fewer values are summed exactly (the dense ring), so that
  // metrics, biases and norms are not sparsified; 0: none (the
  // coordinator's default is PlanConfig's).
  uint64_t exact_below = 0;
  // Buckets of exactly these sizes (values, ascending) are summed exactly
  // too: the coordinator's `auto` found the dense ring faster for them.
  std::vector<uint64_t> dense_sizes;
  // Steps 0 to warmup_steps - 1 of every bucket are summed exactly too: a
  // warm-up, as Deep Gradient Compression's, since top-k costs the most
  // accuracy in the first steps, while the parameters move the most.
  uint64_t warmup_steps = 0;
  // How selections treat a bucket's tensors (SAFusion): "per_tensor" (each
  // tensor its quota, as the SDK registers buckets by default) or
  // "after_fusion" (every bucket one vector, whatever its registration).
  std::string fusion = std::string(kPerTensor);
  uint64_t chunk_bytes = 1 << 20;  // largest frame payload on peer streams
  bool autotuning = false;         // this epoch is an autotune trial of teams
  std::string note;                // why the plan is what it is
};

// k for a density: round(density * n), at least 1 when n > 0, at most n.
uint64_t SelectionSize(uint64_t n, double density);

struct WireFormat {
  bool tagged = false;                    // false: plain COO
  std::optional<sparse::Encoding> fixed;  // tagged: this one, or auto
  sparse::ValueType values = sparse::ValueType::kFloat32;

  // encoding: coo (plain), auto, coo-tagged, delta, runs, bitmap, dense;
  // values: fp32, fp16, bf16. InvalidArgument for anything else, and for
  // 16-bit values with plain COO.
  static absl::StatusOr<WireFormat> Parse(absl::string_view encoding,
                                          absl::string_view values);
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_PLAN_H_

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

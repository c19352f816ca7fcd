#include "worker/collectives/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/collectives/spardl.h"

namespace gradmesh::collectives {

std::vector<std::string> AlgorithmNames() { return {"spardl"}; }

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const AlgorithmOptions& options, int world_size, int rank, uint64_t n) {
  if (options.algorithm == "spardl") {
    auto spardl =
        SparDl::Create(world_size, rank, n,
                       {.density = options.density, .teams = options.teams});
    if (!spardl.ok()) return spardl.status();
    return std::unique_ptr<Collective>(*std::move(spardl));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", options.algorithm,
                   "' (known: ", absl::StrJoin(AlgorithmNames(), ", "), ")"));
}

}  // namespace gradmesh::collectives

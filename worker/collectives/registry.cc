#include "worker/collectives/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/collectives/dense_ring.h"
#include "worker/collectives/gtopk.h"
#include "worker/collectives/oktopk.h"
#include "worker/collectives/spardl.h"
#include "worker/collectives/topka.h"
#include "worker/collectives/topkdsa.h"

namespace gradmesh::collectives {

namespace {

// Upcasts a StatusOr<unique_ptr<Derived>>.
template <typename T>
absl::StatusOr<std::unique_ptr<Collective>> Upcast(
    absl::StatusOr<std::unique_ptr<T>> created) {
  if (!created.ok()) return created.status();
  return std::unique_ptr<Collective>(*std::move(created));
}

}  // namespace

bool AppliesTensorQuotas(const std::string& algorithm) {
  return algorithm == "spardl" || algorithm == "topka";
}

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const AlgorithmOptions& options, int world_size, int rank, uint64_t n) {
  const std::string& name = options.algorithm;
  if (name == "spardl") {
    return Upcast(SparDl::Create(world_size, rank, n,
                                 {.density = options.density,
                                  .teams = options.teams,
                                  .wire = options.wire,
                                  .tensor_starts = options.tensor_starts}));
  }
  // Only SparDL has teams; d = 1 is the one value the others accept.
  if (options.teams != 1 &&
      std::find(AlgorithmNames().begin(), AlgorithmNames().end(), name) !=
          AlgorithmNames().end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "teams d = ", options.teams, " applies to spardl only, not ", name));
  }
  if (options.quantize_bits != 0 && name != "topkdsa") {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantization applies to topkdsa's dense phase only, not ", name));
  }
  if (name == "dense") return Upcast(DenseRing::Create(world_size, rank, n));
  if (name == "topka" || name == "gaussiank") {
    return Upcast(TopkAllGather::Create(world_size, rank, n, options.density,
                                        name == "topka"
                                            ? LocalSelection::kExactTopK
                                            : LocalSelection::kGaussian,
                                        options.wire, options.tensor_starts));
  }
  if (name == "topkdsa") {
    return Upcast(TopkDsa::Create(world_size, rank, n, options.density,
                                  options.quantize_bits, options.seed,
                                  options.wire));
  }
  if (name == "gtopk") {
    return Upcast(
        GTopk::Create(world_size, rank, n, options.density, options.wire));
  }
  if (name == "oktopk") {
    return Upcast(OkTopk::Create(world_size, rank, n,
                                 {.density = options.density,
                                  .tau = options.oktopk_tau,
                                  .tau_prime = options.oktopk_tau_prime,
                                  .wire = options.wire}));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", options.algorithm,
                   "' (known: ", absl::StrJoin(AlgorithmNames(), ", "), ")"));
}

}  // namespace gradmesh::collectives

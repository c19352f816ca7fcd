// Seeded synthetic gradients, identical on every platform (no std::
// distributions, whose output differs between standard libraries).
//
// Values are normal with a per-"layer" scale (chunks of 64Ki values whose
// scales are log-normal), so that large values cluster the way real
// gradients' do. A given (seed, rank, iteration) always gives the same values.
#ifndef GRADMESH_TOOLS_GRADMESH_SYNTHETIC_H_
#define GRADMESH_TOOLS_GRADMESH_SYNTHETIC_H_

#include <cstdint>

#include "absl/types/span.h"

namespace gradmesh::tools {

void SyntheticGradient(uint64_t seed, int rank, uint64_t iteration,
                       absl::Span<float> out);

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_SYNTHETIC_H_

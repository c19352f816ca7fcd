// Cases shared by the `gradmesh sim` tests.
#ifndef GRADMESH_TESTS_TOOLS_SIM_CASES_H_
#define GRADMESH_TESTS_TOOLS_SIM_CASES_H_

#include <cstdint>

#include "tools/gradmesh/sim.h"

namespace gradmesh::tools {

// SparDL with d teams, one iteration, no communication or compute costs
// beyond the defaults' link, and never scaled down.
inline SimCase SparDl(int workers, int teams, uint64_t n, double density) {
  return {
      .algorithm = {.algorithm = "spardl", .density = density, .teams = teams},
      .workers = workers,
      .n = n,
      .max_values = uint64_t{1} << 31,  // no scaling in these tests
      .iterations = 1};
}

}  // namespace gradmesh::tools

#endif  // GRADMESH_TESTS_TOOLS_SIM_CASES_H_

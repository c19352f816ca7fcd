// The `gradmesh sim` command around Simulate (sim.h): one case, or every
// valid d of SparDL beside the coordinator's model, as text or JSON.
//
// Text (one case):
//   spardl  P=512  n=25000000  density 0.01  (3 iterations)
//   simulated at n'=349525 a worker (--max_values), bytes and work counted
//   x71.5
//   link: alpha 50 us, 25 Gbit/s; compute per value: select 0.98 ns, ...
//   d=8
//     time per all-reduce  49.140 ms (slowest worker; its compute 47.1 ms)
//     rounds               15   Table I: 15
//     bytes received       max 4.06 MB, mean 4.05 MB a worker   Table I: ...
// JSON: the same figures under stable keys, one object per case; with
// every d, {"cases": [...], "best_teams", "model_teams", "skip_factor",
// "model": [...]}.
#ifndef GRADMESH_TOOLS_GRADMESH_SIM_REPORT_H_
#define GRADMESH_TOOLS_GRADMESH_SIM_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "tools/gradmesh/sim.h"

namespace gradmesh::tools {

struct SimRequest {
  SimCase base;
  bool all_teams = false;  // SparDL: simulate every d dividing P
  // Measure this machine's costs per value (Calibrate) instead of
  // base.compute's.
  bool calibrate = false;
  // Multiplies the costs per value: a worker with 1/x of a core (P workers
  // emulated on C cores: P/C), or a slower CPU.
  double compute_scale = 1;
  double skip_factor = 3;  // the coordinator's, for the model's skips
  // "": text; "-": JSON on stdout (no text); a path: text, and JSON there.
  std::string json;
};

// Runs the request and prints it. InvalidArgument for bad options; the
// simulation's or the file's error otherwise.
absl::Status RunSimCommand(SimRequest request);

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_SIM_REPORT_H_

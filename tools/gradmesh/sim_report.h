// The `gradmesh sim` command around Simulate (sim.h): one case, or every
// valid d of SparDL beside the coordinator's model, as text or JSON.
//
// Text (one case):
//   spardl  P=512  d=8  n=25,000,000  density 0.01
//   time per all-reduce  14.21 ms   (compute 4.10 ms, slowest worker)
//   rounds               17         Table I: 17
//   bytes received       2.49 MB    Table I: 2.45 MB
// JSON: the same figures under stable keys (SimCaseJson), one object; with
// every d, {"cases": [...], "best_teams", "model_teams", "model": [...]}.
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

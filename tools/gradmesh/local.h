// `gradmesh local`: the main job on an embedded cluster. Starts a
// coordinator and P workers on 127.0.0.1, or one per network namespace
// (LocalCluster, LocalClusterOptions::hosts), drives iterations
// of seeded synthetic gradients through the SDK (one client per worker, the
// gradient written straight into the shared segment), checks every
// iteration (identical results on every worker; inputs = result + residuals)
// and prints per-iteration time, bytes and the plan's d, then shuts the
// cluster down; Ctrl-C stops after the iteration in flight. With json_path
// it also writes every successful iteration's figures per worker (the
// cluster benchmark, bench/cluster_bench.py, reads them).
#ifndef GRADMESH_TOOLS_GRADMESH_LOCAL_H_
#define GRADMESH_TOOLS_GRADMESH_LOCAL_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "tools/gradmesh/local_cluster.h"

namespace gradmesh::tools {

struct LocalOptions {
  LocalClusterOptions cluster;
  uint64_t n = 1 << 20;  // values per worker and iteration
  uint64_t iterations = 20;
  uint64_t seed = 1;
  absl::Duration timeout = absl::Seconds(60);  // per iteration
  bool verify = true;     // check identical results and conservation
  std::string json_path;  // empty: none
};

// Runs the job; OK when every iteration succeeded and passed its checks.
// Stops early (and still shuts down cleanly) once *interrupted is set.
absl::Status RunLocal(const LocalOptions& options,
                      const std::atomic<bool>* interrupted);

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_LOCAL_H_

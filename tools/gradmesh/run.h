// `gradmesh run`: the launcher (like torchrun or horovodrun). Starts a
// coordinator and P workers on 127.0.0.1 (LocalCluster), waits for their
// first full view, then runs P copies of a command, copy r with an
// environment that points the SDK at worker r:
//
//   GRADMESH_WORKER       worker r's SDK address ("unix:/.../worker-03.sock")
//   GRADMESH_JOB          the job name, the same for every copy
//   GRADMESH_RANK         r (worker r has rank r: node ids sort in launch
//   GRADMESH_LOCAL_RANK   r  order)
//   GRADMESH_WORLD_SIZE   P
//   GRADMESH_TLS_CA, GRADMESH_TLS_CERT, GRADMESH_TLS_KEY
//                         the cluster's TLS files (absolute), when it has them
//   RANK, LOCAL_RANK      r, and WORLD_SIZE, LOCAL_WORLD_SIZE P, as torchrun
//   MASTER_ADDR           sets them, so that torch.distributed's env://
//   MASTER_PORT           rendezvous works beside gradmesh: 127.0.0.1 and a
//                         port free when the copies start
//
// Each line a copy writes to stdout goes to this process's stdout as
// "[r] line", stderr likewise; lines are never interleaved, a final line
// without a newline still comes out (with one), and a line longer than
// 64 KiB is cut into lines of 64 KiB. The copies read stdin from /dev/null.
//
// Each copy runs in its own process group, which the launcher signals (so
// that a shell script's children are stopped with it), and gets SIGTERM when
// the launcher dies (PR_SET_PDEATHSIG). When every copy has ended the
// cluster is stopped. When one copy fails (non-zero exit or a signal), or the
// launcher gets SIGINT or SIGTERM, the others get SIGTERM, and SIGKILL when
// still running 10 s later (at once on a second SIGINT or SIGTERM); then the
// cluster is stopped. The cluster's temporary log directory is kept when
// something failed.
#ifndef GRADMESH_TOOLS_GRADMESH_RUN_H_
#define GRADMESH_TOOLS_GRADMESH_RUN_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tools/gradmesh/local_cluster.h"

namespace gradmesh::tools {

struct RunOptions {
  LocalClusterOptions cluster;  // cluster.workers copies of the command
  std::string job;              // GRADMESH_JOB; empty: "run-<pid>-<seconds>"
  std::vector<std::string> command;  // the program (found on PATH unless it
                                     // has a '/') and its arguments
  // How long the started workers may take to form their first full view.
  absl::Duration start_timeout = absl::Seconds(30);
};

// Runs the command as described above, printing progress to stderr, and
// returns the launcher's exit status:
//   0        every copy exited 0
//   1        the cluster did not start (or a copy could not be forked)
//   2        no command
//   127      the program cannot be found or executed
//   130      SIGINT or SIGTERM (unless a copy had failed before)
//   code     the first failed copy's exit status, or 128 + its signal
// Blocks SIGINT and SIGTERM in the calling thread, which must be the only
// thread (the signals must be blocked in every thread that later exists);
// they stay blocked. Reaps only its own children.
int RunCommand(const RunOptions& options);

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_RUN_H_

// `gradmesh run`: the launcher (like torchrun or horovodrun). Starts a
// coordinator and P workers on 127.0.0.1 (LocalCluster), waits for their
// first full view, then runs P copies of a command, copy r with an
// environment that points the SDK at worker r. On several nodes
// (RunOptions::nodes), each node's launcher starts its P workers and copies,
// node 0 the coordinator too; ranks go by node (node i's copies have ranks
// iP..iP+P-1 when every node is in the job; the nodes in it, in order,
// otherwise), and the launchers end the job alike (NodeLink): one failed
// copy anywhere stops every node's, and every launcher exits with the first
// failure's status (a copy lost with its worker, below, is lost only while
// its node has another copy left, or while min_nodes lets the job go on
// without the node). The environment:
//
//   GRADMESH_WORKER       worker r's SDK address ("unix:/.../worker-03.sock")
//   GRADMESH_JOB          the job name, the same for every copy
//   GRADMESH_RANK         r (its worker's rank: node ids sort in launch
//                         order, node by node)
//   GRADMESH_LOCAL_RANK   its worker's index on this node
//   GRADMESH_WORLD_SIZE   P (every node's together, in the view that the
//                         copies start in: a node that joins a running job
//                         counts the nodes in it then, and its ranks may
//                         repeat others' of an earlier view: under
//                         gradmesh.torch.elastic, gradmesh.rank() is the
//                         one that holds)
//   GRADMESH_TLS_CA, GRADMESH_TLS_CERT, GRADMESH_TLS_KEY
//                         the cluster's TLS files (absolute), when it has them
//   RANK, LOCAL_RANK,     the same numbers (LOCAL_WORLD_SIZE: this node's
//   WORLD_SIZE,           copies), as torchrun sets them, so that
//   LOCAL_WORLD_SIZE      torch.distributed's env:// rendezvous works
//   MASTER_ADDR           beside gradmesh: 127.0.0.1 and a port free when
//   MASTER_PORT           the copies start; on several nodes the
//                         coordinator's host and RunOptions::master_port
//
// Each line a copy writes to stdout goes to this process's stdout as
// "[r] line", stderr likewise; lines are never interleaved, a final line
// without a newline still comes out (with one), and a line longer than
// 64 KiB is cut into lines of 64 KiB. The copies read stdin from /dev/null.
//
// Each copy runs in its own process group, which the launcher signals (so
// that a shell script's children are stopped with it), and gets SIGTERM when
// the launcher dies (PR_SET_PDEATHSIG). When every copy has ended the
// cluster is stopped. A copy that fails while its worker runs is started
// again, with the same rank and environment, while max_restarts restarts are
// left (a trainer under gradmesh.torch.elastic rejoins: its worker takes the
// new process's registration as a new member's); one that fails after its
// worker died has the worker started again first (same node id, so the
// same rank: a new incarnation that rejoins the group), as one restart, and
// one whose worker dies while it runs is stopped at once for that restart
// (SIGTERM, SIGKILL 5 s later; not left until its next call to the worker
// fails). With
// no restart left (or when the worker does not start again) such a copy is
// lost: the others go on without it, and its end does not count as a
// failure, unless it was this node's last copy (and the job needs every
// node: min_nodes) or fewer than min_np copies are left in the job. Once a copy
// anywhere has exited 0 (the job is over for it), no failed copy is started
// again. When one copy fails (non-zero exit or a signal) with no restart left,
// or the launcher gets SIGINT or SIGTERM, the others get SIGTERM, and SIGKILL
// when still running 10 s later (at once on a second SIGINT or SIGTERM); then
// the cluster is stopped. The cluster's temporary log directory is kept when
// something failed, a copy was lost or a worker was started again.
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
  // How long the started workers may take to form their first full view
  // (with several nodes: every node's). With min_nodes below nodes, the
  // nodes may take this long to join (and the last call after), and the
  // view this long again.
  absl::Duration start_timeout = absl::Seconds(30);
  // A job on several nodes, as torchrun's --nnodes: this launcher is node
  // `node_rank` of `nodes`, with cluster.workers workers and copies here.
  int nodes = 1;
  int node_rank = 0;
  // "host:port" of the job's coordinator (nodes > 1): node 0 starts it
  // there unless something answers already; every node's workers join it.
  // Node 0's launcher serves the others on port + 1 (NodeLink).
  std::string coordinator;
  std::string host;     // this node's address for peer traffic
  int master_port = 0;  // MASTER_PORT on node 0's host; 0: port + 2
  // Restarts of failed copies on this node, in all (see below).
  int max_restarts = 0;
  // The fewest copies the job goes on with (every node's together; 0: no
  // minimum): below it, the copies lost with their workers end the job on
  // every node with status 1 at once (Horovod's --min-np waits first).
  int min_np = 0;
  // The fewest nodes the job goes on with (0: all of them, as torchrun's
  // --nnodes=N). Below `nodes`, as torchrun's --nnodes=MIN:MAX, the job
  // starts once this many nodes joined and `last_call` passed with no more
  // joining (or all `nodes` joined, or at the start timeout); a node that
  // joins later, or one lost that comes back (its launcher started again),
  // enters the running job: its workers join the group as new members
  // (train under gradmesh.torch.elastic). A node whose copies are all lost
  // with their workers, whose launcher node 0 no longer reaches (its host
  // died), or whose launcher gets a termination signal (not node 0's:
  // NodeLink::Leave), leaves the job instead of failing it; below this many
  // nodes left the job stops on every node with status 1.
  int min_nodes = 0;
  absl::Duration last_call = absl::Seconds(10);
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

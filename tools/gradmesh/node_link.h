// NodeLink: the launchers of one job on several nodes (`gradmesh run
// --nnodes=N`), joined by TCP so that the job ends alike everywhere, as
// torchrun's agents do.
//
// Node 0's launcher serves the link (Listen, then AwaitNodes); every other
// node's joins it (Join) and learns the job's name. Lines, both ways:
//   node -> 0:  "node I N G M K V" on joining: its rank, --nnodes, copies,
//                            --min-np, --min-nodes and the link's version
//   0 -> node:  "job W NAME" once the job starts (every node joined, or K
//                            of them with M copies and the last call
//                            passed, or at the deadline), all with
//                            the same N, G, M, K, V; W: the workers to
//                            expect in the job's view (the copies not lost
//                            of the nodes in the job, this one's included).
//                            While nodes may be lost (K < N), a node that
//                            joins later (one that came late, or a lost
//                            one whose old launcher is gone) gets it at
//                            node 0's next Poll, as torchrun's
//                            --nnodes=MIN:MAX admits it
//   0 -> node:  "busy"       K < N: its rank is still linked (node 0 has not
//                            yet noticed the old launcher gone, about 30 s
//                            for a host that died; or the old launcher
//                            lives, e.g. with all its copies lost, until
//                            the job ends): the node tries again each
//                            second until its deadline
//   0 -> node:  "probe 0"    once the job started, sent on the old link
//                            with "busy"; ignored. A host that restarted
//                            answers it with a reset, so its new launcher
//                            gets in at the next try; on a host gone
//                            silent the link ends 5 s after the first
//                            probe (unacknowledged)
//   node -> 0:  "lost L"     L of its copies are lost (with their workers)
//   0 -> node:  "members W"  a node or copies were lost: W workers are left
//                            in the job, so a node still waiting for the
//                            first view of W' > W waits for W (a node that
//                            left while the others' workers joined)
//   both ways:  "ended 0"    a copy exited 0: the job is over for it, so no
//                            node starts a failed copy again (node 0 passes
//                            it on)
//   node -> 0:  "done CODE"  its copies ended (CODE: its exit status)
//   node -> 0:  "leaving 0"  K < N: its launcher was stopped by a signal
//                            (a host drained); its link closes next and
//                            it counts as lost
//   0 -> node:  "stop CODE WHY"  another node failed, or fewer than M copies
//                            or K nodes are left in the job: stop, exit
//                            with CODE
//   0 -> node:  "end CODE"   every node is done: the job's exit status
// A link to node 0 that breaks fails the other nodes (exit status 1). A
// link to another node that breaks counts, on node 0, as that node failing,
// unless K < N: then its copies count as lost (its host is gone), and the
// job goes on while M copies and K nodes are left (a node not in the job,
// never joined or lost, counts as lost). A node whose copies are
// all lost (node 0 too) counts as lost; its launcher stays linked until
// the job ends, and exits with the job's status. TCP keepalive notices a
// host that went silent within about 30 s. A failure's
// code outside 1..255 counts as 1. The link trusts whoever reaches the port
// (the job's own network).
//
//   GM_ASSIGN_OR_RETURN(auto link, NodeLink::Join("10.0.0.1", 7701, 1,
//                                                 shape, deadline));
//   while (running) { if (auto stop = link->Poll()) StopCopies(*stop); }
//   const int code = link->Finish(my_code, signal_fd);
//
// Not thread-safe: one thread (the launcher's) uses it.
#ifndef GRADMESH_TOOLS_GRADMESH_NODE_LINK_H_
#define GRADMESH_TOOLS_GRADMESH_NODE_LINK_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradmesh::tools {

// A TCP connection to host:port (IPv4), waiting at most 2 s for it:
// non-blocking, with keepalive. InvalidArgument for a host that does not
// resolve, Unavailable when nothing answers.
absl::StatusOr<int> ConnectTcp(const std::string& host, int port);

// Why a job stops with `left` of its `total` processes, fewer than
// `minimum` (--min-np).
std::string TooFewLeft(int left, int total, int minimum);

class NodeLink {
 public:
  // Another node's failure: what to report and the exit status to take.
  struct Stop {
    std::string why;
    int code = 1;
  };
  // What every node's launcher must agree on.
  struct Shape {
    int nodes = 1;
    int per_node = 1;    // copies on each node
    int min_copies = 0;  // the job stops below this many copies left
    int min_nodes = 0;   // ... or below this many nodes (0: `nodes`)
  };

  // Node 0: listens on port `port` of every interface (Unavailable when it
  // is taken, e.g. by another job's launcher).
  static absl::StatusOr<std::unique_ptr<NodeLink>> Listen(int port);
  // Node 0: waits until nodes 1..nodes-1 have joined with `shape`, then
  // gives them `job`. With Shape::min_nodes < nodes, the job starts once
  // that many nodes (and Shape::min_copies copies) are in and `last_call`
  // passed since the last one joined, or at `deadline`: the others may
  // join while it runs (Poll admits them; a node of another shape is then
  // refused, and the job goes on). DeadlineExceeded naming the nodes
  // that did not join by `deadline` when too few did; InvalidArgument for a
  // node of another shape; Cancelled on a termination signal on `signal_fd`
  // (-1: none). On an error the nodes that joined are told to stop.
  absl::Status AwaitNodes(const Shape& shape, const std::string& job,
                          absl::Time deadline, absl::Duration last_call,
                          int signal_fd = -1);
  // Node `node` (> 0): connects to node 0 at host:port (trying again until
  // `deadline`, also while node 0 answers "busy") and waits for the job's
  // name. FailedPrecondition when node 0 refuses it; Cancelled on a
  // termination signal on `signal_fd`.
  static absl::StatusOr<std::unique_ptr<NodeLink>> Join(const std::string& host,
                                                        int port, int node,
                                                        const Shape& shape,
                                                        absl::Time deadline,
                                                        int signal_fd = -1);

  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  const std::string& job() const { return job_; }
  // The workers to expect in the job's view when this node entered it
  // (node 0: when the job started), its own included, less those lost
  // since (node 0 tells every node: "members W").
  int members() const { return members_; }
  // Whether the job goes on without a node (Shape::min_nodes < nodes), so
  // that a node may lose its last copy without failing the job.
  bool nodes_may_be_lost() const;

  // Reads what arrived, without blocking: another node's failure once
  // known (reported once). On node 0 a failing node's stop goes on to the
  // others, and a node that joins the running job is admitted (unless the
  // job is over: a copy ended well, or a failure).
  std::optional<Stop> Poll();
  // `count` of this node's copies are lost, in all (gone with their workers,
  // for good). Node 0 adds up every node's: once fewer than
  // Shape::min_copies copies or Shape::min_nodes nodes (a node with every
  // copy lost is lost) are left in the job, every node is stopped with
  // status 1, node 0 too (its next Poll reports it).
  void Lost(int count);
  // A copy of this node exited 0; told to every node (idempotent).
  void Ended();
  // Whether a copy of the job exited 0, as far as this node knows: a failed
  // copy must not start again, its peers may be gone; losses no longer
  // count against the minimum.
  bool ended() const { return ended_; }
  // Why the job stopped: the first stop Poll reported, else empty.
  const std::string& why() const { return why_; }
  // This node's copies failed with `code` (or were interrupted: 130): tells
  // the others (node 0: stops them; another node: tells node 0, which stops
  // the rest).
  void Failed(int code);
  // This node's launcher got a termination signal (its host drained). A node
  // other than 0, while nodes may be lost (K < N), leaves the job as a lost
  // one: it tells node 0 and closes its link, and the job goes on while
  // enough are left (Finish then returns 130 at once). Otherwise the same
  // as Failed(130): every node stops.
  void Leave();
  // This node's copies ended with `code` (0 or a failure's status). Waits
  // until every node is done (node 0) or for node 0's verdict, and returns
  // the job's exit status: the first failure's, else 0. A termination
  // signal on `signal_fd` ends the wait at once as a failure of 130, told to
  // the others, unless a failure came before.
  int Finish(int code, int signal_fd);

 private:
  struct Peer {
    int fd = -1;
    int node = -1;
    std::string pending;              // bytes read, not yet a whole line
    std::vector<std::string> queued;  // lines read, not yet handled
    bool done = false;
    bool reported = false;  // its link's end, reported as a failure
    bool leaving = false;   // said "leaving": its launcher was stopped
    int lost = 0;           // its copies lost (node 0's count)
    absl::Time since;       // joining: when it connected
  };

  NodeLink() = default;
  // The queued lines and the whole lines that arrived from `peer`; its fd
  // is -1 once its connection ended.
  std::vector<std::string> Read(Peer& peer);
  // One line to `peer`. A link that cannot take it whole is closed, unless
  // the peer closed or reset it: Read then takes the lines it sent before,
  // and closes it.
  void Send(Peer& peer, const std::string& line);
  // Node 0: node `node`'s place in peers_ while it is not in the job: lost.
  Peer Absent(int node) const;
  // Node 0: the nodes in the job now, node 0 included, and their copies not
  // lost.
  int Present() const;
  int Members() const;
  // Node 0: "probe 0" on `peer`'s link, which then ends once data on it is
  // unacknowledged for kProbeWait.
  void Probe(Peer& peer);
  // One try of Join; *busy when node 0 answered "busy".
  static absl::StatusOr<std::unique_ptr<NodeLink>> JoinOnce(
      const std::string& host, int port, int node, const Shape& shape,
      absl::Time deadline, int signal_fd, bool* busy);
  // Node 0: the node a hello names (-1: a stranger's line, or a rank out of
  // range); InvalidArgument for another version or shape.
  absl::StatusOr<int> NodeOf(const std::string& line) const;
  // Node 0: takes the connections waiting on the listener into joining_.
  void Accept();
  // Node 0: reads the joining connections' hellos; a node that may join
  // takes its place in peers_ (after the start: told the job at once). An
  // error for a node of another shape or version before the start; after
  // it, such a node is refused and the job goes on.
  absl::Status Admit();
  // Node 0: before the start, a node whose connection ended is absent again.
  void ForgetLeavers();
  // Node 0: DeadlineExceeded naming the nodes that did not join.
  absl::Status Missing() const;
  // Node 0: refuses the joining connections and closes the listener.
  void StopListening();
  // Node 0: the job starts with the nodes in it; they are told.
  void Start();
  // Another node: the job's name and members from node 0's "job W NAME".
  absl::Status TakeJob(const std::string& line);
  // Refuses the joining connection `peer` ("stop 1") and closes it.
  void Refuse(Peer& peer);
  std::string JobLine() const;
  // Handles one line from `peer`; a failure to pass on is returned.
  std::optional<Stop> Handle(Peer& peer, const std::string& line);
  // `peer`'s link broke before it was done: its failure, or on node 0
  // while nodes may be lost, its copies lost (a stop only below a minimum).
  std::optional<Stop> Gone(Peer& peer);
  // Node 0: after a loss that the job survives, every node's members()
  // falls to Members() (told when below what any node was told).
  void Recount();
  // Node 0: the first failure becomes everyone's stop.
  void StopOthers(const Stop& stop, const Peer* from);
  // Node 0: the stop for every node once fewer than shape_.min_copies
  // copies or shape_.min_nodes nodes are left, else nullopt.
  std::optional<Stop> BelowMinimum() const;
  bool AllDone() const;

  bool serving_ = false;  // node 0
  bool started_ = false;  // node 0: the job started (AwaitNodes returned)
  Shape shape_;           // the job's
  int listener_ = -1;     // node 0, while a node may still join
  std::string job_;
  int members_ = 0;
  int told_ = 0;  // node 0: the most workers a node was told to expect
  std::vector<Peer> joining_;     // node 0: connections not yet a node
  std::vector<Peer> peers_;       // node 0: nodes 1.., one place each (fd -1
                                  // while not in the job); else: node 0
  std::optional<int> verdict_;    // the first failure's status, once known
  std::optional<int> end_;        // node 0's "end", once received
  bool stopped_ = false;          // a stop was reported by Poll
  bool ended_ = false;            // a copy of the job exited 0
  std::string why_;               // the first stop's reason
  int lost_here_ = 0;             // node 0: its own copies lost
  std::optional<Stop> own_stop_;  // node 0: its own, for the next Poll
};

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_NODE_LINK_H_

// NodeLink: the launchers of one job on several nodes (`gradmesh run
// --nnodes=N`), joined by TCP so that the job ends alike everywhere, as
// torchrun's agents do.
//
// Node 0's launcher serves the link (Serve); every other node's joins it
// (Join) and learns the job's name. Lines, both ways:
//   node -> 0:  "node I"     on joining
//   0 -> node:  "job NAME"   once every node joined
//   node -> 0:  "done CODE"  its copies ended (CODE: its exit status)
//   0 -> node:  "stop CODE"  another node failed: stop, exit with CODE
//   0 -> node:  "end CODE"   every node is done: the job's exit status
// A link that breaks counts as its node failing (exit status 1).
//
//   GM_ASSIGN_OR_RETURN(auto link, NodeLink::Join("10.0.0.1", 7701, 1,
//                                                 deadline));
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

class NodeLink {
 public:
  // Another node's failure: what to report and the exit status to take.
  struct Stop {
    std::string why;
    int code = 1;
  };

  // Node 0: listens on port `port` of every interface and waits until nodes
  // 1..nodes-1 have joined, then gives them `job`. DeadlineExceeded naming
  // the nodes that did not join by `deadline`.
  static absl::StatusOr<std::unique_ptr<NodeLink>> Serve(int port, int nodes,
                                                         const std::string& job,
                                                         absl::Time deadline);
  // Node `node` (> 0): connects to node 0 at host:port (trying again until
  // `deadline`) and waits for the job's name.
  static absl::StatusOr<std::unique_ptr<NodeLink>> Join(const std::string& host,
                                                        int port, int node,
                                                        absl::Time deadline);

  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  const std::string& job() const { return job_; }

  // Reads what arrived, without blocking: another node's failure once
  // known (each reported once). On node 0 a failing node's "stop" goes on
  // to the others.
  std::optional<Stop> Poll();
  // This node's copies failed with `code`: tells the others (node 0: stops
  // them; another node: tells node 0, which stops the rest).
  void Failed(int code);
  // This node's copies ended with `code` (0 or a failure's status). Waits
  // until every node is done (node 0) or for node 0's verdict, until a
  // termination signal arrives on `signal_fd`, and returns the job's exit
  // status: the first failure's, else 0.
  int Finish(int code, int signal_fd);

 private:
  struct Peer {
    int fd = -1;
    int node = -1;
    std::string pending;  // bytes read, not yet a whole line
    bool done = false;
  };

  NodeLink() = default;
  // The whole lines that arrived from `peer`; its fd is -1 once its
  // connection ended.
  std::vector<std::string> Read(Peer& peer);
  void Send(Peer& peer, const std::string& line);
  // Handles one line from `peer`; a failure to pass on is returned.
  std::optional<Stop> Handle(Peer& peer, const std::string& line);
  // Node 0: the first failure becomes everyone's stop.
  void StopOthers(const Stop& stop, const Peer* from);
  bool AllDone() const;

  bool serving_ = false;  // node 0
  std::string job_;
  std::vector<Peer> peers_;     // node 0: the others; else: node 0
  std::optional<int> verdict_;  // the first failure's status, once known
  std::optional<int> end_;      // node 0's "end", once received
  bool stopped_ = false;        // a stop was reported by Poll
};

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_NODE_LINK_H_

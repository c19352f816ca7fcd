#include "tools/gradmesh/node_link.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace gradmesh::tools {
namespace {

constexpr absl::Duration kTick = absl::Milliseconds(100);
constexpr size_t kMaxLine = 4096;    // a longer line breaks the link
constexpr size_t kMaxJoining = 256;  // connections not yet a node
// A connection that says no hello within this is refused.
constexpr absl::Duration kHelloWait = absl::Seconds(5);
// A node told "busy" tries again after this.
constexpr absl::Duration kBusyWait = absl::Seconds(1);
// A probed link ends once data on it is unacknowledged this long (a live
// host acknowledges at once; unacknowledged data holds keepalive back).
constexpr absl::Duration kProbeWait = absl::Seconds(5);
// The hello's last number: nodes of other versions are refused.
constexpr int kLinkVersion = 2;

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Non-blocking, and a silent peer noticed: keepalive probes after 10 s of
// silence, every 5 s, 4 unanswered end it; unacknowledged data, 30 s.
void Prepare(int fd) {
  fcntl(fd, F_SETFL, O_NONBLOCK);
  const int on = 1, idle = 10, interval = 5, count = 4, unacked_ms = 30000;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms,
             sizeof(unacked_ms));
}

// Waits up to `timeout` for input on `fds` (a negative fd is skipped).
void PollInput(const std::vector<int>& fds, absl::Duration timeout) {
  std::vector<pollfd> polled;
  for (int fd : fds) polled.push_back({.fd = fd, .events = POLLIN});
  poll(polled.data(), polled.size(), absl::ToInt64Milliseconds(timeout));
}

// Whether a termination signal arrived on `signal_fd` (consuming it).
bool Signalled(int signal_fd) {
  signalfd_siginfo info;
  return signal_fd >= 0 && read(signal_fd, &info, sizeof(info)) == sizeof(info);
}

// The words of a line and its numbers: "node 1 2 4" is {"node", {1, 2, 4}};
// nullopt if a number is malformed.
std::optional<std::pair<std::string, std::vector<int>>> Parse(
    const std::string& line) {
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  std::vector<int> numbers;
  for (size_t i = 1; i < parts.size(); ++i) {
    int number = 0;
    if (!absl::SimpleAtoi(parts[i], &number)) return std::nullopt;
    numbers.push_back(number);
  }
  return std::make_pair(parts[0], numbers);
}

// A failure's exit status as one: 1..255 (else 1).
int FailureCode(int code) { return code >= 1 && code <= 255 ? code : 1; }

// Why node `node` stopped the job with the failure `code`: 130 is a
// termination signal (its launcher's, while starting or running, or the
// copies').
std::string NodeFailed(int node, int code) {
  if (code == 130) return absl::StrCat("node ", node, " was interrupted");
  return absl::StrCat("node ", node, "'s processes failed (its exit status ",
                      code, ")");
}

int MinNodes(const NodeLink::Shape& shape) {
  return shape.min_nodes > 0 ? shape.min_nodes : shape.nodes;
}

// Whether `present` nodes are enough to start the job, and to go on with.
bool Enough(const NodeLink::Shape& shape, int present) {
  return present >= MinNodes(shape) &&
         present * shape.per_node >= shape.min_copies;
}

// The numbers of node `node`'s hello: what every node must agree on.
std::vector<int> Hello(int node, const NodeLink::Shape& shape) {
  return {node,
          shape.nodes,
          shape.per_node,
          shape.min_copies,
          MinNodes(shape),
          kLinkVersion};
}

// A hello's numbers as the flags that give them.
std::string Flags(const std::vector<int>& hello) {
  return absl::StrCat("--nnodes=", hello[1], " --nproc_per_node=", hello[2],
                      " --min-np=", hello[3], " --min-nodes=", hello[4]);
}

}  // namespace

std::string TooFewLeft(int left, int total, int minimum) {
  return absl::StrCat(left, " of the job's ", total, " processes are left (",
                      total - left,
                      " lost with their workers), fewer than "
                      "--min-np=",
                      minimum);
}

absl::StatusOr<int> ConnectTcp(const std::string& host, int port) {
  addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
  addrinfo* found = nullptr;
  if (const int error =
          getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found);
      error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const timeval limit = {.tv_sec = 2, .tv_usec = 0};  // bounds connect()
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  const bool connected =
      fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    const absl::Status status = Errno(absl::StrCat(host, ":", port));
    if (fd >= 0) close(fd);
    return status;
  }
  Prepare(fd);
  return fd;
}

NodeLink::~NodeLink() {
  for (Peer& peer : peers_) {
    if (peer.fd >= 0) close(peer.fd);
  }
  for (Peer& peer : joining_) {
    if (peer.fd >= 0) close(peer.fd);
  }
  if (listener_ >= 0) close(listener_);
}

std::vector<std::string> NodeLink::Read(Peer& peer) {
  std::vector<std::string> lines = std::move(peer.queued);
  peer.queued.clear();
  char buffer[4096];
  while (peer.fd >= 0 && lines.size() < 64) {  // the rest at the next call
    const ssize_t n = read(peer.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0 || peer.pending.size() > kMaxLine) {
      close(peer.fd);
      peer.fd = -1;
      break;
    }
    peer.pending.append(buffer, static_cast<size_t>(n));
    size_t end;
    while ((end = peer.pending.find('\n')) != std::string::npos) {
      lines.push_back(peer.pending.substr(0, end));
      peer.pending.erase(0, end + 1);
    }
  }
  return lines;
}

void NodeLink::Send(Peer& peer, const std::string& line) {
  if (peer.fd < 0) return;
  const std::string data = line + "\n";
  // Short lines on an idle socket: one send takes them whole.
  const ssize_t sent = send(peer.fd, data.data(), data.size(), MSG_NOSIGNAL);
  if (sent == static_cast<ssize_t>(data.size())) return;
  // A peer that closed or reset its end may have sent lines before ("done
  // CODE", "leaving 0"): Read takes them, then closes. Anything else leaves
  // a line cut short.
  if (sent < 0 && (errno == EPIPE || errno == ECONNRESET)) return;
  close(peer.fd);
  peer.fd = -1;
}

absl::StatusOr<std::unique_ptr<NodeLink>> NodeLink::Listen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address = {.sin_family = AF_INET,
                         .sin_port = htons(static_cast<uint16_t>(port)),
                         .sin_addr = {.s_addr = htonl(INADDR_ANY)}};
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 64) != 0) {
    const absl::Status status = Errno(
        absl::StrCat("the launchers' link on port ", port,
                     " (is another job's node 0 using this --coordinator?)"));
    close(fd);
    return status;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  std::unique_ptr<NodeLink> link(new NodeLink());
  link->serving_ = true;
  link->listener_ = fd;
  return link;
}

NodeLink::Peer NodeLink::Absent(int node) const {
  return {
      .node = node, .done = true, .reported = true, .lost = shape_.per_node};
}

int NodeLink::Present() const {
  return 1 + static_cast<int>(std::count_if(
                 peers_.begin(), peers_.end(),
                 [](const Peer& p) { return p.fd >= 0 && !p.done; }));
}

int NodeLink::Members() const {
  int members = shape_.per_node - lost_here_;
  for (const Peer& p : peers_) {
    if (p.fd >= 0 && !p.done) members += shape_.per_node - p.lost;
  }
  return members;
}

std::string NodeLink::JobLine() const {
  return absl::StrCat("job ", Members(), " ", job_);
}

void NodeLink::Accept() {
  for (int fd;
       joining_.size() < kMaxJoining &&
       (fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) {
    Prepare(fd);
    joining_.push_back({.fd = fd, .since = absl::Now()});
  }
}

void NodeLink::Refuse(Peer& peer) {
  Send(peer, "stop 1");
  if (peer.fd >= 0) close(peer.fd);
  peer.fd = -1;
}

absl::StatusOr<int> NodeLink::NodeOf(const std::string& line) const {
  const auto hello = Parse(line);
  if (!hello || hello->first != "node") return -1;  // a stranger
  if (hello->second.size() != Hello(0, shape_).size() ||
      hello->second.back() != kLinkVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a node joined with \"", line.substr(0, 80),
        "\": it runs another version of gradmesh; every node must run the "
        "same"));
  }
  const int node = hello->second.front();
  if (node < 1 || node >= shape_.nodes) return -1;
  if (hello->second != Hello(node, shape_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", node, " runs with ", Flags(hello->second), ", node 0 with ",
        Flags(Hello(node, shape_)), ": every node must give the same"));
  }
  return node;
}

void NodeLink::Probe(Peer& peer) {
  Send(peer, "probe 0");
  const int unacked_ms = absl::ToInt64Milliseconds(kProbeWait);
  if (peer.fd >= 0) {
    setsockopt(peer.fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms,
               sizeof(unacked_ms));
  }
}

absl::Status NodeLink::Admit() {
  absl::Status status;
  const absl::Time now = absl::Now();
  for (Peer& p : joining_) {
    std::vector<std::string> lines = Read(p);
    if (lines.empty() && p.fd >= 0 && now - p.since > kHelloWait) Refuse(p);
    if (lines.empty() || p.fd < 0 || !status.ok()) continue;
    const absl::StatusOr<int> node = NodeOf(lines.front());
    if (!node.ok()) {
      Refuse(p);
      if (!started_) {
        status = node.status();  // the start fails
      } else {
        std::fprintf(stderr, "gradmesh run: %s; the job goes on without it\n",
                     std::string(node.status().message()).c_str());
      }
      continue;
    }
    if (*node < 0 || (started_ && (ended_ || verdict_.has_value()))) {
      Refuse(p);  // a stranger, or the job is over
      continue;
    }
    Peer& place = peers_[*node - 1];
    if (place.fd >= 0 && !started_ && !nodes_may_be_lost()) {
      Refuse(p);  // a node twice
      continue;
    }
    if (place.fd >= 0) {  // the old launcher may be gone, unnoticed yet
      if (started_) Probe(place);
      Send(p, "busy");
      if (p.fd >= 0) close(p.fd);
      p.fd = -1;
      continue;
    }
    place = {.fd = std::exchange(p.fd, -1),
             .node = *node,
             .pending = std::move(p.pending),
             .queued = {lines.begin() + 1, lines.end()}};
    if (started_) {
      Send(place, JobLine());
      told_ = std::max(told_, Members());
      std::fprintf(stderr,
                   "gradmesh run: node %d joined the running job (%d of %d "
                   "nodes in it)\n",
                   *node, Present(), shape_.nodes);
    }
  }
  std::erase_if(joining_, [](const Peer& p) { return p.fd < 0; });
  return status;
}

void NodeLink::ForgetLeavers() {
  for (Peer& p : peers_) {
    p.queued = Read(p);
    if (p.fd < 0 && !p.done) p = Absent(p.node);  // left before the start
  }
}

absl::Status NodeLink::AwaitNodes(const Shape& shape, const std::string& job,
                                  absl::Time deadline, absl::Duration last_call,
                                  int signal_fd) {
  job_ = job;
  shape_ = shape;
  for (int n = 1; n < shape.nodes; ++n) peers_.push_back(Absent(n));
  absl::Status status;
  int present = 1;
  std::optional<absl::Time> last_call_from;  // enough in, the last joined
  while (status.ok() && present < shape.nodes) {
    const absl::Time now = absl::Now();
    if (!Enough(shape, present)) {
      last_call_from.reset();
    } else if (!last_call_from) {
      last_call_from = now;
    }
    if (last_call_from &&
        (now >= *last_call_from + last_call || now >= deadline)) {
      break;  // the job starts with the nodes in it
    }
    if (now >= deadline) {
      status = Missing();
      break;
    }
    std::vector<int> fds = {listener_, signal_fd};
    for (const Peer& p : joining_) fds.push_back(p.fd);
    for (const Peer& p : peers_) fds.push_back(p.fd);
    PollInput(fds, kTick);
    if (Signalled(signal_fd)) {
      status = absl::CancelledError("interrupted while the nodes joined");
      break;
    }
    Accept();
    ForgetLeavers();
    status = Admit();
    const int joined = Present();
    if (joined > present && Enough(shape, joined)) {
      last_call_from = absl::Now();  // the last call starts again
    }
    present = joined;
  }
  if (!status.ok()) {  // not a node of this job, or the job gave up
    for (Peer& p : peers_) Refuse(p);
    StopListening();
    return status;
  }
  Start();
  return absl::OkStatus();
}

absl::Status NodeLink::Missing() const {
  std::vector<int> missing;
  for (const Peer& p : peers_) {
    if (p.fd < 0) missing.push_back(p.node);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "node ", absl::StrJoin(missing, ", "), " of ", shape_.nodes,
      " did not join in time (its `gradmesh run --node_rank=...` never "
      "reached this node's launcher)",
      MinNodes(shape_) < shape_.nodes
          ? absl::StrCat("; the job starts with ", MinNodes(shape_),
                         " nodes (--min-nodes)",
                         shape_.min_copies > 0
                             ? absl::StrCat(" and ", shape_.min_copies,
                                            " processes (--min-np)")
                             : "")
          : ""));
}

void NodeLink::StopListening() {
  for (Peer& p : joining_) Refuse(p);
  joining_.clear();
  close(listener_);
  listener_ = -1;
}

void NodeLink::Start() {
  started_ = true;
  members_ = Members();
  told_ = members_;
  const std::string line = JobLine();
  for (Peer& p : peers_) Send(p, line);
  if (!nodes_may_be_lost()) {
    StopListening();  // no node joins later
  } else if (Present() < shape_.nodes) {
    std::fprintf(stderr,
                 "gradmesh run: the job starts with %d of %d nodes; the "
                 "others may join while it runs\n",
                 Present(), shape_.nodes);
  }
}

absl::StatusOr<std::unique_ptr<NodeLink>> NodeLink::Join(
    const std::string& host, int port, int node, const Shape& shape,
    absl::Time deadline, int signal_fd) {
  while (true) {
    bool busy = false;
    absl::StatusOr<std::unique_ptr<NodeLink>> link =
        JoinOnce(host, port, node, shape, deadline, signal_fd, &busy);
    if (!busy) return link;
    if (absl::Now() + kBusyWait >= deadline) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node 0's launcher has node ", node,
          " in the job still (another launcher runs with this --node_rank, "
          "or node 0 has not noticed the old one gone)"));
    }
    PollInput({signal_fd}, kBusyWait);
    if (Signalled(signal_fd)) {
      return absl::CancelledError("interrupted while joining node 0");
    }
  }
}

absl::StatusOr<std::unique_ptr<NodeLink>> NodeLink::JoinOnce(
    const std::string& host, int port, int node, const Shape& shape,
    absl::Time deadline, int signal_fd, bool* busy) {
  std::unique_ptr<NodeLink> link(new NodeLink());
  absl::StatusOr<int> fd = ConnectTcp(host, port);
  while (!fd.ok() && absl::IsUnavailable(fd.status()) &&
         absl::Now() < deadline) {
    PollInput({signal_fd}, absl::Milliseconds(200));
    if (Signalled(signal_fd)) {
      return absl::CancelledError("interrupted while joining node 0");
    }
    fd = ConnectTcp(host, port);
  }
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("node 0's launcher did not answer: ",
                                     fd.status().message()));
  }
  link->peers_.push_back({.fd = *fd, .node = 0});
  Peer& zero = link->peers_.front();
  link->shape_ = shape;
  link->Send(zero,
             absl::StrCat("node ", absl::StrJoin(Hello(node, shape), " ")));
  while (absl::Now() < deadline) {
    PollInput({zero.fd, signal_fd}, kTick);
    if (Signalled(signal_fd)) {
      return absl::CancelledError("interrupted while joining node 0");
    }
    std::vector<std::string> lines = link->Read(zero);
    if (!lines.empty() && lines.front() == "busy") {
      *busy = true;
      return absl::UnavailableError("busy");
    }
    if (!lines.empty()) {
      if (!absl::StartsWith(lines.front(), "job ")) {
        return absl::FailedPreconditionError(absl::StrCat(
            "node 0's launcher refused node ", node,
            " (another node has that rank, the nodes disagree on --nnodes, "
            "--nproc_per_node, --min-np or --min-nodes or run other versions "
            "of gradmesh, or the job is over or gave up: see node 0)"));
      }
      if (absl::Status taken = link->TakeJob(lines.front()); !taken.ok()) {
        return taken;
      }
      zero.queued.assign(lines.begin() + 1, lines.end());
      return link;
    }
    if (zero.fd < 0) {
      return absl::UnavailableError("node 0's launcher closed the link");
    }
  }
  return absl::DeadlineExceededError(
      "node 0's launcher did not start the job in time (not every node "
      "joined)");
}

absl::Status NodeLink::TakeJob(const std::string& line) {
  const std::pair<std::string, std::string> job =
      absl::StrSplit(line.substr(4), absl::MaxSplits(' ', 1));
  if (!absl::SimpleAtoi(job.first, &members_) || members_ < shape_.per_node ||
      members_ > shape_.nodes * shape_.per_node || job.second.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node 0's launcher sent \"", line.substr(0, 80),
                     "\": it runs another version of gradmesh"));
  }
  job_ = job.second;
  return absl::OkStatus();
}

std::optional<NodeLink::Stop> NodeLink::Handle(Peer& peer,
                                               const std::string& line) {
  if (!serving_ && absl::StartsWith(line, "stop ")) {
    const std::pair<std::string, std::string> parts =
        absl::StrSplit(line.substr(5), absl::MaxSplits(' ', 1));
    int code = 1;
    if (!absl::SimpleAtoi(parts.first, &code)) code = 1;
    return Stop{absl::StrCat("node 0 stops the job: ",
                             parts.second.empty() ? "another node failed"
                                                  : parts.second),
                FailureCode(code)};
  }
  const auto parsed = Parse(line);
  if (!parsed || parsed->second.size() != 1) return std::nullopt;
  const std::string& word = parsed->first;
  const int code = parsed->second[0];
  if (serving_ && word == "leaving") {
    peer.leaving = true;  // Gone says so once the link closes
    return std::nullopt;
  }
  if (serving_ && word == "done") {
    peer.done = true;
    if (code == 0) return std::nullopt;
    return Stop{NodeFailed(peer.node, code), FailureCode(code)};
  }
  if (word == "ended" && code == 0) {
    if (serving_) Ended();  // passed on to the others
    ended_ = true;
    return std::nullopt;
  }
  if (!serving_ && word == "members") {
    if (code >= shape_.per_node) members_ = std::min(members_, code);
    return std::nullopt;
  }
  if (serving_ && word == "lost") {
    // A count only grows (a line that says less is stale or wrong).
    peer.lost = std::max(peer.lost, std::clamp(code, 0, shape_.per_node));
    std::optional<Stop> stop = BelowMinimum();
    if (!stop) Recount();
    if (!stop || verdict_) return std::nullopt;
    StopOthers(*stop, nullptr);  // the node that told it too
    return stop;
  }
  if (!serving_ && word == "end") end_ = code >= 0 && code <= 255 ? code : 1;
  return std::nullopt;
}

void NodeLink::Recount() {
  const int members = Members();
  if (!started_ || verdict_ || ended_ || members >= told_) return;
  told_ = members;
  members_ = std::min(members_, members);
  for (Peer& p : peers_) {
    if (!p.done) Send(p, absl::StrCat("members ", members));
  }
}

void NodeLink::StopOthers(const Stop& stop, const Peer* from) {
  if (verdict_) return;
  verdict_ = stop.code;
  for (Peer& p : peers_) {
    if (&p != from && !p.done) {
      Send(p, absl::StrCat("stop ", stop.code, " ", stop.why));
    }
  }
}

bool NodeLink::nodes_may_be_lost() const {
  return MinNodes(shape_) < shape_.nodes;
}

std::optional<NodeLink::Stop> NodeLink::BelowMinimum() const {
  if (ended_) return std::nullopt;  // the job is over: losses do not count
  int lost = lost_here_;
  int nodes_lost = lost_here_ == shape_.per_node;
  for (const Peer& p : peers_) {
    lost += p.lost;
    nodes_lost += p.lost == shape_.per_node;
  }
  const int total = shape_.nodes * shape_.per_node;
  if (total - lost < shape_.min_copies) {
    return Stop{TooFewLeft(total - lost, total, shape_.min_copies), 1};
  }
  if (shape_.nodes - nodes_lost < MinNodes(shape_)) {
    return Stop{
        absl::StrCat(shape_.nodes - nodes_lost, " of the job's ", shape_.nodes,
                     " nodes are left (", nodes_lost,
                     " lost), fewer than --min-nodes=", MinNodes(shape_)),
        1};
  }
  return std::nullopt;
}

std::optional<NodeLink::Stop> NodeLink::Gone(Peer& peer) {
  const std::string gone =
      peer.leaving
          ? absl::StrCat("node ", peer.node, " left (its launcher was stopped)")
          : absl::StrCat("node ", peer.node, "'s launcher is gone");
  if (!serving_ || !nodes_may_be_lost()) return Stop{gone, 1};
  peer.lost = shape_.per_node;  // its host, or its launcher and copies
  std::optional<Stop> stop = BelowMinimum();
  if (stop) return Stop{absl::StrCat(gone, ": ", stop->why), 1};
  if (verdict_ || ended_) return std::nullopt;  // the job ends anyway
  Recount();
  std::fprintf(stderr,
               "gradmesh run: %s; its %d processes count as lost, and the "
               "job goes on (--min-nodes=%d)\n",
               gone.c_str(), shape_.per_node, MinNodes(shape_));
  return std::nullopt;
}

void NodeLink::Lost(int count) {
  if (!serving_) {
    Send(peers_.front(), absl::StrCat("lost ", count));
    return;
  }
  lost_here_ = std::max(lost_here_, count);
  std::optional<Stop> stop = BelowMinimum();
  if (!stop) {
    Recount();
  } else if (!verdict_) {
    StopOthers(*stop, nullptr);
    own_stop_ = stop;
  }
}

void NodeLink::Ended() {
  if (ended_) return;
  ended_ = true;
  for (Peer& p : peers_) {
    if (!p.done) Send(p, "ended 0");
  }
}

std::optional<NodeLink::Stop> NodeLink::Poll() {
  std::optional<Stop> first = std::exchange(own_stop_, std::nullopt);
  for (Peer& peer : peers_) {
    std::vector<Stop> stops;
    for (const std::string& line : Read(peer)) {
      if (auto stop = Handle(peer, line)) stops.push_back(*stop);
    }
    if (peer.fd < 0 && !peer.reported) {
      peer.reported = true;
      if (!peer.done && !end_) {
        if (std::optional<Stop> stop = Gone(peer)) stops.push_back(*stop);
      }
      peer.done = true;
    }
    for (const Stop& stop : stops) {
      if (serving_) StopOthers(stop, &peer);
      if (!verdict_) verdict_ = stop.code;
      if (!first) first = stop;
    }
  }
  // Nodes that join the running job, once the links that ended are known.
  if (listener_ >= 0) {
    Accept();
    Admit().IgnoreError();  // after the start: never an error
  }
  if (!first || stopped_) return std::nullopt;
  stopped_ = true;
  why_ = first->why;
  return first;
}

void NodeLink::Failed(int code) {
  code = FailureCode(code);
  if (serving_) {
    StopOthers({NodeFailed(0, code), code}, nullptr);
    return;
  }
  if (!verdict_) verdict_ = code;
  if (!peers_.front().done) Send(peers_.front(), absl::StrCat("done ", code));
  peers_.front().done = true;
}

void NodeLink::Leave() {
  if (serving_ || !nodes_may_be_lost()) {
    Failed(130);
    return;
  }
  Peer& zero = peers_.front();
  if (!verdict_) verdict_ = 130;
  Send(zero, "leaving 0");
  Read(zero);  // unread input would make the close a reset
  if (zero.fd >= 0) {
    shutdown(zero.fd, SHUT_WR);
    close(zero.fd);
  }
  zero.fd = -1;
  zero.done = true;
}

bool NodeLink::AllDone() const {
  return std::all_of(peers_.begin(), peers_.end(),
                     [](const Peer& p) { return p.done || p.fd < 0; });
}

int NodeLink::Finish(int code, int signal_fd) {
  if (code != 0) Failed(code);
  if (!serving_ && !peers_.front().done) {
    Send(peers_.front(), "done 0");
    peers_.front().done = true;
  }
  // Node 0 waits for every node; another node for node 0's verdict.
  auto waiting = [&] {
    return serving_ ? !AllDone() : (!end_ && peers_.front().fd >= 0);
  };
  while (waiting()) {
    std::vector<int> fds = {signal_fd};
    for (const Peer& p : peers_) fds.push_back(p.fd);
    PollInput(fds, kTick);
    if (Signalled(signal_fd)) {
      if (!verdict_) Failed(130);
      if (serving_) {
        for (Peer& p : peers_) Send(p, absl::StrCat("end ", *verdict_));
      }
      return *verdict_;
    }
    Poll();
  }
  const int verdict = verdict_.value_or(0);
  if (serving_) {
    for (Peer& p : peers_) Send(p, absl::StrCat("end ", verdict));
    return verdict;
  }
  if (end_) return *end_;
  return verdict != 0 ? verdict : 1;  // node 0 left without a verdict
}

}  // namespace gradmesh::tools

#include "tools/gradmesh/node_link.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace gradmesh::tools {
namespace {

constexpr absl::Duration kTick = absl::Milliseconds(100);
constexpr size_t kMaxLine = 4096;  // a longer line breaks the link

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, O_NONBLOCK); }

// Waits up to `timeout` for input on `fds` (all of them polled for input).
void PollInput(const std::vector<int>& fds, absl::Duration timeout) {
  std::vector<pollfd> polled;
  for (int fd : fds) polled.push_back({.fd = fd, .events = POLLIN});
  poll(polled.data(), polled.size(), absl::ToInt64Milliseconds(timeout));
}

// A socket listening on `port` of every interface.
absl::StatusOr<int> Listen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address = {.sin_family = AF_INET,
                         .sin_port = htons(static_cast<uint16_t>(port)),
                         .sin_addr = {.s_addr = htonl(INADDR_ANY)}};
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 64) != 0) {
    const absl::Status status =
        Errno(absl::StrCat("the launchers' link on port ", port));
    close(fd);
    return status;
  }
  SetNonBlocking(fd);
  return fd;
}

// A connection to host:port, or an error.
absl::StatusOr<int> Connect(const std::string& host, int port) {
  addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
  addrinfo* found = nullptr;
  if (const int error =
          getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found);
      error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool connected =
      fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    const absl::Status status = Errno(absl::StrCat(host, ":", port));
    if (fd >= 0) close(fd);
    return status;
  }
  SetNonBlocking(fd);
  return fd;
}

// "word N" split into its word and number; nullopt if malformed.
std::optional<std::pair<std::string, int>> Parse(const std::string& line) {
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  int number = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &number)) {
    return std::nullopt;
  }
  return std::make_pair(parts[0], number);
}

}  // namespace

NodeLink::~NodeLink() {
  for (Peer& peer : peers_) {
    if (peer.fd >= 0) close(peer.fd);
  }
}

std::vector<std::string> NodeLink::Read(Peer& peer) {
  std::vector<std::string> lines;
  char buffer[4096];
  while (peer.fd >= 0) {
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
  if (send(peer.fd, data.data(), data.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(data.size())) {
    close(peer.fd);
    peer.fd = -1;
  }
}

absl::StatusOr<std::unique_ptr<NodeLink>> NodeLink::Serve(
    int port, int nodes, const std::string& job, absl::Time deadline) {
  std::unique_ptr<NodeLink> link(new NodeLink());
  link->serving_ = true;
  link->job_ = job;
  absl::StatusOr<int> listener = Listen(port);
  if (!listener.ok()) return listener.status();
  std::vector<Peer> joining;
  std::vector<bool> joined(nodes, false);
  joined[0] = true;
  while (std::count(joined.begin(), joined.end(), true) < nodes &&
         absl::Now() < deadline) {
    std::vector<int> fds = {*listener};
    for (const Peer& p : joining) fds.push_back(p.fd);
    PollInput(fds, kTick);
    for (int fd; (fd = accept4(*listener, nullptr, nullptr,
                               SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
      joining.push_back({.fd = fd});
    }
    for (Peer& p : joining) {
      const std::vector<std::string> lines = link->Read(p);
      if (lines.empty() || p.node >= 0 || p.fd < 0) continue;
      const auto hello = Parse(lines.front());
      if (!hello || hello->first != "node" || hello->second < 1 ||
          hello->second >= nodes || joined[hello->second]) {
        link->Send(p, "stop 1");  // a stranger, or a node twice
        close(p.fd);
        p.fd = -1;
        continue;
      }
      p.node = hello->second;
      joined[p.node] = true;
    }
    std::erase_if(joining, [](const Peer& p) { return p.fd < 0; });
  }
  close(*listener);
  for (Peer& p : joining) {
    if (p.node >= 0) {
      link->peers_.push_back(std::move(p));
    } else if (p.fd >= 0) {  // not a node of this job, or one too many
      link->Send(p, "stop 1");
      close(p.fd);
    }
  }
  std::vector<int> missing;
  for (int n = 1; n < nodes; ++n) {
    if (!joined[n]) missing.push_back(n);
  }
  if (!missing.empty()) {
    for (Peer& p : link->peers_) link->Send(p, "stop 1");
    return absl::DeadlineExceededError(absl::StrCat(
        "node ", absl::StrJoin(missing, ", "), " of ", nodes,
        " did not join in time (its `gradmesh run --node_rank=...` never "
        "reached port ",
        port, " here)"));
  }
  for (Peer& p : link->peers_) link->Send(p, absl::StrCat("job ", job));
  return link;
}

absl::StatusOr<std::unique_ptr<NodeLink>> NodeLink::Join(
    const std::string& host, int port, int node, absl::Time deadline) {
  std::unique_ptr<NodeLink> link(new NodeLink());
  absl::StatusOr<int> fd = Connect(host, port);
  while (!fd.ok() && absl::IsUnavailable(fd.status()) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    fd = Connect(host, port);
  }
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("node 0's launcher did not answer: ",
                                     fd.status().message()));
  }
  link->peers_.push_back({.fd = *fd, .node = 0});
  Peer& zero = link->peers_.front();
  link->Send(zero, absl::StrCat("node ", node));
  while (absl::Now() < deadline) {
    PollInput({zero.fd}, kTick);
    for (const std::string& line : link->Read(zero)) {
      if (absl::StartsWith(line, "job ")) {
        link->job_ = line.substr(4);
        return link;
      }
      return absl::FailedPreconditionError(
          absl::StrCat("node 0's launcher refused node ", node,
                       " (another node has that rank, or the job gave up)"));
    }
    if (zero.fd < 0) {
      return absl::UnavailableError("node 0's launcher closed the link");
    }
  }
  return absl::DeadlineExceededError(
      "node 0's launcher did not start the job in time (not every node "
      "joined)");
}

std::optional<NodeLink::Stop> NodeLink::Handle(Peer& peer,
                                               const std::string& line) {
  const auto parsed = Parse(line);
  if (!parsed) return std::nullopt;
  const auto& [word, code] = *parsed;
  if (word == "done") {
    peer.done = true;
    if (code == 0) return std::nullopt;
    return Stop{absl::StrCat("node ", peer.node, "'s processes failed (",
                             "its exit status ", code, ")"),
                code};
  }
  if (word == "stop") {
    return Stop{"node 0 stops the job: another node failed", code};
  }
  if (word == "end") end_ = code;
  return std::nullopt;
}

void NodeLink::StopOthers(const Stop& stop, const Peer* from) {
  if (verdict_) return;
  verdict_ = stop.code;
  for (Peer& p : peers_) {
    if (&p != from && !p.done) Send(p, absl::StrCat("stop ", stop.code));
  }
}

std::optional<NodeLink::Stop> NodeLink::Poll() {
  std::optional<Stop> first;
  for (Peer& peer : peers_) {
    if (peer.fd < 0) continue;
    std::vector<Stop> stops;
    for (const std::string& line : Read(peer)) {
      if (auto stop = Handle(peer, line)) stops.push_back(*stop);
    }
    if (peer.fd < 0) {
      if (!peer.done && !end_) {
        stops.push_back(
            {absl::StrCat("node ", peer.node, "'s launcher is gone"), 1});
      }
      peer.done = true;
    }
    for (const Stop& stop : stops) {
      if (serving_) StopOthers(stop, &peer);
      if (!verdict_) verdict_ = stop.code;
      if (!first) first = stop;
    }
  }
  if (!first || stopped_) return std::nullopt;
  stopped_ = true;
  return first;
}

void NodeLink::Failed(int code) {
  if (serving_) {
    StopOthers({"node 0's processes failed", code}, nullptr);
    return;
  }
  if (!verdict_) verdict_ = code;
  Send(peers_.front(), absl::StrCat("done ", code));
  peers_.front().done = true;
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
    for (const Peer& p : peers_) {
      if (p.fd >= 0) fds.push_back(p.fd);
    }
    PollInput(fds, kTick);
    signalfd_siginfo info;
    if (read(signal_fd, &info, sizeof(info)) == sizeof(info)) return 130;
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

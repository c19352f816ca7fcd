// Throughput of the gRPC transport against a plain TCP socket, between two
// processes on 127.0.0.1, measured in the same run.
//
//   build/bench/transport_bench [--mib=64] [--chunk_kib=1024] [--repeats=5]
//
// Each repeat sends one message of --mib MiB from the parent to a forked
// child, which answers with one byte once it has everything: over a TCP
// socket (write() in chunk-sized pieces), then over GrpcTransport (the
// message cut into chunk-sized frames). Prints the median of each and their
// ratio.
//
//   build/bench/transport_bench --fit [--netns=A,B --hosts=IP_A,IP_B]
//
// --fit measures a link instead: ping-pong over GrpcTransport with messages
// of 1 B to --fit_max_kib, the two processes optionally in network
// namespaces A and B (root needed), and prints one JSON line with the median
// one-way time per size, {"points": [[bytes, seconds], ...]}
// (bench/cluster_bench.py fits alpha and beta to them).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cli.h"
#include "grpcpp/grpcpp.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/grpc/peer_service.h"

ABSL_FLAG(int, mib, 64, "message size in MiB");
ABSL_FLAG(int, chunk_kib, 1024, "chunk (TCP write, gRPC frame) size in KiB");
ABSL_FLAG(int, repeats, 5, "transfers per transport; the median is shown");
ABSL_FLAG(bool, fit, false,
          "measure alpha and beta of the link by ping-pong (see above)");
ABSL_FLAG(std::vector<std::string>, netns, {},
          "--fit: the network namespaces of the two ends (empty: this one)");
ABSL_FLAG(std::vector<std::string>, hosts,
          std::vector<std::string>({"127.0.0.1", "127.0.0.1"}),
          "--fit: the addresses the two ends bind to");
ABSL_FLAG(int, fit_max_kib, 4096, "--fit: the largest message, KiB");

namespace {

using gradmesh::transport::GrpcTransport;
using gradmesh::transport::PeerService;
using gradmesh::transport::Tag;

void Die(const std::string& what) {
  std::perror(what.c_str());
  std::exit(1);
}

int Listen(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) ||
      listen(fd, 1)) {
    Die("bind/listen");
  }
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *port = ntohs(address.sin_port);
  return fd;
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address))) {
    Die("connect");
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n <= 0) Die("write");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void ReadAll(int fd, char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = read(fd, data, size);
    if (n <= 0) Die("read");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A gRPC endpoint: its server (PeerService) and, per repeat, a transport.
struct GrpcEnd {
  PeerService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  void Start(const std::string& host = "127.0.0.1") {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat(host, ":0"),
                             grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(&service);
    server = builder.BuildAndStart();
  }
};

// One transport per repeat (a new epoch, as after a membership change) over
// one channel, as the worker's channel cache keeps it: the connection and
// its HTTP/2 windows stay warm between repeats, as between operations.
std::unique_ptr<GrpcTransport> MakeTransport(
    GrpcEnd& end, int rank, int own_port, int peer_port, uint64_t epoch,
    uint64_t chunk, const std::shared_ptr<grpc::Channel>& channel) {
  std::vector<std::string> peers(2);
  peers[rank] = absl::StrCat("127.0.0.1:", own_port);
  peers[1 - rank] = absl::StrCat("127.0.0.1:", peer_port);
  return *GrpcTransport::Create(
      {.service = &end.service,
       .epoch = epoch,
       .rank = rank,
       .peers = peers,
       .channels = [channel](const std::string&) { return channel; },
       .chunk_bytes = chunk});
}

void EnterNetns(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) Die("setns " + path);
  close(fd);
}

// One end of the ping-pong: rank 0 sends each size and times the echo.
std::vector<std::pair<double, double>> PingPong(
    GrpcTransport& t, const std::vector<size_t>& sizes, int repeats) {
  std::vector<std::pair<double, double>> points;  // bytes, one-way seconds
  uint64_t op = 0;
  for (size_t size : sizes) {
    std::vector<double> times;
    for (int r = 0; r <= repeats; ++r, ++op) {  // r = 0 warms up
      const int peer = 1 - t.rank();
      const absl::Time deadline = absl::Now() + absl::Seconds(120);
      std::string message(t.rank() == 0 ? size : 0, 'g');  // made untimed
      const absl::Time start = absl::Now();
      if (t.rank() == 0) {
        if (!t.Send(peer, {0, op, 0}, std::move(message)).ok()) _exit(3);
        if (!t.Recv(peer, {0, op, 1}, deadline).ok()) _exit(3);
      } else {
        auto echo = t.Recv(peer, {0, op, 0}, deadline);
        if (!echo.ok() || !t.Send(peer, {0, op, 1}, *std::move(echo)).ok()) {
          _exit(3);
        }
      }
      if (r > 0)
        times.push_back(absl::ToDoubleSeconds(absl::Now() - start) / 2);
    }
    points.emplace_back(static_cast<double>(size), Median(times));
  }
  return points;
}

// Streams still open are cut after this.
std::chrono::system_clock::time_point ShutdownDeadline() {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(500);
}

int RunFit() {
  const std::vector<std::string> netns = absl::GetFlag(FLAGS_netns);
  const std::vector<std::string> hosts = absl::GetFlag(FLAGS_hosts);
  if ((!netns.empty() && netns.size() != 2) || hosts.size() != 2) {
    std::fprintf(stderr, "--fit: --netns and --hosts name two ends\n");
    return 2;
  }
  std::vector<size_t> sizes = {1};
  for (size_t kib = 4;
       kib <= static_cast<size_t>(absl::GetFlag(FLAGS_fit_max_kib)); kib *= 4) {
    sizes.push_back(kib << 10);
  }
  int to_child[2], to_parent[2];
  if (pipe(to_child) || pipe(to_parent)) Die("pipe");
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) Die("fork");
  const int rank = child == 0 ? 1 : 0;
  if (rank == 1) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the parent
    if (getppid() != parent) _exit(1);
  }
  // Each end keeps its own pipe ends, so that a dead peer reads as EOF.
  const int out = rank == 0 ? to_child[1] : to_parent[1];
  const int in = rank == 0 ? to_parent[0] : to_child[0];
  close(rank == 0 ? to_child[0] : to_parent[0]);
  close(rank == 0 ? to_parent[1] : to_child[1]);
  if (!netns.empty()) EnterNetns(netns[rank]);
  GrpcEnd end;
  end.Start(hosts[rank]);
  if (end.server == nullptr) Die("grpc server on " + hosts[rank]);
  int peer_port = 0;
  if (write(out, &end.port, sizeof(int)) != sizeof(int) ||
      read(in, &peer_port, sizeof(int)) != sizeof(int)) {
    Die("pipe");
  }
  std::vector<std::string> peers(2);
  peers[rank] = absl::StrCat(hosts[rank], ":", end.port);
  peers[1 - rank] = absl::StrCat(hosts[1 - rank], ":", peer_port);
  auto channel =
      grpc::CreateChannel(peers[1 - rank], grpc::InsecureChannelCredentials());
  auto t = *GrpcTransport::Create(
      {.service = &end.service,
       .epoch = 0,
       .rank = rank,
       .peers = peers,
       .channels = [channel](const std::string&) { return channel; }});
  const auto points = PingPong(*t, sizes, absl::GetFlag(FLAGS_repeats));
  if (rank == 1) {
    // Send never waits: the last echo may still be on its way until rank 0
    // says it has it (or is gone: EOF).
    char done;
    (void)!read(in, &done, 1);
    t.reset();
    end.server->Shutdown(ShutdownDeadline());
    gradmesh::ExitAfterShutdown(0);
  }
  if (write(out, "d", 1) != 1) Die("pipe");
  t.reset();  // its stream ends, so the child's server can stop
  int status = 0;
  waitpid(child, &status, 0);
  end.server->Shutdown(ShutdownDeadline());
  std::string json;
  for (const auto& [bytes, seconds] : points) {
    absl::StrAppend(&json, json.empty() ? "" : ",", "[", bytes, ",", seconds,
                    "]");
  }
  std::printf("{\"points\":[%s]}\n", json.c_str());
  std::fflush(stdout);
  gradmesh::ExitAfterShutdown(
      WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  gradmesh::KeepLargeBuffersWarm();  // as gradmesh-worker does
  if (absl::GetFlag(FLAGS_repeats) < 1) {
    std::fprintf(stderr, "--repeats must be at least 1\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_fit)) return RunFit();
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_mib)) << 20;
  const size_t chunk = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib))
                       << 10;
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int transfers = repeats + 1;  // the first warms up, untimed
  const std::string payload(bytes, 'g');

  // Ports travel over pipes; fork before either side starts gRPC.
  int to_child[2], to_parent[2];
  if (pipe(to_child) || pipe(to_parent)) Die("pipe");
  int tcp_port = 0;
  const int listener = Listen(&tcp_port);
  const pid_t child = fork();
  if (child == 0) {
    // Receiver: TCP first, then gRPC.
    std::string buffer(bytes, '\0');
    for (int r = 0; r < transfers; ++r) {
      const int fd = accept(listener, nullptr, nullptr);
      ReadAll(fd, buffer.data(), bytes);
      WriteAll(fd, "k", 1);
      close(fd);
    }
    GrpcEnd end;
    end.Start();
    if (write(to_parent[1], &end.port, sizeof(int)) != sizeof(int)) Die("pipe");
    int parent_port = 0;
    if (read(to_child[0], &parent_port, sizeof(int)) != sizeof(int)) {
      Die("pipe");
    }
    const auto channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", parent_port),
                            grpc::InsecureChannelCredentials());
    for (int r = 0; r < transfers; ++r) {
      auto t = MakeTransport(end, 1, end.port, parent_port, r, chunk, channel);
      auto message = t->Recv(0, {static_cast<uint64_t>(r), 0, 0},
                             absl::Now() + absl::Seconds(60));
      if (!message.ok() || message->size() != bytes) _exit(2);
      if (!t->Send(0, {static_cast<uint64_t>(r), 0, 1}, "k").ok()) _exit(2);
      // Keep the stream until the parent has the answer.
      absl::SleepFor(absl::Milliseconds(50));
    }
    end.server->Shutdown();
    _exit(0);
  }
  close(listener);

  std::vector<double> tcp, grpc_rates;
  for (int r = 0; r < transfers; ++r) {
    const int fd = Connect(tcp_port);
    const absl::Time start = absl::Now();
    for (size_t offset = 0; offset < bytes; offset += chunk) {
      WriteAll(fd, payload.data() + offset, std::min(chunk, bytes - offset));
    }
    char ack;
    ReadAll(fd, &ack, 1);
    if (r > 0)
      tcp.push_back(bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
    close(fd);
  }

  GrpcEnd end;
  end.Start();
  int child_port = 0;
  if (read(to_parent[0], &child_port, sizeof(int)) != sizeof(int)) Die("pipe");
  if (write(to_child[1], &end.port, sizeof(int)) != sizeof(int)) Die("pipe");
  const auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", child_port),
                          grpc::InsecureChannelCredentials());
  for (int r = 0; r < transfers; ++r) {
    auto t = MakeTransport(end, 0, end.port, child_port, r, chunk, channel);
    std::string message = payload;  // Send takes the message: copy untimed
    const absl::Time start = absl::Now();
    if (!t->Send(1, {static_cast<uint64_t>(r), 0, 0}, std::move(message))
             .ok()) {
      return 1;
    }
    auto ack = t->Recv(1, {static_cast<uint64_t>(r), 0, 1},
                       absl::Now() + absl::Seconds(60));
    if (!ack.ok()) {
      std::fprintf(stderr, "grpc: %s\n", ack.status().ToString().c_str());
      return 1;
    }
    if (r > 0)
      grpc_rates.push_back(bytes / absl::ToDoubleSeconds(absl::Now() - start) /
                           1e9);
  }
  int status = 0;
  waitpid(child, &status, 0);
  end.server->Shutdown();

  const double tcp_rate = Median(tcp), grpc_rate = Median(grpc_rates);
  std::printf("message %zu MiB, chunks %zu KiB, median of %d\n", bytes >> 20,
              chunk >> 10, repeats);
  std::printf("tcp socket      %6.2f GB/s\n", tcp_rate);
  std::printf("grpc transport  %6.2f GB/s  (%.0f%% of tcp)\n", grpc_rate,
              100 * grpc_rate / tcp_rate);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

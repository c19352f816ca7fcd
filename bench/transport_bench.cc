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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

  void Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterCallbackGenericService(&service);
    server = builder.BuildAndStart();
  }
};

std::unique_ptr<GrpcTransport> MakeTransport(GrpcEnd& end, int rank,
                                             int own_port, int peer_port,
                                             uint64_t epoch, uint64_t chunk) {
  std::vector<std::string> peers(2);
  peers[rank] = absl::StrCat("127.0.0.1:", own_port);
  peers[1 - rank] = absl::StrCat("127.0.0.1:", peer_port);
  auto channel =
      grpc::CreateChannel(peers[1 - rank], grpc::InsecureChannelCredentials());
  return *GrpcTransport::Create(
      {.service = &end.service,
       .epoch = epoch,
       .rank = rank,
       .peers = peers,
       .channels = [channel](const std::string&) { return channel; },
       .chunk_bytes = chunk});
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  gradmesh::KeepLargeBuffersWarm();  // as gradmesh-worker does
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_mib)) << 20;
  const size_t chunk = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib))
                       << 10;
  const int repeats = absl::GetFlag(FLAGS_repeats);
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
    for (int r = 0; r < repeats; ++r) {
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
    for (int r = 0; r < repeats; ++r) {
      auto t = MakeTransport(end, 1, end.port, parent_port, r, chunk);
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
  for (int r = 0; r < repeats; ++r) {
    const int fd = Connect(tcp_port);
    const absl::Time start = absl::Now();
    for (size_t offset = 0; offset < bytes; offset += chunk) {
      WriteAll(fd, payload.data() + offset, std::min(chunk, bytes - offset));
    }
    char ack;
    ReadAll(fd, &ack, 1);
    tcp.push_back(bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
    close(fd);
  }

  GrpcEnd end;
  end.Start();
  int child_port = 0;
  if (read(to_parent[0], &child_port, sizeof(int)) != sizeof(int)) Die("pipe");
  if (write(to_child[1], &end.port, sizeof(int)) != sizeof(int)) Die("pipe");
  for (int r = 0; r < repeats; ++r) {
    auto t = MakeTransport(end, 0, end.port, child_port, r, chunk);
    const absl::Time start = absl::Now();
    if (!t->Send(1, {static_cast<uint64_t>(r), 0, 0}, payload).ok()) return 1;
    auto ack = t->Recv(1, {static_cast<uint64_t>(r), 0, 1},
                       absl::Now() + absl::Seconds(60));
    if (!ack.ok()) {
      std::fprintf(stderr, "grpc: %s\n", ack.status().ToString().c_str());
      return 1;
    }
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

// GrpcNetwork: P ranks of the gRPC transport in one process, each with its
// own server and PeerService, connected by in-process channels. The same
// shape as LoopbackNetwork, so multi-rank tests run over either.
#ifndef GRADMESH_TESTS_SUPPORT_GRPC_NETWORK_H_
#define GRADMESH_TESTS_SUPPORT_GRPC_NETWORK_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/grpc/peer_service.h"

namespace gradmesh::testing {

class GrpcNetwork {
 public:
  explicit GrpcNetwork(int size, uint64_t chunk_bytes = 1 << 20,
                       uint64_t epoch = 0,
                       uint64_t held_bytes_per_peer =
                           transport::PeerService::kDefaultHeldBytesPerPeer) {
    for (int r = 0; r < size; ++r) {
      services_.push_back(
          std::make_unique<transport::PeerService>(held_bytes_per_peer));
      grpc::ServerBuilder builder;
      builder.RegisterCallbackGenericService(services_.back().get());
      servers_.push_back(builder.BuildAndStart());
      addresses_.push_back(absl::StrCat(r));  // resolved by channel()
    }
    StartEpoch(epoch, chunk_bytes);
  }

  ~GrpcNetwork() {
    // gRPC waits unbounded after a shutdown's deadline, for every call to
    // end: a test that would hang there fails by name instead.
    absl::Notification done;
    std::thread watchdog([&done] {
      if (!done.WaitForNotificationWithTimeout(absl::Seconds(120))) {
        std::fprintf(stderr,
                     "GrpcNetwork: its transports and servers had not shut "
                     "down 120 s after it began\n");
        std::abort();
      }
    });
    transports_.clear();
    // Bounded, as the daemon's: calls still open after it are cancelled
    // instead of waited for (under ASan a stream's end can lag its client).
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::seconds(5);
    for (auto& server : servers_) server->Shutdown(deadline);
    done.Notify();
    watchdog.join();
  }

  // Replaces every rank's transport with one of `epoch`.
  void StartEpoch(uint64_t epoch, uint64_t chunk_bytes = 1 << 20) {
    transports_.clear();
    for (int r = 0; r < static_cast<int>(servers_.size()); ++r) {
      auto t = MakeTransport(r, epoch, chunk_bytes);
      EXPECT_TRUE(t.ok()) << t.status();
      transports_.push_back(*std::move(t));
    }
  }

  int size() const { return static_cast<int>(servers_.size()); }
  transport::GrpcTransport* endpoint(int rank) const {
    return transports_[rank].get();
  }
  // A transport of `epoch` for rank `rank`, beside those the network holds.
  absl::StatusOr<std::unique_ptr<transport::GrpcTransport>> MakeTransport(
      int rank, uint64_t epoch, uint64_t chunk_bytes = 1 << 20) {
    return transport::GrpcTransport::Create(
        {.service = services_[rank].get(),
         .epoch = epoch,
         .rank = rank,
         .peers = addresses_,
         .channels = [this](const std::string& a) { return channel(a); },
         .chunk_bytes = chunk_bytes});
  }

  // Destroys rank `rank`'s transport (its epoch closes at its service).
  void DropTransport(int rank) { transports_[rank].reset(); }

  transport::PeerService* service(int rank) const {
    return services_[rank].get();
  }

  // An in-process channel to rank `rank`'s server.
  std::shared_ptr<grpc::Channel> channel(int rank) const {
    return servers_[rank]->InProcessChannel(grpc::ChannelArguments());
  }

  // Shuts rank `rank`'s server down at once, as if the process had died:
  // its streams break.
  void KillRank(int rank) {
    servers_[rank]->Shutdown(absl::ToChronoTime(absl::Now()));
  }

 private:
  std::shared_ptr<grpc::Channel> channel(const std::string& address) const {
    int rank = 0;
    EXPECT_TRUE(absl::SimpleAtoi(address, &rank));
    return channel(rank);
  }

  std::vector<std::unique_ptr<transport::PeerService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<transport::GrpcTransport>> transports_;
};

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_GRPC_NETWORK_H_

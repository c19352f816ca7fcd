// TcpProxy: a TCP forwarder on 127.0.0.1 whose connections a test can cut,
// as a network fault would (a reset link): Cut() ends every connection open
// now; new connections are accepted and forwarded as before. Freeze(true)
// stops forwarding without closing anything (a link that drops every
// packet): connections, new ones too, carry nothing until Freeze(false).
//
//   TcpProxy proxy(server_port);
//   dial(absl::StrCat("127.0.0.1:", proxy.port()));
//   proxy.Cut();
//
// Thread-safe; the destructor closes everything and joins its threads.
#ifndef GRADMESH_TESTS_SUPPORT_TCP_PROXY_H_
#define GRADMESH_TESTS_SUPPORT_TCP_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradmesh::testing {

class TcpProxy {
 public:
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = Loopback(0);
    EXPECT_EQ(
        bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)),
        0);
    EXPECT_EQ(listen(listener_, 16), 0);
    socklen_t length = sizeof(address);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~TcpProxy() {
    Freeze(false);
    shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    close(listener_);
    Cut();
    std::vector<std::thread> pumps;
    {
      absl::MutexLock lock(&mu_);
      pumps = std::move(pumps_);
    }
    for (std::thread& pump : pumps) pump.join();
  }

  int port() const { return port_; }

  void Freeze(bool frozen) { frozen_.store(frozen); }

  // Ends every connection open now (both sides see it close).
  void Cut() {
    absl::MutexLock lock(&mu_);
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
  }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
  }

  void AcceptLoop() {
    while (true) {
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) return;  // the listener was shut down
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in target = Loopback(target_port_);
      if (connect(server, reinterpret_cast<sockaddr*>(&target),
                  sizeof(target)) != 0) {
        close(client);
        close(server);
        continue;
      }
      absl::MutexLock lock(&mu_);
      open_.push_back(client);
      open_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
    }
  }

  // Copies bytes both ways until either side ends, then closes both.
  void Pump(int a, int b) {
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    char buffer[1 << 16];
    bool done = false;
    while (!done && poll(fds, 2, -1) > 0) {
      if (frozen_.load()) {  // what waits stays in the socket buffers
        absl::SleepFor(absl::Milliseconds(10));
        continue;
      }
      for (int i = 0; i < 2 && !done; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t got = read(fds[i].fd, buffer, sizeof(buffer));
        done = got <= 0 || !WriteAll(fds[1 - i].fd, buffer, got);
      }
    }
    absl::MutexLock lock(&mu_);
    std::erase(open_, a);
    std::erase(open_, b);
    close(a);
    close(b);
  }

  static bool WriteAll(int fd, const char* data, ssize_t size) {
    while (size > 0) {
      const ssize_t wrote = write(fd, data, size);
      if (wrote <= 0) return false;
      data += wrote;
      size -= wrote;
    }
    return true;
  }

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> frozen_ = false;
  absl::Mutex mu_;
  std::vector<int> open_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_TCP_PROXY_H_

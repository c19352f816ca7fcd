#include "common/metrics/metrics_endpoint.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"

namespace gradmesh {

// Refreshes, then hands the registry's families to the exposer.
class MetricsEndpoint::Fresh final : public prometheus::Collectable {
 public:
  Fresh(std::shared_ptr<prometheus::Registry> registry,
        std::function<void()> refresh)
      : registry_(std::move(registry)), refresh_(std::move(refresh)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    if (refresh_) refresh_();
    return registry_->Collect();
  }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  const std::function<void()> refresh_;
};

namespace {

// The host a local client reaches civetweb's `listen` at: a wildcard's
// loopback, else the host itself (brackets taken off). Of a list, the first.
std::string ReachableHost(std::string listen) {
  listen = listen.substr(0, listen.find(','));
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || listen.front() == '+') return "127.0.0.1";
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

// Where `host`:`port` is, an IPv4 address first (civetweb binds a name's
// first); size 0 if it does not resolve.
void Resolve(const std::string& host, int port, sockaddr_storage* address,
             socklen_t* size) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  *size = 0;
  if (getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found) !=
      0) {
    return;
  }
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  if (pick != nullptr && pick->ai_addrlen <= sizeof(*address)) {
    std::memcpy(address, pick->ai_addr, pick->ai_addrlen);
    *size = pick->ai_addrlen;
  }
  freeaddrinfo(found);
}

// Opens, and closes within 20 ms, a connection to `address`. False once
// the port refuses: nothing listens there any more.
bool Touch(const sockaddr_storage& address, socklen_t size) {
  const int fd =
      socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;
  bool listening = true;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), size) != 0) {
    if (errno == EINPROGRESS) {
      pollfd wait{.fd = fd, .events = POLLOUT, .revents = 0};
      poll(&wait, 1, /*timeout_ms=*/20);
    } else {
      listening = errno != ECONNREFUSED;
    }
  }
  close(fd);
  return listening;
}

}  // namespace

MetricsEndpoint::~MetricsEndpoint() {
  if (exposer_ == nullptr) return;
  // civetweb's listening thread sees the stop only when its poll returns:
  // every 2 s, or at once on a connection. Connections to the port wake it
  // (600 tries at most, about 3 s, and none once the port refuses).
  absl::Notification stopped;
  std::thread stopper([&] {
    exposer_.reset();
    stopped.Notify();
  });
  bool listening = wake_size_ > 0;
  for (int i = 0; i < 600 && !stopped.WaitForNotificationWithTimeout(
                                 absl::Milliseconds(5));
       ++i) {
    if (listening) listening = Touch(wake_, wake_size_);
  }
  stopper.join();
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
    std::function<void()> refresh) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->fresh_ =
      std::make_shared<Fresh>(std::move(registry), std::move(refresh));
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", listen, ": ", e.what()));
  }
  endpoint->exposer_->RegisterCollectable(endpoint->fresh_);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  if (!ports.empty()) endpoint->port_ = ports.front();
  if (endpoint->port_ > 0) {
    Resolve(ReachableHost(listen), endpoint->port_, &endpoint->wake_,
            &endpoint->wake_size_);
  }
  return endpoint;
}

}  // namespace gradmesh

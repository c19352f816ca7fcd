#include "common/metrics/metrics_endpoint.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
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

// The host a local client reaches `listen` (host:port) at: a wildcard
// address's loopback, else the host itself (brackets taken off).
std::string ReachableHost(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

// Opens and at once closes a connection to host:port (errors ignored).
void Touch(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found) !=
      0) {
    return;
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

MetricsEndpoint::~MetricsEndpoint() {
  if (exposer_ == nullptr) return;
  // civetweb's listening thread sees the stop only when its poll returns:
  // every 2 s, or at once on a connection. Connections to the port wake it,
  // so that a daemon stops in milliseconds rather than about a second.
  absl::Notification stopped;
  std::thread stopper([&] {
    exposer_.reset();
    stopped.Notify();
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(3);
  while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(5)) &&
         absl::Now() < give_up) {
    if (port_ > 0) Touch(host_, port_);
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
  endpoint->host_ = ReachableHost(listen);
  return endpoint;
}

}  // namespace gradmesh

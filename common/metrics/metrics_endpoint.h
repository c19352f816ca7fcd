// MetricsEndpoint: serves a prometheus-cpp registry at /metrics, calling a
// refresh function before each scrape, so that gauges derived from state
// (coordinator views, residual norms) are computed when asked for instead of
// on every operation.
//
//   auto registry = std::make_shared<prometheus::Registry>();
//   GM_ASSIGN_OR_RETURN(auto endpoint, MetricsEndpoint::Start(
//       "0.0.0.0:9100", registry, [&] { UpdateGauges(); }));
//
// The refresh runs on the HTTP server's thread; it must be thread-safe and
// must not block for long, nor wait on the thread that destroys the
// endpoint. Destruction stops the server and returns once its threads are
// done: usually within milliseconds; up to about 2 s while an idle client
// holds a connection open; after any scrape in progress.
#ifndef GRADMESH_COMMON_METRICS_METRICS_ENDPOINT_H_
#define GRADMESH_COMMON_METRICS_METRICS_ENDPOINT_H_

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace gradmesh {

class MetricsEndpoint {
 public:
  // Serves on `listen` (host:port; port 0 picks one). Unavailable if it
  // can't be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
      std::function<void()> refresh);

  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  class Fresh;

  MetricsEndpoint() = default;

  std::shared_ptr<Fresh> fresh_;  // the exposer holds it weakly
  std::unique_ptr<prometheus::Exposer> exposer_;
  sockaddr_storage wake_{};  // where a connection reaches the server
  socklen_t wake_size_ = 0;  // 0: nowhere known
  int port_ = 0;
};

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_METRICS_METRICS_ENDPOINT_H_

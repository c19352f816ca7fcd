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
// must not block for long. Destruction stops the server: it returns once
// the server's threads are done (within milliseconds).
#ifndef GRADMESH_COMMON_METRICS_METRICS_ENDPOINT_H_
#define GRADMESH_COMMON_METRICS_METRICS_ENDPOINT_H_

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
  std::string host_;  // where to connect to this server's port
  int port_ = 0;
};

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_METRICS_METRICS_ENDPOINT_H_

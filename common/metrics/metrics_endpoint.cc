#include "common/metrics/metrics_endpoint.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  return endpoint;
}

}  // namespace gradmesh

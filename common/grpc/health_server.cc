#include "common/grpc/health_server.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace gradmesh {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthServerImpl final : public HealthServer,
                               public grpc::health::v1::Health::Service {
 public:
  absl::Status Init(const std::string& listen) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", listen, " for health checks"));
    }
    return absl::OkStatus();
  }

  ~HealthServerImpl() override { Stop(); }

  void SetReady(bool ready) override {
    absl::MutexLock lock(&mu_);
    ready_ = ready;
  }

  int port() const override { return port_; }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_ || server_ == nullptr) return;
      stopped_ = true;
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  grpc::Status Check(grpc::ServerContext*, const HealthCheckRequest* request,
                     HealthCheckResponse* response) override {
    absl::MutexLock lock(&mu_);
    bool serving;
    if (request->service().empty()) {
      serving = !stopped_;
    } else if (request->service() == kReadinessService) {
      serving = !stopped_ && ready_;
    } else {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
    }
    response->set_status(serving ? HealthCheckResponse::SERVING
                                 : HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(
    const std::string& listen) {
  auto server = std::make_unique<HealthServerImpl>();
  if (absl::Status s = server->Init(listen); !s.ok()) return s;
  return server;
}

absl::Status CheckHealth(const std::string& address, const std::string& service,
                         int timeout_ms) {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);  // a probe asks directly
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), arguments));
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Milliseconds(timeout_ms)));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::NotFoundError(
        absl::StrCat(address, " serves no health service \"", service, "\""));
  }
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat(address, ": ", status.error_message(), " (gRPC code ",
                     static_cast<int>(status.error_code()), ")"));
  }
  if (response.status() != HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        address, " service \"", service,
        "\": ", HealthCheckResponse::ServingStatus_Name(response.status())));
  }
  return absl::OkStatus();
}

}  // namespace gradmesh

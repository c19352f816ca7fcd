#include "client/worker_client.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradmesh::client {

namespace v1 = ::gradmesh::v1;

namespace {

template <typename T>
std::vector<T> FromBytes(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerClient>> WorkerClient::Connect(
    const std::string& address, const TlsFiles& tls) {
  GM_ASSIGN_OR_RETURN(auto credentials, ChannelCredentials(tls));
  auto channel = grpc::CreateCustomChannel(address, credentials,
                                           DefaultChannelArguments());
  return std::unique_ptr<WorkerClient>(
      new WorkerClient(v1::Worker::NewStub(std::move(channel))));
}

absl::StatusOr<Reduced> WorkerClient::AllReduce(
    uint64_t step, const std::vector<Tensor>& tensors, bool return_residuals,
    absl::Duration timeout) {
  v1::AllReduceRequest request;
  request.set_step(step);
  request.set_return_residuals(return_residuals);
  for (const Tensor& t : tensors) {
    v1::Tensor* out = request.add_tensors();
    out->set_name(t.name);
    out->set_values(reinterpret_cast<const char*>(t.values.data()),
                    t.values.size() * sizeof(float));
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::AllReduceResponse response;
  GM_RETURN_IF_ERROR(ToAbsl(stub_->AllReduce(&context, request, &response)));
  Reduced reduced{.epoch = response.epoch(),
                  .rank = response.rank(),
                  .world_size = response.world_size(),
                  .algorithm = response.algorithm(),
                  .teams = response.teams(),
                  .seconds = response.seconds(),
                  .rounds = response.rounds(),
                  .bytes_sent = response.bytes_sent(),
                  .bytes_received = response.bytes_received()};
  for (const v1::SparseTensor& t : response.results()) {
    reduced.tensors.push_back({.name = t.name(),
                               .size = t.size(),
                               .indices = FromBytes<uint32_t>(t.indices()),
                               .values = FromBytes<float>(t.values()),
                               .residual = FromBytes<float>(t.residual())});
  }
  return reduced;
}

absl::StatusOr<v1::StatusResponse> WorkerClient::GetStatus(
    absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::StatusResponse response;
  GM_RETURN_IF_ERROR(
      ToAbsl(stub_->GetStatus(&context, v1::StatusRequest(), &response)));
  return response;
}

}  // namespace gradmesh::client

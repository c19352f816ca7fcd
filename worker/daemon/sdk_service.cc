#include "worker/daemon/sdk_service.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "common/status_macros.h"
#include "proto/plan_proto.h"

namespace gradmesh::daemon {

namespace v1 = ::gradmesh::v1;

namespace {

// Whether `a` equals `b`, in a time that does not tell where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= a[i] ^ b[i];
  return differ == 0;
}

}  // namespace

absl::Status SdkService::Admit(const grpc::ServerContext& context) const {
  if (absl::StartsWith(context.peer(), "unix:")) return absl::OkStatus();
  absl::Status refused;
  if (options_.token.empty()) {
    refused = absl::PermissionDeniedError(
        "this worker takes SDK calls over TCP only with a token: start it "
        "with --sdk_token_file, and give clients the token "
        "($GRADMESH_TOKEN), or use its unix socket (--sdk_socket)");
  } else {
    const auto& metadata = context.client_metadata();
    const auto header = metadata.find("authorization");
    const std::string expected = absl::StrCat("Bearer ", options_.token);
    if (header == metadata.end() ||
        !ConstantTimeEquals(
            absl::string_view(header->second.data(), header->second.size()),
            expected)) {
      refused = absl::UnauthenticatedError(
          "SDK calls over TCP need the worker's token ($GRADMESH_TOKEN)");
    }
  }
  if (!refused.ok() && options_.on_refused) options_.on_refused(refused);
  return refused;
}

absl::Status SdkService::AdmitStep(const grpc::ServerContext& context) const {
  GM_RETURN_IF_ERROR(Admit(context));
  return options_.before_call ? options_.before_call(/*step=*/true)
                              : absl::OkStatus();
}

absl::Time SdkService::Deadline(const grpc::ServerContext& context) const {
  const absl::Time cap = absl::Now() + options_.operation_timeout;
  const auto client = context.deadline();
  // No deadline from the client reads as a far future.
  if (client >=
      std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    return cap;
  }
  return std::min(cap, absl::FromChrono(client));
}

grpc::Status SdkService::Register(grpc::ServerContext* context,
                                  const v1::RegisterRequest* request,
                                  v1::RegisterResponse* response) {
  GM_RETURN_IF_ERROR_GRPC(Admit(*context));
  const BucketName name{request->job(), request->bucket()};
  if (options_.new_trainer && plane_->TakenOver(name, request->client_id())) {
    plane_->UnregisterOthers(name, request->client_id());
    options_.new_trainer(absl::StrCat("a new client registers bucket '",
                                      name.bucket, "' of job '", name.job,
                                      "', whose buckets another had stepped"));
  } else if (options_.before_call) {
    // A client that has stepped here registers under a new membership only
    // after being told of it, as its peers are.
    GM_RETURN_IF_ERROR_GRPC(options_.before_call(
        /*step=*/plane_->Stepped(name, request->client_id())));
  }
  std::vector<TensorSpec> tensors;
  for (const v1::TensorSpec& t : request->tensors()) {
    tensors.push_back({.name = t.name(), .size = t.size()});
  }
  absl::StatusOr<Membership> joined = plane_->Register(
      name, tensors, request->shm_name(), request->index(), Deadline(*context),
      {.per_tensor_quota = request->fusion() != v1::FUSION_AFTER_FUSION,
       .exact = request->exact(),
       .exact_tensors = request->exact_tensors()},
      {.id = request->client_id(), .locks_segment = request->segment_locked()});
  if (!joined.ok()) return ToGrpc(joined.status());
  response->set_epoch(joined->epoch);
  response->set_rank(joined->rank);
  response->set_world_size(joined->world_size);
  response->set_exact_tensors(request->exact_tensors());
  return grpc::Status::OK;
}

grpc::Status SdkService::Unregister(grpc::ServerContext* context,
                                    const v1::UnregisterRequest* request,
                                    v1::UnregisterResponse* response) {
  GM_RETURN_IF_ERROR_GRPC(Admit(*context));
  return ToGrpc(plane_->Unregister({request->job(), request->bucket()},
                                   request->shm_name()));
}

grpc::Status SdkService::AllReduce(grpc::ServerContext* context,
                                   const v1::AllReduceRequest* request,
                                   v1::AllReduceResponse* response) {
  GM_RETURN_IF_ERROR_GRPC(AdmitStep(*context));
  const ReduceCall call{
      .name = {request->job(), request->bucket()},
      .step = request->step(),
      .mean = request->op() == v1::REDUCE_MEAN,
      .sparse = request->layout() == v1::RESULT_SPARSE,
      .return_residual = request->return_residual(),
      .cancelled = [context] { return context->IsCancelled(); }};
  absl::StatusOr<ReduceResult> result =
      plane_->AllReduce(call, Deadline(*context));
  if (!result.ok()) return ToGrpc(result.status());
  response->set_nonzeros(result->nonzeros);
  response->set_epoch(result->epoch);
  response->set_rank(result->rank);
  response->set_world_size(result->world_size);
  response->set_algorithm(result->plan.algorithm);
  response->set_teams(result->plan.teams);
  response->set_seconds(result->seconds);
  response->set_wait_seconds(result->stats.wait_seconds);
  response->set_rounds(result->stats.rounds);
  response->set_bytes_sent(result->stats.bytes_sent);
  response->set_bytes_received(result->stats.bytes_received);
  response->set_tensors(result->tensors);
  response->set_tensors_missing(result->tensors_missing);
  return grpc::Status::OK;
}

grpc::Status SdkService::Broadcast(grpc::ServerContext* context,
                                   const v1::BroadcastRequest* request,
                                   v1::BroadcastResponse* response) {
  GM_RETURN_IF_ERROR_GRPC(AdmitStep(*context));
  const absl::Time start = absl::Now();
  absl::StatusOr<Membership> done = plane_->Broadcast(
      {request->job(), request->bucket()}, request->sequence(), request->root(),
      Deadline(*context));
  if (!done.ok()) return ToGrpc(done.status());
  response->set_epoch(done->epoch);
  response->set_rank(done->rank);
  response->set_world_size(done->world_size);
  response->set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  return grpc::Status::OK;
}

grpc::Status SdkService::Residual(grpc::ServerContext* context,
                                  const v1::ResidualRequest* request,
                                  v1::ResidualResponse* response) {
  GM_RETURN_IF_ERROR_GRPC(Admit(*context));
  const BucketName name{request->job(), request->bucket()};
  return ToGrpc(request->action() == v1::ResidualRequest::LOAD
                    ? plane_->LoadResidual(name, Deadline(*context))
                    : plane_->SaveResidual(name, Deadline(*context)));
}

grpc::Status SdkService::GetStatus(grpc::ServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) {
  GM_RETURN_IF_ERROR_GRPC(Admit(*context));
  // A trainer asking is back (a new one waits here to be in a view).
  if (options_.before_call) {
    GM_RETURN_IF_ERROR_GRPC(options_.before_call(/*step=*/false));
  }
  {
    absl::MutexLock lock(&mu_);
    response->set_node_id(node_id_);
  }
  response->set_rank(-1);
  std::shared_ptr<Group> group = views_->current();
  if (group != nullptr) {
    response->set_epoch(group->view.epoch);
    response->set_rank(group->rank);
    response->set_world_size(group->size());
    PlanToProto(group->view.plan, response->mutable_plan());
  }
  return grpc::Status::OK;
}

}  // namespace gradmesh::daemon

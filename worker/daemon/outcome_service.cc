#include "worker/daemon/outcome_service.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "common/status_macros.h"

namespace gradmesh::daemon {

namespace v1 = ::gradmesh::v1;

namespace {

using State = v1::OutcomeResponse::State;

State ToProto(Outcome outcome) {
  switch (outcome) {
    case Outcome::kVoting:
      return v1::OutcomeResponse::VOTING;
    case Outcome::kCommitted:
      return v1::OutcomeResponse::COMMITTED;
    case Outcome::kAborted:
      return v1::OutcomeResponse::ABORTED;
    case Outcome::kInDoubt:
      return v1::OutcomeResponse::IN_DOUBT;
  }
  return v1::OutcomeResponse::STATE_UNSPECIFIED;
}

}  // namespace

grpc::Status OutcomeService::Outcome(grpc::ServerContext* context,
                                     const v1::OutcomeRequest* request,
                                     v1::OutcomeResponse* response) {
  GM_RETURN_IF_ERROR_GRPC(admit_(*context, request->epoch()));
  if (static_cast<size_t>(request->gone_member_ids_size()) >
      StepProtocol::kMaxGone) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the question names ", request->gone_member_ids_size(),
                     " members gone; at most ", StepProtocol::kMaxGone));
  }
  for (const std::string& id : request->gone_member_ids()) {
    if (id.size() > kMaxNodeIdBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("a member id of ", id.size(),
                                       " bytes; at most ", kMaxNodeIdBytes));
    }
  }
  const std::vector<std::string> gone(request->gone_member_ids().begin(),
                                      request->gone_member_ids().end());
  response->set_state(ToProto(plane_->Decide({.bucket_id = request->bucket_id(),
                                              .step = request->step(),
                                              .epoch = request->epoch()},
                                             gone)));
  return grpc::Status::OK;
}

grpc::Status OutcomeService::Probe(grpc::ServerContext*,
                                   const v1::ProbeRequest*,
                                   v1::ProbeResponse*) {
  return grpc::Status::OK;
}

absl::StatusOr<Outcome> AskOutcome(std::shared_ptr<grpc::Channel> channel,
                                   const OutcomeKey& key,
                                   const std::vector<std::string>& gone,
                                   absl::Time deadline) {
  v1::OutcomeRequest request;
  request.set_bucket_id(key.bucket_id);
  request.set_step(key.step);
  request.set_epoch(key.epoch);
  for (const std::string& id : gone) request.add_gone_member_ids(id);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::OutcomeResponse response;
  GM_RETURN_IF_ERROR(ToAbsl(v1::Commit::NewStub(std::move(channel))
                                ->Outcome(&context, request, &response)));
  switch (response.state()) {
    case v1::OutcomeResponse::VOTING:
      return Outcome::kVoting;
    case v1::OutcomeResponse::COMMITTED:
      return Outcome::kCommitted;
    case v1::OutcomeResponse::ABORTED:
      return Outcome::kAborted;
    case v1::OutcomeResponse::IN_DOUBT:
      return Outcome::kInDoubt;
    default:
      return absl::InternalError("an outcome that names no state");
  }
}

std::vector<std::string> UnreachableMembers(
    const std::vector<std::pair<std::string, std::string>>& members,
    const std::function<std::shared_ptr<grpc::Channel>(const std::string&)>&
        channel,
    absl::Time deadline) {
  std::vector<char> reached(members.size(), 0);
  std::vector<std::thread> probes;
  for (size_t i = 0; i < members.size(); ++i) {
    probes.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      v1::ProbeResponse response;
      const grpc::StatusCode code =
          v1::Commit::NewStub(channel(members[i].second))
              ->Probe(&context, v1::ProbeRequest(), &response)
              .error_code();
      // Any answer, a refusal included, came back over the link.
      reached[i] = code != grpc::StatusCode::UNAVAILABLE &&
                   code != grpc::StatusCode::DEADLINE_EXCEEDED;
    });
  }
  for (std::thread& t : probes) t.join();
  std::vector<std::string> unreachable;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!reached[i]) unreachable.push_back(members[i].first);
  }
  return unreachable;
}

}  // namespace gradmesh::daemon

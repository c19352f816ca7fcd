#include "worker/daemon/coordinator_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "common/status_macros.h"
#include "proto/protocol_version.h"

namespace gradmesh::daemon {

namespace v1 = ::gradmesh::v1;

namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

CoordinatorClient::CoordinatorClient(
    std::unique_ptr<v1::Coordinator::Stub> stub, v1::NodeInfo node,
    absl::Duration heartbeat_interval, OnView on_view, Log log,
    Unreachable unreachable, Probe probe)
    : stub_(std::move(stub)),
      heartbeat_interval_(heartbeat_interval),
      on_view_(std::move(on_view)),
      log_(std::move(log)),
      unreachable_(std::move(unreachable)),
      probe_(std::move(probe)),
      node_(std::move(node)) {}

CoordinatorClient::~CoordinatorClient() { Stop(); }

void CoordinatorClient::Start() {
  watch_thread_ = std::thread([this] { WatchLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
}

absl::Status CoordinatorClient::Join() {
  GM_RETURN_IF_ERROR(Hello());
  v1::JoinRequest request;
  {
    absl::MutexLock lock(&mu_);
    *request.mutable_node() = node_;
    request.set_protocol(kProtocolVersion);
    if (latest_.epoch() > 0) *request.mutable_view() = latest_;
  }
  // A view that leaves this node out: it was removed, maybe for its link,
  // and the coordinator wants to know which members it cannot reach.
  const auto& members = request.view().members();
  const bool listed =
      std::any_of(members.begin(), members.end(), [&](const v1::NodeInfo& m) {
        return m.node_id() == request.node().node_id();
      });
  if (request.has_view() && !listed && probe_ != nullptr) {
    request.set_probed(true);
    for (std::string& id : probe_(request.view())) {
      request.add_unreachable(std::move(id));
    }
  }
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(5));
  v1::JoinResponse response;
  GM_RETURN_IF_ERROR(ToAbsl(stub_->Join(&context, request, &response)));
  Seen(response.view());
  return absl::OkStatus();
}

absl::Status CoordinatorClient::Hello() {
  v1::HelloRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_node_id(node_.node_id());
  }
  request.set_protocol(kProtocolVersion);
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(5));
  v1::HelloResponse response;
  const grpc::Status called = stub_->Hello(&context, request, &response);
  absl::Status status;
  if (called.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    status = CheckProtocol(0, "the coordinator", "this worker");
  } else if (called.ok()) {
    status =
        CheckProtocol(response.protocol(), "the coordinator", "this worker");
  } else {
    return ToAbsl(called);  // no answer: the last one stands
  }
  absl::MutexLock lock(&mu_);
  same_version_ = status.ok();
  return status;
}

void CoordinatorClient::Seen(const v1::View& view) {
  bool restarted = false;
  {
    absl::MutexLock lock(&mu_);
    if (!same_version_) return;  // a coordinator of another version's
    restarted = incarnation_ != 0 && view.incarnation() != incarnation_;
    incarnation_ = view.incarnation();
    // A coordinator that adopted the view answers with its own at the same
    // epoch: keep that one, so heartbeats name it (see HeartbeatRequest).
    if (view.epoch() > latest_.epoch() ||
        (view.epoch() == latest_.epoch() &&
         view.incarnation() != latest_.incarnation())) {
      latest_ = view;
    }
  }
  if (restarted) {
    log_(absl::StrCat("the coordinator restarted (incarnation ",
                      view.incarnation(), "); epoch ", view.epoch()));
  }
  on_view_(view);
}

void CoordinatorClient::WatchLoop() {
  while (true) {
    grpc::ClientContext context;
    v1::WatchRequest request;
    bool follow;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      follow = same_version_;
      watch_context_ = &context;
      request.set_after_epoch(latest_.epoch());
      request.set_node_id(node_.node_id());
    }
    // Views only from a coordinator that said it speaks this version.
    if (follow) {
      auto reader = stub_->WatchViews(&context, request);
      v1::View view;
      while (reader->Read(&view)) Seen(view);
      reader->Finish();
    }
    {
      absl::MutexLock lock(&mu_);
      watch_context_ = nullptr;
    }
    // Retry after a pause (the coordinator restarts, or is not up yet).
    watch_wake_.WaitFor(absl::Milliseconds(300));
  }
}

void CoordinatorClient::HeartbeatLoop() {
  std::string last_problem;
  while (true) {
    absl::Status status;
    {
      absl::MutexLock calling(&call_mu_);
      bool joined, out;
      std::string node_id;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        joined = joined_;
        out = stepped_out_;
        node_id = node_.node_id();
      }
      if (out) {
        // Out of the group until Rejoin.
      } else if (!joined) {
        status = Join();
        absl::MutexLock lock(&mu_);
        joined_ = status.ok();
      } else {
        grpc::ClientContext context;
        SetDeadline(&context, absl::Seconds(2));
        v1::HeartbeatRequest request;
        request.set_node_id(node_id);
        {
          absl::MutexLock lock(&mu_);
          request.set_epoch(latest_.epoch());
          request.set_incarnation(latest_.incarnation());
        }
        for (std::string& peer : unreachable_()) {
          request.add_unreachable(std::move(peer));
        }
        v1::HeartbeatResponse response;
        status = ToAbsl(stub_->Heartbeat(&context, request, &response));
        // NotFound: the coordinator dropped us (a missed heartbeat, or it
        // restarted); join again.
        absl::MutexLock lock(&mu_);
        joined_ = !absl::IsNotFound(status);
      }
    }
    const std::string problem = status.ok() ? "" : status.ToString();
    if (problem != last_problem) {
      log_(problem.empty() ? "coordinator reachable"
                           : absl::StrCat("coordinator: ", problem));
      last_problem = problem;
    }
    FlushReports();
    // Woken early by a report, Rejoin or Stop.
    heartbeat_wake_.WaitFor(heartbeat_interval_);
  }
}

void CoordinatorClient::StepOut() {
  absl::MutexLock calling(&call_mu_);
  {
    absl::MutexLock lock(&mu_);
    stepped_out_ = true;
  }
  Leave();
}

void CoordinatorClient::Rejoin(uint64_t incarnation) {
  absl::MutexLock calling(&call_mu_);  // after a call in flight, not lost
  {
    absl::MutexLock lock(&mu_);
    node_.set_incarnation(incarnation);
    stepped_out_ = false;
    joined_ = false;  // the next round joins, with the new incarnation
  }
  heartbeat_wake_.Notify();
}

void CoordinatorClient::Leave() {
  v1::LeaveRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (!joined_) return;
    joined_ = false;
    request.set_node_id(node_.node_id());
  }
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(1));
  v1::LeaveResponse response;
  stub_->Leave(&context, request, &response);
}

void CoordinatorClient::Report(v1::IterationStats report, bool flush) {
  {
    absl::MutexLock lock(&mu_);
    reports_.push_back(std::move(report));
  }
  if (flush) {
    FlushReports();
  } else {
    heartbeat_wake_.Notify();
  }
}

void CoordinatorClient::FlushReports() {
  absl::MutexLock flush_lock(&flush_mu_);
  v1::ReportStatsRequest request;
  {
    absl::MutexLock lock(&mu_);
    for (v1::IterationStats& r : reports_) {
      *request.add_iterations() = std::move(r);
    }
    reports_.clear();
  }
  if (request.iterations().empty()) return;
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(2));
  v1::ReportStatsResponse response;
  // Best effort: a lost report only slows autotune down.
  stub_->ReportStats(&context, request, &response);
}

void CoordinatorClient::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  watch_wake_.Notify();
  heartbeat_wake_.Notify();
  {
    absl::MutexLock calling(&call_mu_);
    Leave();
  }
  if (watch_thread_.joinable()) watch_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

}  // namespace gradmesh::daemon

#include "server/service.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/cli.h"
#include "common/grpc/health_server.h"
#include "common/metrics/metrics_endpoint.h"
#include "common/status_macros.h"
#include "common/steady_clock.h"
#include "gradmesh/v1/coordinator.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "proto/plan_proto.h"
#include "proto/protocol_version.h"

namespace gradmesh::server {
namespace {

namespace v1 = ::gradmesh::v1;

v1::View ToProto(const View& view) {
  v1::View out;
  out.set_incarnation(view.incarnation);
  out.set_epoch(view.epoch);
  out.set_start_step(view.start_step);
  out.set_membership_epoch(view.membership_epoch);
  for (const MemberInfo& m : view.members) {
    v1::NodeInfo* node = out.add_members();
    node->set_node_id(m.node_id);
    node->set_address(m.address);
    node->set_host(m.host);
    node->set_gpus(m.gpus);
    node->set_gpu_name(m.gpu_name);
    node->set_incarnation(m.incarnation);
  }
  PlanToProto(view.plan, out.mutable_plan());
  for (const LinkReports::Quarantine& q : view.kept_out) {
    v1::KeptOut* kept = out.add_kept_out();
    kept->set_node_id(q.node_id);
    kept->set_quarantine_seconds(absl::ToDoubleSeconds(q.length));
    kept->set_strikes(q.strikes);
  }
  return out;
}

View FromProto(const v1::View& view) {
  View out{.epoch = view.epoch(),
           .start_step = view.start_step(),
           .membership_epoch = view.membership_epoch()};
  for (const v1::NodeInfo& m : view.members()) {
    out.members.push_back({.node_id = m.node_id(),
                           .address = m.address(),
                           .host = m.host(),
                           .gpus = m.gpus(),
                           .gpu_name = m.gpu_name(),
                           .incarnation = m.incarnation()});
  }
  out.plan = PlanFromProto(view.plan());
  out.incarnation = view.incarnation();
  for (const v1::KeptOut& kept : view.kept_out()) {
    // A length that is not a finite number of seconds counts as none
    // (LinkReports::Adopt: on probation only); Adopt also bounds it.
    const double seconds = std::isfinite(kept.quarantine_seconds())
                               ? kept.quarantine_seconds()
                               : 0.0;
    out.kept_out.push_back({.node_id = kept.node_id(),
                            .length = absl::Seconds(seconds),
                            .strikes = kept.strikes()});
  }
  return out;
}

// What a Join says of the members it could not reach (nullopt: it did not
// call them).
std::optional<std::vector<std::string>> Probed(const v1::JoinRequest& request) {
  if (!request.probed()) return std::nullopt;
  return std::vector<std::string>(request.unreachable().begin(),
                                  request.unreachable().end());
}

void Log(const std::string& message) {
  LogLine("gradmesh-coordinator", "", message);
}

// The gauges, refreshed from the state machine at every scrape.
class Metrics {
 public:
  explicit Metrics(const Coordinator* coordinator)
      : coordinator_(coordinator),
        registry_(std::make_shared<prometheus::Registry>()) {
    auto gauge = [&](const char* name, const char* help) {
      return &prometheus::BuildGauge().Name(name).Help(help).Register(
          *registry_);
    };
    members_ =
        &gauge("gradmesh_coordinator_members", "Members of the view")->Add({});
    epoch_ = &gauge("gradmesh_coordinator_epoch", "Current epoch")->Add({});
    teams_ =
        &gauge("gradmesh_coordinator_teams", "SparDL's d in the plan")->Add({});
    autotuning_ = &gauge("gradmesh_coordinator_autotuning",
                         "1 while an autotune trial runs")
                       ->Add({});
    plan_info_ = gauge("gradmesh_coordinator_plan_info",
                       "The plan's algorithm and encodings (value 1)");
    trial_seconds_ = gauge("gradmesh_coordinator_autotune_trial_seconds",
                           "Mean iteration time of each tried d (d=\"dense\": "
                           "the dense ring, with --algo=auto)");
    size_seconds_ = gauge("gradmesh_coordinator_autotune_size_seconds",
                          "Mean all-reduce time of each tried d per bucket "
                          "size (values)");
    modeled_seconds_ = gauge("gradmesh_coordinator_autotune_modeled_seconds",
                             "Alpha-beta model's time of each candidate d");
    dense_sizes_ = gauge("gradmesh_coordinator_plan_dense_sizes",
                         "Bucket sizes (values) the plan sums with the dense "
                         "ring, as --algo=auto chose (value 1)");
    iteration_seconds_ = gauge("gradmesh_coordinator_iteration_seconds",
                               "Latest all-reduce time reported, per node");
    alpha_ = &gauge("gradmesh_coordinator_link_alpha_seconds",
                    "Link latency per round (fitted or configured)")
                  ->Add({});
    beta_ = &gauge("gradmesh_coordinator_link_beta_seconds_per_byte",
                   "Link time per byte (fitted or configured)")
                 ->Add({});
    departures_ = &prometheus::BuildCounter()
                       .Name("gradmesh_coordinator_member_departures_total")
                       .Help(
                           "Times each node left the view (left, expired or "
                           "replaced by a new process)")
                       .Register(*registry_);
    link_removals_ =
        &prometheus::BuildCounter()
             .Name("gradmesh_coordinator_link_removals_total")
             .Help(
                 "Times each node was removed because other members could "
                 "not reach it (a link dropping its packets)")
             .Register(*registry_);
    refused_ = &prometheus::BuildCounter()
                    .Name("gradmesh_coordinator_calls_refused_total")
                    .Help(
                        "Calls whose certificate does not name the host of "
                        "the member they speak for")
                    .Register(*registry_)
                    .Add({});
  }

  // Serves /metrics on `listen` (empty: not served).
  absl::Status Serve(const std::string& listen) {
    if (listen.empty()) return absl::OkStatus();
    GM_ASSIGN_OR_RETURN(
        endpoint_,
        MetricsEndpoint::Start(listen, registry_, [this] { Refresh(); }));
    return absl::OkStatus();
  }

  int port() const { return endpoint_ == nullptr ? 0 : endpoint_->port(); }

  void CountRefused() { refused_->Increment(); }
  void CountDepartures(const std::string& node, int departures) {
    departures_->Add({{"node", node}}).Increment(departures);
  }
  void CountLinkRemovals(const std::string& node, int removals) {
    link_removals_->Add({{"node", node}}).Increment(removals);
  }

  // Scrapes may come at once: one refresh at a time keeps the series it
  // removes straight.
  void Refresh() {
    absl::MutexLock lock(&refresh_mu_);
    const Coordinator& coordinator = *coordinator_;
    const View view = coordinator.view();
    members_->Set(static_cast<double>(view.members.size()));
    epoch_->Set(static_cast<double>(view.epoch));
    teams_->Set(view.plan.teams);
    autotuning_->Set(view.plan.autotuning ? 1 : 0);
    prometheus::Gauge* info =
        &plan_info_->Add({{"algorithm", view.plan.algorithm},
                          {"encoding", view.plan.encoding},
                          {"values", view.plan.values}});
    if (plan_info_now_ != nullptr && plan_info_now_ != info) {
      plan_info_->Remove(plan_info_now_);  // the plan it named is gone
    }
    plan_info_now_ = info;
    info->Set(1);
    // By difference, so that a scrape between two refreshes never misses
    // a size that stays.
    for (auto it = dense_sizes_now_.begin(); it != dense_sizes_now_.end();) {
      if (std::binary_search(view.plan.dense_sizes.begin(),
                             view.plan.dense_sizes.end(), it->first)) {
        ++it;
      } else {
        dense_sizes_->Remove(it->second);
        it = dense_sizes_now_.erase(it);
      }
    }
    for (uint64_t n : view.plan.dense_sizes) {
      if (dense_sizes_now_.contains(n)) continue;
      prometheus::Gauge* gauge =
          &dense_sizes_->Add({{"values", absl::StrCat(n)}});
      gauge->Set(1);
      dense_sizes_now_[n] = gauge;
    }
    for (const Trial& trial : coordinator.trials()) {
      const std::string d =
          trial.algorithm == kDense ? trial.Name() : absl::StrCat(trial.teams);
      modeled_seconds_->Add({{"d", d}}).Set(trial.modeled_seconds);
      if (trial.iterations > 0) {
        trial_seconds_->Add({{"d", d}}).Set(trial.mean_seconds);
      }
      for (const auto& [n, seconds] : trial.size_seconds) {
        size_seconds_->Add({{"d", d}, {"values", absl::StrCat(n)}})
            .Set(seconds);
      }
    }
    for (const auto& [node, seconds] : coordinator.last_iteration_seconds()) {
      iteration_seconds_->Add({{"node", node}}).Set(seconds);
    }
    const LinkModel link = coordinator.link();
    alpha_->Set(link.alpha_s);
    beta_->Set(link.beta_s_per_byte);
  }

 private:
  const Coordinator* const coordinator_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* departures_;
  prometheus::Family<prometheus::Counter>* link_removals_;
  prometheus::Gauge* members_;
  prometheus::Gauge* epoch_;
  prometheus::Gauge* teams_;
  prometheus::Gauge* autotuning_;
  prometheus::Family<prometheus::Gauge>* plan_info_;
  absl::Mutex refresh_mu_;
  prometheus::Gauge* plan_info_now_ ABSL_GUARDED_BY(refresh_mu_) = nullptr;
  prometheus::Family<prometheus::Gauge>* dense_sizes_;
  std::map<uint64_t, prometheus::Gauge*> dense_sizes_now_
      ABSL_GUARDED_BY(refresh_mu_);
  prometheus::Family<prometheus::Gauge>* size_seconds_;
  prometheus::Family<prometheus::Gauge>* trial_seconds_;
  prometheus::Family<prometheus::Gauge>* modeled_seconds_;
  prometheus::Family<prometheus::Gauge>* iteration_seconds_;
  prometheus::Gauge* alpha_;
  prometheus::Gauge* beta_;
  prometheus::Counter* refused_;
  // Last, so destroyed first: a scrape's refresh in progress, which the
  // endpoint's destruction waits for, finds every other member alive.
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

class Server final : public CoordinatorServer, public v1::Coordinator::Service {
 public:
  explicit Server(const ServerOptions& options)
      : options_(options),
        coordinator_(options.plan, options.heartbeat_timeout,
                     options.quarantine),
        metrics_(&coordinator_) {}
  ~Server() override { Stop(); }

  absl::Status Init() {
    GM_RETURN_IF_ERROR(ValidatePlanConfig(options_.plan));
    if (options_.heartbeat_timeout <= absl::ZeroDuration() ||
        options_.quarantine <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          "the heartbeat timeout and the quarantine must be positive");
    }
    GM_ASSIGN_OR_RETURN(auto credentials, ServerCredentials(options_.tls));
    GM_RETURN_IF_ERROR(metrics_.Serve(options_.metrics_listen));
    grpc::ServerBuilder builder;
    ApplyServerKeepalive(builder);
    int port = 0;
    builder.AddListeningPort(options_.listen, credentials, &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options_.listen));
    }
    if (!options_.health_listen.empty()) {
      GM_ASSIGN_OR_RETURN(health_, HealthServer::Start(options_.health_listen));
      health_->SetReady(true);
    }
    address_ = absl::StrCat(
        options_.listen.substr(0, options_.listen.rfind(':')), ":", port);
    ticker_ = std::thread([this] { Tick(); });
    Log(absl::StrCat(
        "serving on ", address_,
        options_.tls.enabled() ? " (mutual TLS)" : " (plaintext)",
        metrics_.port() > 0
            ? absl::StrCat(", /metrics on port ", metrics_.port())
            : "",
        health_ != nullptr
            ? absl::StrCat(", health checks on port ", health_->port())
            : ""));
    return absl::OkStatus();
  }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || server_ == nullptr) return;
      stopping_ = true;
    }
    tick_.Notify();
    if (ticker_.joinable()) ticker_.join();
    if (health_ != nullptr) health_->Stop();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    Log("stopped");
  }

  std::string address() const override { return address_; }
  int metrics_port() const override { return metrics_.port(); }
  int health_port() const override {
    return health_ == nullptr ? 0 : health_->port();
  }

  grpc::Status Hello(grpc::ServerContext*, const v1::HelloRequest* request,
                     v1::HelloResponse* response) override {
    // The worker decides; a mismatch is counted and logged here too.
    VersionRefused(CheckProtocol(request->protocol(),
                                 absl::StrCat("worker ", request->node_id()),
                                 "the coordinator"))
        .IgnoreError();
    response->set_protocol(kProtocolVersion);
    return grpc::Status::OK;
  }

  grpc::Status Join(grpc::ServerContext* context,
                    const v1::JoinRequest* request,
                    v1::JoinResponse* response) override {
    const v1::NodeInfo& node = request->node();
    // Its certificate names the host it joins with and, for a node id of a
    // member, that member's host (no one takes another's id).
    if (!node.address().empty()) {
      GM_RETURN_IF_ERROR_GRPC(Refused(CheckCaller(
          *context, {node.address()}, "the address it joins with")));
    }
    GM_RETURN_IF_ERROR_GRPC(CheckSpeaksFor(*context, node.node_id()));
    GM_RETURN_IF_ERROR_GRPC(VersionRefused(CheckProtocol(
        request->protocol(), absl::StrCat("worker ", node.node_id()),
        "the coordinator")));
    const std::optional<View> known =
        request->has_view() ? std::optional(FromProto(request->view()))
                            : std::nullopt;
    auto view =
        coordinator_.Join({.node_id = node.node_id(),
                           .address = node.address(),
                           .host = node.host(),
                           .gpus = node.gpus(),
                           .gpu_name = node.gpu_name(),
                           .incarnation = node.incarnation()},
                          Heard(), known ? &*known : nullptr, Probed(*request));
    if (!view.ok()) return ToGrpc(view.status());
    *response->mutable_view() = ToProto(*view);
    Log(absl::StrCat(node.node_id(), " joined",
                     known ? absl::StrCat(" knowing epoch ", known->epoch) : "",
                     ": epoch ", view->epoch, ", ", view->members.size(),
                     " members"));
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    GM_RETURN_IF_ERROR_GRPC(CheckSpeaksFor(*context, request->node_id()));
    GM_RETURN_IF_ERROR_GRPC(coordinator_.Heartbeat(
        request->node_id(), Heard(),
        {request->unreachable().begin(), request->unreachable().end()},
        request->epoch(), request->incarnation()));
    response->set_epoch(coordinator_.view().epoch);
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* context,
                     const v1::LeaveRequest* request,
                     v1::LeaveResponse*) override {
    GM_RETURN_IF_ERROR_GRPC(CheckSpeaksFor(*context, request->node_id()));
    GM_RETURN_IF_ERROR_GRPC(coordinator_.Leave(request->node_id()));
    Log(absl::StrCat(request->node_id(), " left: epoch ",
                     coordinator_.view().epoch));
    return grpc::Status::OK;
  }

  grpc::Status WatchViews(grpc::ServerContext* context,
                          const v1::WatchRequest* request,
                          grpc::ServerWriter<v1::View>* writer) override {
    uint64_t after = request->after_epoch();
    while (!context->IsCancelled()) {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) break;
      }
      const View view = coordinator_.WaitForView(
          after, absl::Now() + absl::Milliseconds(200));
      if (view.epoch <= after) continue;
      if (!writer->Write(ToProto(view))) break;
      after = view.epoch;
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportStats(grpc::ServerContext* context,
                           const v1::ReportStatsRequest* request,
                           v1::ReportStatsResponse*) override {
    for (const v1::IterationStats& s : request->iterations()) {
      GM_RETURN_IF_ERROR_GRPC(CheckSpeaksFor(*context, s.node_id()));
      const uint64_t before = coordinator_.view().epoch;
      GM_RETURN_IF_ERROR_GRPC(
          coordinator_.Report({.node_id = s.node_id(),
                               .epoch = s.epoch(),
                               .operation = s.step(),
                               .seconds = s.seconds(),
                               .period_seconds = s.period_seconds(),
                               .rounds = s.rounds(),
                               .bytes_sent = s.bytes_sent(),
                               .bytes_received = s.bytes_received(),
                               .values = s.values()}));
      const View view = coordinator_.view();
      if (view.epoch != before) {
        Log(absl::StrCat("epoch ", view.epoch, " from step ", view.start_step,
                         ": ", view.plan.algorithm, " d=", view.plan.teams,
                         " (", view.plan.note, ")"));
      }
    }
    return grpc::Status::OK;
  }

 private:
  // OK when the caller may speak for member `node_id`: on TLS, its
  // certificate names that member's host. Ids of no member pass (the state
  // machine answers them).
  absl::Status CheckSpeaksFor(const grpc::ServerContext& context,
                              const std::string& node_id) {
    for (const MemberInfo& m : coordinator_.view().members) {
      if (m.node_id == node_id) {
        return Refused(CheckCaller(context, {m.address},
                                   absl::StrCat("member ", node_id)));
      }
    }
    return absl::OkStatus();
  }
  // Logs and counts a refusal.
  // Refused's count, but one log line every 10 s at most: a worker of
  // another version asks again at every heartbeat interval.
  absl::Status VersionRefused(absl::Status status) {
    if (status.ok()) return status;
    metrics_.CountRefused();
    {
      absl::MutexLock lock(&mu_);
      if (SteadyNow() - last_version_log_ < absl::Seconds(10)) return status;
      last_version_log_ = SteadyNow();
    }
    Log(absl::StrCat("refused a call: ", status.message()));
    return status;
  }

  absl::Status Refused(absl::Status status) {
    if (!status.ok()) {
      metrics_.CountRefused();
      Log(absl::StrCat("refused a call: ", status.message()));
    }
    return status;
  }

  // Counts the members of `last` that `view` lacks (a new incarnation of a
  // node counts as its departure too).
  void CountDepartures(const View& last, const View& view) {
    for (const MemberInfo& gone : last.members) {
      const bool stayed = std::any_of(
          view.members.begin(), view.members.end(), [&](const MemberInfo& m) {
            return m.node_id == gone.node_id &&
                   m.incarnation == gone.incarnation;
          });
      if (!stayed) metrics_.CountDepartures(gone.node_id, 1);
    }
  }

  // Expires silent members, on the steady clock; counts departures.
  void Tick() {
    uint64_t epoch = 0;
    while (true) {
      tick_.WaitFor(kTickInterval);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      ExcuseAPause();
      if (std::optional<Coordinator::LinkRemoval> removed =
              coordinator_.Tick(SteadyNow())) {
        Log(absl::StrFormat(
            "removed %s: %s could not reach it; kept out for %.0f s",
            removed->node_id, absl::StrJoin(removed->reporters, ", "),
            absl::ToDoubleSeconds(removed->kept_out)));
        metrics_.CountLinkRemovals(removed->node_id, 1);
      }
      View view = coordinator_.view();
      if (view.epoch != epoch) {
        // Every member's series exists from its arrival, at 0, so that
        // increase() sees its first departure.
        for (const MemberInfo& m : view.members) {
          metrics_.CountDepartures(m.node_id, 0);
          metrics_.CountLinkRemovals(m.node_id, 0);
        }
      }
      if (view.epoch != epoch && epoch != 0) {
        CountDepartures(last_view_, view);
        if (view.members.size() != last_view_.members.size()) {
          Log(absl::StrCat("epoch ", view.epoch, ": ", view.members.size(),
                           " members"));
        }
      }
      epoch = view.epoch;
      last_view_ = std::move(view);
    }
  }

  // The steady time of a Join or Heartbeat being handled now; notes the
  // gap since this process last ran a tick or a handler.
  absl::Time Heard() {
    absl::MutexLock lock(&mu_);  // read under it: never before a tick
    return AwakeLocked();
  }

  // Now, and the longest gap since the last tick during which this process
  // ran no tick and no handler, for `now`.
  absl::Time AwakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = SteadyNow();
    longest_gap_ = std::max(longest_gap_, now - last_awake_);
    last_awake_ = now;
    return now;
  }

  // A long gap (more than 1 s, or half the timeout where that is shorter)
  // in which this process ran neither a tick nor a handler: it was paused
  // or starved, and heartbeats could not be heard, so that silence counts
  // against no member. A tick late while calls are handled all along
  // excuses nothing.
  void ExcuseAPause() {
    absl::Duration gap;
    absl::Time now;
    {
      absl::MutexLock lock(&mu_);
      now = AwakeLocked();
      gap = std::exchange(longest_gap_, absl::ZeroDuration());
    }
    if (gap < std::min(kPauseGap, options_.heartbeat_timeout / 2)) return;
    coordinator_.Excuse(gap - kTickInterval, now);
    Log(absl::StrCat("did not run for ", absl::FormatDuration(gap),
                     "; that silence counts against no member"));
  }

  static constexpr absl::Duration kTickInterval = absl::Milliseconds(100);
  static constexpr absl::Duration kPauseGap = absl::Seconds(1);

  const ServerOptions options_;
  Coordinator coordinator_;
  Metrics metrics_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthServer> health_;
  std::string address_;
  std::thread ticker_;
  Wakeup tick_;     // the ticker's wait: Stop wakes it
  View last_view_;  // the ticker's
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // When this process last ran a tick or a handler, and the longest gap
  // between such runs since the last tick.
  absl::Time last_awake_ ABSL_GUARDED_BY(mu_) = SteadyNow();
  absl::Duration longest_gap_ ABSL_GUARDED_BY(mu_);
  absl::Time last_version_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const ServerOptions& options) {
  auto server = std::make_unique<Server>(options);
  GM_RETURN_IF_ERROR(server->Init());
  return server;
}

}  // namespace gradmesh::server

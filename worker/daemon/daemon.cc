#include "worker/daemon/daemon.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/cli.h"
#include "common/status_macros.h"
#include "gradmesh/v1/coordinator.grpc.pb.h"
#include "gradmesh/v1/worker.grpc.pb.h"
#include "worker/daemon/worker_metrics.h"
#include "worker/engine/engine.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/grpc/peer_service.h"
#include "worker/transport/loopback.h"
#ifdef GRADMESH_HAS_CUDA
#include "worker/kernels/cuda_device.h"
#endif

namespace gradmesh::daemon {
namespace {

namespace v1 = ::gradmesh::v1;

// A view and what this worker runs it with.
struct Group {
  v1::View view;
  std::vector<std::string> member_ids;
  int rank = -1;            // -1: not a member
  absl::Status plan_error;  // the plan can't run here
  std::unique_ptr<transport::GrpcTransport> transport;  // members only
  engine::EngineOptions options;
};

std::vector<std::string> MemberIds(const v1::View& view) {
  std::vector<std::string> ids;
  for (const v1::NodeInfo& m : view.members()) ids.push_back(m.node_id());
  return ids;
}

// "host:port" -> (host, port); port 0 when absent or not a number.
std::pair<std::string, int> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return {address, 0};
  }
  return {address.substr(0, colon), port};
}

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

class Daemon final : public WorkerDaemon, public v1::Worker::Service {
 public:
  explicit Daemon(const DaemonOptions& options) : options_(options) {}
  ~Daemon() override {
    Stop();
    // Scrapes read the engine, which goes before metrics_ does.
    if (metrics_ != nullptr) metrics_->StopServing();
  }

  absl::Status Init();
  void Stop() override;
  std::string address() const override { return advertise_; }
  int metrics_port() const override { return metrics_->port(); }

  grpc::Status AllReduce(grpc::ServerContext* context,
                         const v1::AllReduceRequest* request,
                         v1::AllReduceResponse* response) override {
    return ToGrpc(RunRequest(*request, response));
  }
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::StatusRequest* request,
                         v1::StatusResponse* response) override;

 private:
  void Log(const std::string& message) const;
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  absl::Status Join();
  void WatchLoop();
  void HeartbeatLoop();
  void FlushReports();
  void InstallView(const v1::View& view);
  std::shared_ptr<Group> MakeGroup(const v1::View& view);
  absl::Status RunRequest(const v1::AllReduceRequest& request,
                          v1::AllReduceResponse* response);
  void RecordSuccess(const Group& group, const collectives::OpStats& stats,
                     double seconds, const transport::Counters& before);
  void RecordDrops();
  void RefreshResidualNorms();

  const DaemonOptions options_;
  std::string advertise_;
  std::string node_id_;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;
  std::unique_ptr<WorkerMetrics> metrics_;
  transport::PeerService peers_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::thread watch_thread_;
  std::thread heartbeat_thread_;

  absl::Mutex channels_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(channels_mu_);

  // Views, the operation in flight, and the control threads' state.
  mutable absl::Mutex state_mu_;
  bool stopping_ ABSL_GUARDED_BY(state_mu_) = false;
  bool joined_ ABSL_GUARDED_BY(state_mu_) = false;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(state_mu_) = nullptr;
  uint64_t latest_epoch_ ABSL_GUARDED_BY(state_mu_) = 0;
  std::shared_ptr<Group> current_ ABSL_GUARDED_BY(state_mu_);
  std::shared_ptr<Group> pending_ ABSL_GUARDED_BY(state_mu_);
  std::shared_ptr<Group> running_ ABSL_GUARDED_BY(state_mu_);
  uint64_t running_step_ ABSL_GUARDED_BY(state_mu_) = 0;
  bool has_last_step_ ABSL_GUARDED_BY(state_mu_) = false;
  uint64_t last_step_ ABSL_GUARDED_BY(state_mu_) = 0;
  std::deque<v1::IterationStats> reports_ ABSL_GUARDED_BY(state_mu_);
  transport::PeerService::Stats drops_seen_ ABSL_GUARDED_BY(state_mu_);

  // One request at a time runs the engine.
  absl::Mutex op_mu_ ABSL_ACQUIRED_BEFORE(state_mu_);
  transport::LoopbackNetwork alone_{1};  // the engine's group before a view
  std::unique_ptr<engine::Engine> engine_ ABSL_GUARDED_BY(op_mu_);
  std::shared_ptr<Group> engine_group_ ABSL_GUARDED_BY(op_mu_);
};

absl::Status Daemon::Init() {
  if (options_.coordinator.empty()) {
    return absl::InvalidArgumentError("the coordinator address is required");
  }
  if (options_.operation_timeout <= absl::ZeroDuration() ||
      options_.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "the operation timeout and heartbeat interval must be positive");
  }
  GM_ASSIGN_OR_RETURN(channel_credentials_, ChannelCredentials(options_.tls));
  GM_ASSIGN_OR_RETURN(auto server_credentials, ServerCredentials(options_.tls));
  GM_ASSIGN_OR_RETURN(
      metrics_, WorkerMetrics::Create(options_.metrics_listen,
                                      [this] { RefreshResidualNorms(); }));
  GM_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(alone_.endpoint(0), {}));

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, server_credentials, &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.RegisterCallbackGenericService(&peers_);
  builder.RegisterService(static_cast<v1::Worker::Service*>(this));
  grpc::EnableDefaultHealthCheckService(true);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.listen));
  }
  advertise_ = options_.advertise;
  if (advertise_.empty()) {
    advertise_ = absl::StrCat(SplitHostPort(options_.listen).first, ":", port);
  }
  node_id_ = options_.node_id.empty() ? advertise_ : options_.node_id;
  coordinator_ = v1::Coordinator::NewStub(Channel(options_.coordinator));
  Log(absl::StrCat("serving on ", advertise_, ", coordinator ",
                   options_.coordinator,
                   options_.tls.enabled() ? ", mutual TLS" : ", plaintext",
                   metrics_->port() > 0
                       ? absl::StrCat(", /metrics on port ", metrics_->port())
                       : ""));
  watch_thread_ = std::thread([this] { WatchLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void Daemon::Log(const std::string& message) const {
  std::string where;
  {
    absl::MutexLock lock(&state_mu_);
    where = current_ == nullptr ? "epoch=- rank=-"
                                : absl::StrCat("epoch=", current_->view.epoch(),
                                               " rank=", current_->rank);
  }
  LogLine("gradmesh-worker",
          absl::StrCat("node=", node_id_.empty() ? options_.listen : node_id_,
                       " ", where),
          message);
}

std::shared_ptr<grpc::Channel> Daemon::Channel(const std::string& address) {
  absl::MutexLock lock(&channels_mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = grpc::CreateCustomChannel(address, channel_credentials_,
                                        DefaultChannelArguments());
  }
  return channel;
}

absl::Status Daemon::Join() {
  v1::JoinRequest request;
  v1::NodeInfo* node = request.mutable_node();
  node->set_node_id(node_id_);
  node->set_address(advertise_);
  node->set_host(HostName());
#ifdef GRADMESH_HAS_CUDA
  node->set_gpus(kernels::CudaDeviceCount());
  if (node->gpus() > 0) node->set_gpu_name(kernels::CudaDeviceDescription());
#endif
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::JoinResponse response;
  GM_RETURN_IF_ERROR(ToAbsl(coordinator_->Join(&context, request, &response)));
  InstallView(response.view());
  return absl::OkStatus();
}

void Daemon::WatchLoop() {
  while (true) {
    grpc::ClientContext context;
    v1::WatchRequest request;
    {
      absl::MutexLock lock(&state_mu_);
      if (stopping_) return;
      watch_context_ = &context;
      request.set_after_epoch(latest_epoch_);
    }
    request.set_node_id(node_id_);
    auto reader = coordinator_->WatchViews(&context, request);
    v1::View view;
    while (reader->Read(&view)) InstallView(view);
    reader->Finish();
    absl::MutexLock lock(&state_mu_);
    watch_context_ = nullptr;
    // Retry after a pause (the coordinator restarts, or is not up yet).
    state_mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                               absl::Milliseconds(300));
  }
}

void Daemon::HeartbeatLoop() {
  std::string last_problem;
  while (true) {
    bool joined;
    {
      absl::MutexLock lock(&state_mu_);
      if (stopping_) return;
      joined = joined_;
    }
    absl::Status status;
    if (!joined) {
      status = Join();
      if (status.ok()) {
        absl::MutexLock lock(&state_mu_);
        joined_ = true;
      }
    } else {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      v1::HeartbeatRequest request;
      request.set_node_id(node_id_);
      v1::HeartbeatResponse response;
      status = ToAbsl(coordinator_->Heartbeat(&context, request, &response));
      if (absl::IsNotFound(status)) {
        // The coordinator dropped us (a missed heartbeat, or it restarted).
        absl::MutexLock lock(&state_mu_);
        joined_ = false;
      }
    }
    const std::string problem = status.ok() ? "" : status.ToString();
    if (problem != last_problem) {
      Log(problem.empty() ? "coordinator reachable"
                          : absl::StrCat("coordinator: ", problem));
      last_problem = problem;
    }
    FlushReports();
    absl::MutexLock lock(&state_mu_);
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
      return stopping_ || !reports_.empty();
    };
    state_mu_.AwaitWithTimeout(absl::Condition(&wake),
                               options_.heartbeat_interval);
  }
}

void Daemon::FlushReports() {
  v1::ReportStatsRequest request;
  {
    absl::MutexLock lock(&state_mu_);
    for (v1::IterationStats& r : reports_) {
      *request.add_iterations() = std::move(r);
    }
    reports_.clear();
  }
  if (request.iterations().empty()) return;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::ReportStatsResponse response;
  // Statistics are best effort: a lost report only slows autotune down.
  coordinator_->ReportStats(&context, request, &response);
}

std::shared_ptr<Group> Daemon::MakeGroup(const v1::View& view) {
  auto group = std::make_shared<Group>();
  group->view = view;
  group->member_ids = MemberIds(view);
  for (int r = 0; r < view.members_size(); ++r) {
    if (view.members(r).node_id() == node_id_) group->rank = r;
  }
  if (group->rank < 0) return group;
  const v1::Plan& plan = view.plan();
  auto wire = collectives::WireFormat::Parse(plan.encoding(), plan.values());
  if (!wire.ok()) {
    group->plan_error = wire.status();
    return group;
  }
  group->options = {.algorithm = {.algorithm = plan.algorithm(),
                                  .density = plan.density(),
                                  .teams = plan.teams(),
                                  .wire = *wire},
                    .timeout = options_.operation_timeout,
                    .epoch = view.epoch()};
  std::vector<std::string> addresses;
  for (const v1::NodeInfo& m : view.members()) addresses.push_back(m.address());
  auto transport = transport::GrpcTransport::Create(
      {.service = &peers_,
       .epoch = view.epoch(),
       .rank = group->rank,
       .peers = std::move(addresses),
       .channels = [this](const std::string& a) { return Channel(a); },
       .chunk_bytes = plan.chunk_bytes() == 0 ? transport::kDefaultChunkBytes
                                              : plan.chunk_bytes()});
  if (!transport.ok()) {
    group->plan_error = transport.status();
    return group;
  }
  group->transport = *std::move(transport);
  return group;
}

void Daemon::InstallView(const v1::View& view) {
  std::shared_ptr<Group> group = MakeGroup(view);
  std::shared_ptr<Group> to_abort;
  std::string what;
  {
    absl::MutexLock lock(&state_mu_);
    if (view.epoch() <= latest_epoch_) return;
    latest_epoch_ = view.epoch();
    const bool same_members =
        current_ != nullptr && current_->member_ids == group->member_ids;
    const bool late =
        same_members && has_last_step_ && view.start_step() <= last_step_;
    if (same_members && !late) {
      pending_ = group;  // from its start step
      what = absl::StrCat("plan of epoch ", view.epoch(), " from step ",
                          view.start_step());
    } else {
      current_ = group;
      pending_.reset();
      if (running_ != nullptr && running_ != group &&
          running_->transport != nullptr) {
        to_abort = running_;
      }
      if (late) metrics_->late_views().Increment();
      what = absl::StrCat(late ? "late plan" : "membership", " of epoch ",
                          view.epoch(), ", applied at once");
    }
    metrics_->epoch().Set(static_cast<double>(view.epoch()));
  }
  const v1::Plan& plan = view.plan();
  Log(absl::StrCat(
      "view: ", what, "; ", view.members_size(), " members, ",
      group->rank < 0 ? "not one of them" : absl::StrCat("rank ", group->rank),
      "; ", plan.algorithm(), " d=", plan.teams(),
      plan.note().empty() ? "" : absl::StrCat(" (", plan.note(), ")")));
  if (to_abort != nullptr) {
    to_abort->transport->Abort(absl::AbortedError(absl::StrCat(
        "the view changed to epoch ", view.epoch(), " during the operation")));
  }
}

absl::Status Daemon::RunRequest(const v1::AllReduceRequest& request,
                                v1::AllReduceResponse* response) {
  // Fuse the tensors into one buffer, keyed by their names and sizes.
  if (request.tensors().empty()) {
    return absl::InvalidArgumentError("the request has no tensors");
  }
  std::vector<std::string> parts;
  std::vector<uint64_t> offsets{0};
  absl::flat_hash_set<std::string> names;
  for (const v1::Tensor& t : request.tensors()) {
    if (t.name().empty() || !names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor names must be unique and non-empty: '", t.name(), "'"));
    }
    if (t.values().size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name(), "' has ", t.values().size(),
                       " bytes, not a whole number of float32 values"));
    }
    offsets.push_back(offsets.back() + t.values().size() / sizeof(float));
    parts.push_back(absl::StrCat(t.name(), ":",
                                 offsets.back() - offsets[offsets.size() - 2]));
  }
  if (offsets.back() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(offsets.back(), " values in one request; at most 2^32"));
  }
  const std::string buffer = absl::StrJoin(parts, ",");
  std::vector<float> gradient(offsets.back());
  for (int i = 0; i < request.tensors_size(); ++i) {
    const std::string& bytes = request.tensors(i).values();
    std::memcpy(gradient.data() + offsets[i], bytes.data(), bytes.size());
  }
  for (float v : gradient) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError("the gradient holds NaN or infinity");
    }
  }

  absl::MutexLock op_lock(&op_mu_);
  const uint64_t step = request.step();
  std::shared_ptr<Group> group;
  bool stopping;
  {
    absl::MutexLock lock(&state_mu_);
    stopping = stopping_;
    if (has_last_step_ && step <= last_step_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", step, " is not after the last step ", last_step_));
    }
    if (pending_ != nullptr && step >= pending_->view.start_step()) {
      current_ = std::move(pending_);
      pending_.reset();
    }
    group = current_;
    running_ = group;
    running_step_ = step;
    has_last_step_ = true;
    last_step_ = step;
  }
  absl::Status status;
  if (stopping) {
    status = absl::UnavailableError("the worker is shutting down");
  } else if (group == nullptr) {
    status = absl::UnavailableError("no view from the coordinator yet");
  } else if (group->rank < 0) {
    status = absl::UnavailableError(
        absl::StrCat("not a member of epoch ", group->view.epoch()));
  } else if (!group->plan_error.ok()) {
    status = absl::FailedPreconditionError(
        absl::StrCat("the plan of epoch ", group->view.epoch(),
                     " can't run: ", group->plan_error.message()));
  } else if (engine_group_ != group) {
    status = engine_->Reconfigure(group->transport.get(), group->options);
    if (status.ok()) engine_group_ = group;
  }
  absl::StatusOr<sparse::SparseBlock> result = absl::UnknownError("not run");
  collectives::OpStats stats;
  double seconds = 0;
  if (status.ok()) {
    const transport::Counters before = group->transport->counters();
    peers_.RetireOperationsBelow(group->view.epoch(), step);
    const absl::Time start = absl::Now();
    result = engine_->AllReduce(buffer, gradient, step, &stats);
    seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (result.ok()) RecordSuccess(*group, stats, seconds, before);
  } else {
    // Nothing is lost: the next step carries this gradient.
    engine_->Keep(buffer, gradient).IgnoreError();
    result = status;
  }
  {
    absl::MutexLock lock(&state_mu_);
    running_.reset();
    peers_.RetireEpochsBelow(current_ != nullptr ? current_->view.epoch() : 0);
  }
  RecordDrops();
  if (!result.ok()) {
    metrics_->operations(absl::StatusCodeToString(result.status().code()))
        .Increment();
    Log(absl::StrCat("step ", step, " failed: ", result.status().ToString()));
    return absl::Status(
        result.status().code(),
        absl::StrCat("step ", step, ": ", result.status().message()));
  }

  // Split the fused result (and residual) back into the tensors.
  const absl::Span<const float> residual = engine_->residual(buffer);
  size_t e = 0;
  for (int i = 0; i < request.tensors_size(); ++i) {
    v1::SparseTensor* out = response->add_results();
    out->set_name(request.tensors(i).name());
    out->set_size(offsets[i + 1] - offsets[i]);
    std::string* indices = out->mutable_indices();
    std::string* values = out->mutable_values();
    for (; e < result->size() && result->indices[e] < offsets[i + 1]; ++e) {
      const uint32_t local = result->indices[e] - offsets[i];
      indices->append(reinterpret_cast<const char*>(&local), sizeof(local));
      values->append(reinterpret_cast<const char*>(&result->values[e]),
                     sizeof(float));
    }
    if (request.return_residuals()) {
      out->set_residual(
          reinterpret_cast<const char*>(residual.data() + offsets[i]),
          (offsets[i + 1] - offsets[i]) * sizeof(float));
    }
  }
  const v1::Plan& plan = group->view.plan();
  response->set_epoch(group->view.epoch());
  response->set_rank(group->rank);
  response->set_world_size(group->view.members_size());
  response->set_algorithm(plan.algorithm());
  response->set_teams(plan.teams());
  response->set_seconds(seconds);
  response->set_rounds(stats.rounds);
  response->set_bytes_sent(stats.bytes_sent);
  response->set_bytes_received(stats.bytes_received);

  v1::IterationStats report;
  report.set_node_id(node_id_);
  report.set_epoch(group->view.epoch());
  report.set_step(step);
  report.set_seconds(seconds);
  report.set_rounds(stats.rounds);
  report.set_bytes_sent(stats.bytes_sent);
  report.set_bytes_received(stats.bytes_received);
  report.set_values(gradient.size());
  report.set_teams(plan.teams());
  {
    absl::MutexLock lock(&state_mu_);
    reports_.push_back(std::move(report));
  }
  // While autotune measures, the coordinator gets this step's figures before
  // the client can start the next step, so that a plan change they trigger
  // starts at a step no member has reached (View::start_step).
  if (plan.autotuning()) FlushReports();
  return absl::OkStatus();
}

void Daemon::RecordSuccess(const Group& group,
                           const collectives::OpStats& stats, double seconds,
                           const transport::Counters& before) {
  const std::string& algorithm = group.view.plan().algorithm();
  WorkerMetrics& m = *metrics_;
  m.operations("OK").Increment();
  m.operation_seconds(algorithm).Observe(seconds);
  m.topk_seconds(algorithm).Observe(stats.topk_seconds);
  const transport::Counters after = group.transport->counters();
  for (int p = 0; p < group.view.members_size(); ++p) {
    const std::string& peer = group.member_ids[p];
    m.bytes_sent(peer).Increment(
        static_cast<double>(after.bytes_sent_to[p] - before.bytes_sent_to[p]));
    m.bytes_received(peer).Increment(static_cast<double>(
        after.bytes_received_from[p] - before.bytes_received_from[p]));
  }
  for (const char* phase : {"srs_nonzeros", "sag_nonzeros"}) {
    const int64_t v = stats.detail(phase);
    if (v >= 0) {
      m.nonzeros(std::string(phase, std::strlen(phase) - 9))
          .Set(static_cast<double>(v));
    }
  }
  m.nonzeros("result").Set(static_cast<double>(stats.result_nonzeros));
  if (stats.detail("bsag_h") >= 0) {
    m.bsag_h().Set(static_cast<double>(stats.detail("bsag_h")));
  }
  m.teams().Set(group.view.plan().teams());
  m.rank().Set(group.rank);
  m.world_size().Set(group.view.members_size());
}

// At scrape time, off the operations' path: a pass over every residual.
void Daemon::RefreshResidualNorms() {
  // An operation in flight is changing them: keep the last figures.
  if (!op_mu_.TryLock()) return;
  if (engine_ != nullptr) {
    for (const std::string& buffer : engine_->buffers()) {
      double norm = 0;
      for (float v : engine_->residual(buffer)) norm += double{v} * v;
      metrics_->residual_norm(buffer).Set(std::sqrt(norm));
    }
  }
  op_mu_.Unlock();
}

void Daemon::RecordDrops() {
  const transport::PeerService::Stats now = peers_.stats();
  absl::MutexLock lock(&state_mu_);
  metrics_->frames_dropped("old_epoch")
      .Increment(static_cast<double>(now.frames_dropped_old_epoch -
                                     drops_seen_.frames_dropped_old_epoch));
  metrics_->frames_dropped("retired_operation")
      .Increment(
          static_cast<double>(now.frames_dropped_retired_operation -
                              drops_seen_.frames_dropped_retired_operation));
  drops_seen_ = now;
}

grpc::Status Daemon::GetStatus(grpc::ServerContext* context,
                               const v1::StatusRequest* request,
                               v1::StatusResponse* response) {
  absl::MutexLock lock(&state_mu_);
  response->set_node_id(node_id_);
  response->set_rank(-1);
  if (current_ != nullptr) {
    response->set_epoch(current_->view.epoch());
    response->set_rank(current_->rank);
    response->set_world_size(current_->view.members_size());
    *response->mutable_plan() = current_->view.plan();
  }
  return grpc::Status::OK;
}

void Daemon::Stop() {
  std::shared_ptr<Group> running;
  bool joined;
  {
    absl::MutexLock lock(&state_mu_);
    if (stopping_ || server_ == nullptr) return;
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
    running = running_;
    joined = joined_;
  }
  Log("shutting down");
  if (running != nullptr && running->transport != nullptr) {
    running->transport->Abort(
        absl::UnavailableError("the worker is shutting down"));
  }
  if (joined) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    v1::LeaveRequest request;
    request.set_node_id(node_id_);
    v1::LeaveResponse response;
    coordinator_->Leave(&context, request, &response);
  }
  if (watch_thread_.joinable()) watch_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  // Close this worker's streams first, so that peers stopping at the same
  // time see theirs end; then stop serving (what peers still send is cut).
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock op_lock(&op_mu_);
    groups.push_back(std::move(engine_group_));
    absl::MutexLock lock(&state_mu_);
    groups.push_back(std::move(current_));
    groups.push_back(std::move(pending_));
  }
  groups.clear();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Start(
    const DaemonOptions& options) {
  auto daemon = std::make_unique<Daemon>(options);
  GM_RETURN_IF_ERROR(daemon->Init());
  return daemon;
}

}  // namespace gradmesh::daemon

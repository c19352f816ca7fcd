#include "worker/daemon/daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/cli.h"
#include "common/grpc/grpc_util.h"
#include "common/grpc/health_server.h"
#include "common/status_macros.h"
#include "common/steady_clock.h"
#include "gradmesh/v1/coordinator.grpc.pb.h"
#include "proto/plan_proto.h"
#include "worker/daemon/coordinator_client.h"
#include "worker/daemon/data_plane.h"
#include "worker/daemon/outcome_service.h"
#include "worker/daemon/sdk_service.h"
#include "worker/daemon/trainer_watch.h"
#include "worker/daemon/view_tracker.h"
#include "worker/daemon/worker_metrics.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/grpc/peer_service.h"
#ifdef GRADMESH_HAS_CUDA
#include "worker/kernels/cuda_device.h"
#endif

namespace gradmesh::daemon {
namespace {

namespace v1 = ::gradmesh::v1;

// Frames (a chunk and a small header) fit gRPC's default receive limit.
static_assert(transport::kMaxChunkBytes + 4096 <= 4 << 20);

// The token in `path`, without surrounding white space.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the SDK token file '", path, "'"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the SDK token file '", path, "' is empty"));
  }
  return token;
}

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

ViewInfo ToViewInfo(const v1::View& view) {
  ViewInfo info{.epoch = view.epoch(),
                .start_step = view.start_step(),
                .membership_epoch = view.membership_epoch()};
  for (const v1::NodeInfo& m : view.members()) {
    info.member_ids.push_back(m.node_id());
    info.addresses.push_back(m.address());
    info.incarnations.push_back(m.incarnation());
  }
  info.plan = PlanFromProto(view.plan());
  return info;
}

// InvalidArgument naming what `options` gets wrong.
absl::Status CheckOptions(const DaemonOptions& options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("the coordinator address is required");
  }
  if (options.operation_timeout <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration() ||
      options.view_wait < absl::ZeroDuration() ||
      options.step_join_timeout < absl::ZeroDuration() ||
      options.link_timeout < absl::ZeroDuration() ||
      options.peer_buffer_bytes == 0) {
    return absl::InvalidArgumentError(
        "the operation timeout, heartbeat interval and peer buffer must be "
        "positive, the view wait, step-join and link timeouts not "
        "negative");
  }
  return absl::OkStatus();
}

class Daemon final : public WorkerDaemon {
 public:
  explicit Daemon(const DaemonOptions& options)
      : options_(options), peers_(options.peer_buffer_bytes) {}
  ~Daemon() override {
    Stop();
    // Scrapes read the data plane, which goes before metrics_ does.
    if (metrics_ != nullptr) metrics_->StopServing();
  }

  absl::Status Init();
  void Stop() override;
  std::string address() const override { return advertise_; }
  std::string sdk_address() const override { return sdk_address_; }
  int metrics_port() const override { return metrics_->port(); }
  int health_port() const override {
    return health_ == nullptr ? 0 : health_->port();
  }

 private:
  void Log(const std::string& message) const;
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  // A channel of its own to `address` (a new connection), not cached.
  std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) const;
  std::shared_ptr<Group> MakeGroup(const ViewInfo& view);
  void InstallView(const v1::View& view);
  // The node ids of the current view's members to which this worker has
  // had frames unacknowledged, or which has refused its connections, for
  // link_timeout (StalledPeers); logs
  // changes. On the heartbeat thread only.
  std::vector<std::string> Unreachable();
  // The members of `view` other than this worker that answer no Probe
  // within a second, each over a new connection; logs changes. On the
  // heartbeat thread only.
  std::vector<std::string> ProbeMembers(const v1::View& view);
  void Report(const ReduceResult& result);
  // Before each scrape: residual norms and dropped frames.
  void Refresh();
  absl::Status StartServer();
  // The SDK and outcome services StartServer serves.
  absl::Status MakeServices();
  v1::NodeInfo Node() const;
  // TrainerWatch's hooks: leave the group; join again as a new member, and
  // wait (up to view_wait) for a view that has it.
  TrainerWatch::Hooks TrainerHooks();
  void RejoinAsNewMember();
  // Every 200 ms until Stop: destroys retired groups (their streams' close
  // may wait) off the operations' path, and forgets the buckets of clients
  // that died (DataPlane::ForgetAbandoned).
  void ReapLoop();
  void ForgetAbandonedBuckets();
  // Drops cached channels to addresses the newest view does not have.
  void PruneChannelsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the cached channels to the `members` of a view being installed
  // that were not in the last one (all of them when this worker was not):
  // their connections may have lived through what kept them apart (a cut
  // link leaves TCP backing off its retransmissions for seconds), so the
  // next use dials again.
  void FreshChannelsLocked(const std::vector<std::string>& members)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Commit service's check: not over a unix socket, and on TLS, the
  // caller's certificate names the host of a member of `epoch` (of any view
  // remembered, for an older one). Unavailable for an epoch newer than
  // every view installed here.
  absl::Status AdmitAsker(const grpc::ServerContext& context, uint64_t epoch);
  static constexpr size_t kViewsRemembered = 16;

  const DaemonOptions options_;
  // This member's incarnation, as peers see it in views
  // (NodeInfo.incarnation): new at the process's start, and when it rejoins
  // after stepping out.
  std::atomic<uint64_t> incarnation_ = absl::Uniform<uint64_t>(absl::BitGen());
  std::string advertise_;
  std::string sdk_address_;
  std::string node_id_;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;
  std::unique_ptr<WorkerMetrics> metrics_;
  transport::PeerService peers_;
  std::unique_ptr<ViewTracker> views_;
  std::unique_ptr<DataPlane> plane_;
  std::unique_ptr<SdkService> sdk_;
  std::unique_ptr<OutcomeService> outcomes_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> sdk_server_;  // with `sdk_listen` only
  std::unique_ptr<HealthServer> health_;
  std::unique_ptr<CoordinatorClient> coordinator_;
  std::unique_ptr<TrainerWatch> trainer_watch_;
  absl::Notification trainer_watched_;  // trainer_watch_ is set
  absl::Notification stop_reaping_;
  std::thread reaper_;
  std::vector<std::string> last_unreachable_;  // Unreachable()'s last answer
  std::vector<std::string> last_probe_;        // ProbeMembers()'s last answer

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  transport::PeerService::Stats drops_seen_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // The members' addresses of the latest views installed, oldest first.
  std::deque<std::pair<uint64_t, std::vector<std::string>>> recent_members_
      ABSL_GUARDED_BY(mu_);
};

absl::Status Daemon::Init() {
  GM_RETURN_IF_ERROR(CheckOptions(options_));
  GM_ASSIGN_OR_RETURN(channel_credentials_, ChannelCredentials(options_.tls));
  GM_ASSIGN_OR_RETURN(metrics_, WorkerMetrics::Create(options_.metrics_listen,
                                                      [this] { Refresh(); }));
  views_ = std::make_unique<ViewTracker>(
      [this](const ViewInfo& view) { return MakeGroup(view); }, RealClock());
  plane_ = std::make_unique<DataPlane>(
      views_.get(),
      DataPlaneHooks{
          .on_success = [this](const ReduceResult& r) { Report(r); },
          .metrics = metrics_.get(),
          .ask_outcome =
              [this](const std::string& address, const OutcomeKey& key,
                     const std::vector<std::string>& gone,
                     absl::Time deadline) {
                return AskOutcome(Channel(address), key, gone, deadline);
              }},
      DataPlaneOptions{.view_wait = options_.view_wait});
  GM_RETURN_IF_ERROR(StartServer());
  if (!options_.health_listen.empty()) {
    GM_ASSIGN_OR_RETURN(health_, HealthServer::Start(options_.health_listen));
  }
  coordinator_ = std::make_unique<CoordinatorClient>(
      v1::Coordinator::NewStub(Channel(options_.coordinator)), Node(),
      options_.heartbeat_interval,
      [this](const v1::View& view) { InstallView(view); },
      [this](const std::string& line) { Log(line); },
      [this] { return Unreachable(); },
      [this](const v1::View& view) { return ProbeMembers(view); });
  Log(absl::StrCat(
      "serving on ", advertise_,
      sdk_address_.empty() ? "" : absl::StrCat(" and ", sdk_address_),
      options_.sdk_listen.empty()
          ? ""
          : absl::StrCat(", the SDK on ", options_.sdk_listen),
      ", coordinator ", options_.coordinator,
      options_.tls.enabled() ? ", mutual TLS" : ", plaintext",
      metrics_->port() > 0
          ? absl::StrCat(", /metrics on port ", metrics_->port())
          : "",
      health_ != nullptr
          ? absl::StrCat(", health checks on port ", health_->port())
          : ""));
  coordinator_->Start();
  trainer_watch_ = std::make_unique<TrainerWatch>(options_.step_join_timeout,
                                                  TrainerHooks());
  trainer_watched_.Notify();
  reaper_ = std::thread([this] { ReapLoop(); });
  return absl::OkStatus();
}

absl::Status Daemon::MakeServices() {
  std::string token;
  if (!options_.sdk_token_file.empty()) {
    GM_ASSIGN_OR_RETURN(token, ReadToken(options_.sdk_token_file));
  }
  sdk_ = std::make_unique<SdkService>(
      plane_.get(), views_.get(),
      SdkService::Options{.operation_timeout = options_.operation_timeout,
                          .token = std::move(token),
                          .on_refused =
                              [this](const absl::Status& why) {
                                metrics_->calls_refused("token").Increment();
                                Log(absl::StrCat("refused an SDK call: ",
                                                 why.message()));
                              },
                          .before_call =
                              [this](bool step) {
                                return trainer_watched_.HasBeenNotified()
                                           ? trainer_watch_->BeforeCall(step)
                                           : absl::OkStatus();
                              },
                          .new_trainer =
                              [this](const std::string& why) {
                                if (trainer_watched_.HasBeenNotified()) {
                                  trainer_watch_->NewTrainer(why);
                                }
                              }});
  outcomes_ = std::make_unique<OutcomeService>(
      plane_.get(), [this](const grpc::ServerContext& context, uint64_t epoch) {
        return AdmitAsker(context, epoch);
      });
  return absl::OkStatus();
}

absl::Status Daemon::StartServer() {
  GM_ASSIGN_OR_RETURN(auto server_credentials, ServerCredentials(options_.tls));
  GM_RETURN_IF_ERROR(MakeServices());
  // The SDK (and its unix socket) goes with the peer services, or to a
  // server of its own on `sdk_listen`.
  const bool own_sdk_port = !options_.sdk_listen.empty();
  grpc::ServerBuilder builder;
  grpc::ServerBuilder sdk_builder;
  grpc::ServerBuilder& sdk_side = own_sdk_port ? sdk_builder : builder;
  ApplyServerKeepalive(builder);
  ApplyServerKeepalive(sdk_builder);
  int port = 0;
  int sdk_port = 0;
  builder.AddListeningPort(options_.listen, server_credentials, &port);
  if (own_sdk_port) {
    sdk_builder.AddListeningPort(options_.sdk_listen, server_credentials,
                                 &sdk_port);
  }
  if (!options_.sdk_socket.empty()) {
    // Owner-only: the socket is created under this umask, then checked.
    sdk_side.AddListeningPort(absl::StrCat("unix:", options_.sdk_socket),
                              grpc::InsecureServerCredentials());
  }
  // gRPC's default 4 MiB bounds every message: peer frames are at most
  // kMaxChunkBytes, SDK requests carry no tensor data.
  builder.RegisterCallbackGenericService(&peers_);
  builder.RegisterService(outcomes_.get());
  sdk_side.RegisterService(sdk_.get());
  const mode_t old_mask = umask(0077);
  server_ = builder.BuildAndStart();
  if (own_sdk_port) sdk_server_ = sdk_builder.BuildAndStart();
  umask(old_mask);
  if (server_ == nullptr || port == 0 ||
      (own_sdk_port && (sdk_server_ == nullptr || sdk_port == 0))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options_.listen,
        own_sdk_port ? absl::StrCat(" or ", options_.sdk_listen) : "",
        options_.sdk_socket.empty() ? "" : " or ", options_.sdk_socket));
  }
  if (!options_.sdk_socket.empty()) {
    if (chmod(options_.sdk_socket.c_str(), 0600) != 0) {
      return absl::InternalError(
          absl::StrCat("chmod ", options_.sdk_socket, " failed"));
    }
    sdk_address_ = absl::StrCat("unix:", options_.sdk_socket);
  }
  advertise_ = options_.advertise;
  if (advertise_.empty()) {
    advertise_ = absl::StrCat(SplitHostPort(options_.listen).first, ":", port);
  }
  node_id_ = options_.node_id.empty() ? advertise_ : options_.node_id;
  sdk_->set_node_id(node_id_);
  return absl::OkStatus();
}

TrainerWatch::Hooks Daemon::TrainerHooks() {
  return {
      .absent = [this] { return plane_->Absent(options_.step_join_timeout); },
      .step_out = [this] { coordinator_->StepOut(); },
      .rejoin = [this] { RejoinAsNewMember(); },
      .log = [this](const std::string& line) { Log(line); }};
}

void Daemon::RejoinAsNewMember() {
  const uint64_t incarnation = absl::Uniform<uint64_t>(absl::BitGen());
  incarnation_.store(incarnation);
  coordinator_->Rejoin(incarnation);
  const absl::Time deadline = absl::Now() + options_.view_wait;
  while (true) {
    const uint64_t seen = views_->latest_epoch();
    const std::shared_ptr<Group> group = views_->current();
    if (group != nullptr && group->rank >= 0 &&
        group->view.incarnations[group->rank] == incarnation) {
      return;
    }
    if (!views_->AwaitNewer(seen, deadline)) return;
  }
}

v1::NodeInfo Daemon::Node() const {
  v1::NodeInfo node;
  node.set_node_id(node_id_);
  node.set_address(advertise_);
  node.set_host(HostName());
  node.set_incarnation(incarnation_);
#ifdef GRADMESH_HAS_CUDA
  node.set_gpus(kernels::CudaDeviceCount());
  if (node.gpus() > 0) node.set_gpu_name(kernels::CudaDeviceDescription());
#endif
  return node;
}

void Daemon::Log(const std::string& message) const {
  std::shared_ptr<Group> group =
      views_ == nullptr ? nullptr : views_->current();
  const std::string where =
      group == nullptr
          ? "epoch=- rank=-"
          : absl::StrCat("epoch=", group->view.epoch, " rank=", group->rank);
  LogLine("gradmesh-worker",
          absl::StrCat("node=", node_id_.empty() ? options_.listen : node_id_,
                       " ", where),
          message);
}

std::vector<std::string> Daemon::ProbeMembers(const v1::View& view) {
  std::vector<std::pair<std::string, std::string>> members;
  for (const v1::NodeInfo& m : view.members()) {
    if (m.node_id() != node_id_) {
      members.emplace_back(m.node_id(), m.address());
    }
  }
  std::vector<std::string> unreachable = UnreachableMembers(
      members,
      [this](const std::string& address) { return NewChannel(address); },
      absl::Now() + absl::Seconds(1));
  if (unreachable != last_probe_) {
    Log(unreachable.empty() ? std::string("joining; every member answers")
                            : absl::StrCat("joining; no answer from ",
                                           absl::StrJoin(unreachable, ", ")));
    last_probe_ = unreachable;
  }
  return unreachable;
}

std::shared_ptr<grpc::Channel> Daemon::Channel(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = NewChannel(address);
    metrics_->peer_channels().Set(static_cast<double>(channels_.size()));
  }
  return channel;
}

std::shared_ptr<grpc::Channel> Daemon::NewChannel(
    const std::string& address) const {
  // Its own connections, not the process-wide pool's: a channel made again
  // is a new connection (see FreshChannelsLocked).
  grpc::ChannelArguments arguments = DefaultChannelArguments();
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, channel_credentials_, arguments);
}

std::shared_ptr<Group> Daemon::MakeGroup(const ViewInfo& view) {
  auto group = std::make_shared<Group>();
  group->view = view;
  for (int r = 0; r < group->size(); ++r) {
    // A later process with this node id is another member, not this one.
    const uint64_t incarnation = view.incarnations[r];
    if (view.member_ids[r] == node_id_ &&
        (incarnation == 0 || incarnation == incarnation_)) {
      group->rank = r;
    }
  }
  if (group->rank < 0) return group;
  const PlanInfo& plan = view.plan;
  auto algorithm = collectives::AlgorithmOptionsOf(plan);
  if (!algorithm.ok()) {
    group->error = algorithm.status();
    return group;
  }
  algorithm->topk = options_.topk;
  group->options = {.algorithm = *std::move(algorithm),
                    .timeout = options_.operation_timeout,
                    .epoch = view.epoch};
  auto transport = transport::GrpcTransport::Create(
      {.service = &peers_,
       .epoch = view.epoch,
       .rank = group->rank,
       .peers = view.addresses,
       .channels = [this](const std::string& a) { return Channel(a); },
       .chunk_bytes = plan.chunk_bytes == 0 ? transport::kDefaultChunkBytes
                                            : plan.chunk_bytes});
  if (!transport.ok()) {
    group->error = transport.status();
    return group;
  }
  group->transport = *std::move(transport);
  group->error = engine::CheckOptions(group->config());
  if (group->error.ok() && plan.fusion != collectives::kPerTensor &&
      plan.fusion != collectives::kAfterFusion) {
    group->error = absl::InvalidArgumentError(
        absl::StrCat("fusion '", plan.fusion, "' is unknown to this worker"));
  }
  return group;
}

std::vector<std::string> Daemon::Unreachable() {
  std::vector<std::string> ids;
  const std::shared_ptr<Group> group = views_->current();
  if (options_.link_timeout > absl::ZeroDuration() && group != nullptr &&
      group->rank >= 0 && group->transport != nullptr) {
    for (int peer :
         group->transport->StalledPeers(options_.link_timeout, SteadyNow())) {
      ids.push_back(group->view.member_ids[peer]);
    }
  }
  if (ids != last_unreachable_) {
    Log(ids.empty() ? std::string("every peer is reachable again")
                    : absl::StrCat(
                          "cannot reach ", absl::StrJoin(ids, ", "),
                          ": frames unacknowledged or connections refused for ",
                          absl::FormatDuration(options_.link_timeout),
                          "; reported to the coordinator"));
    last_unreachable_ = ids;
    metrics_->unreachable_peers().Set(static_cast<double>(ids.size()));
  }
  return ids;
}

void Daemon::InstallView(const v1::View& view) {
  std::optional<ViewTracker::Change> change = views_->Install(ToViewInfo(view));
  if (!change.has_value()) return;
  metrics_->epoch().Set(static_cast<double>(view.epoch()));
  if (change->late) metrics_->late_views().Increment();
  const Group& group = *change->group;
  if (health_ != nullptr) {
    health_->SetReady(group.rank >= 0 && group.error.ok());
  }
  const PlanInfo& plan = group.view.plan;
  Log(absl::StrCat(
      "view: ", change->description, "; ", group.size(), " members, ",
      group.rank < 0 ? "not one of them" : absl::StrCat("rank ", group.rank),
      "; ", plan.algorithm, " d=", plan.teams,
      plan.note.empty() ? "" : absl::StrCat(" (", plan.note, ")")));
  for (const std::shared_ptr<Group>& replaced : change->replaced) {
    if (replaced->transport == nullptr) continue;
    replaced->transport->Abort(absl::AbortedError(absl::StrCat(
        "the view changed to epoch ", view.epoch(), " during the operation")));
  }
  absl::MutexLock lock(&mu_);
  FreshChannelsLocked(group.view.addresses);
  // In epoch order, whichever of two views installed at once gets here first.
  auto at = std::upper_bound(
      recent_members_.begin(), recent_members_.end(), group.view.epoch,
      [](uint64_t epoch, const auto& entry) { return epoch < entry.first; });
  recent_members_.emplace(at, group.view.epoch, group.view.addresses);
  if (recent_members_.size() > kViewsRemembered) recent_members_.pop_front();
  PruneChannelsLocked();
}

void Daemon::FreshChannelsLocked(const std::vector<std::string>& members) {
  if (recent_members_.empty()) return;
  const std::vector<std::string>& before = recent_members_.back().second;
  const bool was_member =
      std::find(before.begin(), before.end(), advertise_) != before.end();
  for (const std::string& address : members) {
    if (!was_member ||
        std::find(before.begin(), before.end(), address) == before.end()) {
      channels_.erase(address);
    }
  }
}

void Daemon::PruneChannelsLocked() {
  // Transports hold the channels they use, and an ask about an older
  // epoch's step makes its channel again: the cache keeps the newest view's.
  absl::flat_hash_set<std::string> wanted = {options_.coordinator};
  const std::vector<std::string>& newest = recent_members_.back().second;
  wanted.insert(newest.begin(), newest.end());
  absl::erase_if(channels_,
                 [&](const auto& c) { return !wanted.contains(c.first); });
  metrics_->peer_channels().Set(static_cast<double>(channels_.size()));
}

absl::Status Daemon::AdmitAsker(const grpc::ServerContext& context,
                                uint64_t epoch) {
  if (OverUnixSocket(context)) {
    metrics_->calls_refused("identity").Increment();
    return absl::PermissionDeniedError(
        "outcome asks are not taken over the SDK's unix socket");
  }
  std::vector<std::string> members;
  {
    absl::MutexLock lock(&mu_);
    // An epoch not installed here yet: no one can be checked against it (and
    // an ask could plant a promise for a step not run yet).
    if (recent_members_.empty() || epoch > recent_members_.back().first) {
      return absl::UnavailableError(
          absl::StrCat("epoch ", epoch, " is not installed here yet"));
    }
    for (const auto& [e, addresses] : recent_members_) {
      if (e == epoch) members = addresses;
    }
    if (members.empty()) {  // older than those remembered: any member then
      for (const auto& [e, addresses] : recent_members_) {
        members.insert(members.end(), addresses.begin(), addresses.end());
      }
    }
  }
  absl::Status admitted =
      CheckCaller(context, members, absl::StrCat("a member of epoch ", epoch));
  if (!admitted.ok()) {
    metrics_->calls_refused("identity").Increment();
    Log(absl::StrCat("refused an outcome ask: ", admitted.message()));
  }
  return admitted;
}

void Daemon::Report(const ReduceResult& result) {
  // An exact bucket ran the dense ring, not the plan: no sample of it for
  // the choice of d. Except the sizes `auto` chose to sum densely: the
  // coordinator watches them for a change of link (server/retune.h).
  const std::vector<uint64_t>& dense = result.plan.dense_sizes;
  if (result.exact &&
      !std::binary_search(dense.begin(), dense.end(), result.values)) {
    return;
  }
  v1::IterationStats report;
  report.set_node_id(node_id_);
  report.set_epoch(result.epoch);
  report.set_step(result.step);
  report.set_seconds(result.seconds);
  report.set_period_seconds(result.period_seconds);
  report.set_rounds(result.stats.rounds);
  report.set_bytes_sent(result.stats.bytes_sent);
  report.set_bytes_received(result.stats.bytes_received);
  report.set_values(result.values);
  report.set_teams(result.plan.teams);
  coordinator_->Report(std::move(report), result.plan.autotuning);
}

void Daemon::Refresh() {
  metrics_->SetResidualNorms(plane_->ResidualNorms());
  const transport::PeerService::Stats now = peers_.stats();
  absl::MutexLock lock(&mu_);
  metrics_->frames_dropped("old_epoch")
      .Increment(static_cast<double>(now.frames_dropped_old_epoch -
                                     drops_seen_.frames_dropped_old_epoch));
  metrics_->frames_dropped("retired_operation")
      .Increment(
          static_cast<double>(now.frames_dropped_retired_operation -
                              drops_seen_.frames_dropped_retired_operation));
  metrics_->calls_refused("malformed")
      .Increment(static_cast<double>(now.streams_refused -
                                     drops_seen_.streams_refused));
  metrics_->frames_dropped("unclaimed_operation")
      .Increment(static_cast<double>(now.messages_dropped_unclaimed -
                                     drops_seen_.messages_dropped_unclaimed));
  metrics_->calls_refused("limits").Increment(static_cast<double>(
      now.streams_refused_unopened_bytes + now.streams_refused_unopened_epochs +
      now.streams_refused_peer_budget -
      drops_seen_.streams_refused_unopened_bytes -
      drops_seen_.streams_refused_unopened_epochs -
      drops_seen_.streams_refused_peer_budget));
  metrics_->calls_refused("identity")
      .Increment(static_cast<double>(now.streams_refused_identity -
                                     drops_seen_.streams_refused_identity));
  drops_seen_ = now;
}

void Daemon::ReapLoop() {
  while (
      !stop_reaping_.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
    views_->ReleaseRetired();
    ForgetAbandonedBuckets();
  }
}

void Daemon::ForgetAbandonedBuckets() {
  for (const BucketName& name : plane_->ForgetAbandoned()) {
    Log(absl::StrCat("forgot bucket '", name.bucket, "' of job '", name.job,
                     "': its client let go of it without unregistering it "
                     "(the trainer process exited)"));
  }
}

void Daemon::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || server_ == nullptr) return;
    stopped_ = true;
  }
  Log("shutting down");
  if (health_ != nullptr) health_->Stop();
  std::vector<std::shared_ptr<Group>> groups = views_->Stop();
  for (const auto& group : groups) {
    if (group->transport != nullptr) {
      group->transport->Abort(
          absl::UnavailableError("the worker is shutting down"));
    }
  }
  // After the aborts: a close in progress there no longer delays them.
  if (reaper_.joinable()) {
    stop_reaping_.Notify();
    reaper_.join();
  }
  if (trainer_watch_ != nullptr) trainer_watch_->Stop();
  if (coordinator_ != nullptr) coordinator_->Stop();  // null: Init failed
  // Close this worker's streams first, so that peers stopping at the same
  // time see theirs end; then stop serving (what peers still send is cut).
  groups.clear();
  const auto grace = [] {
    return absl::ToChronoTime(absl::Now() + absl::Milliseconds(500));
  };
  if (sdk_server_ != nullptr) sdk_server_->Shutdown(grace());
  server_->Shutdown(grace());
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Start(
    const DaemonOptions& options) {
  auto daemon = std::make_unique<Daemon>(options);
  GM_RETURN_IF_ERROR(daemon->Init());
  return daemon;
}

}  // namespace gradmesh::daemon

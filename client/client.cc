// The SDK over the worker's control service (gRPC, usually on a unix socket)
// and shared-memory segments (common/shm_segment.h).
#include "gradmesh/client.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc/grpc_util.h"
#include "common/shm_segment.h"
#include "common/status_macros.h"
#include "gradmesh/v1/worker.grpc.pb.h"

namespace gradmesh {

namespace v1 = ::gradmesh::v1;

namespace {

std::string FromEnv(const std::string& given, const char* variable,
                    const std::string& fallback = "") {
  if (!given.empty()) return given;
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// How long a worker that stopped answering (Unavailable) gets to accept a
// connection again before it counts as gone, and how long a channel may
// still report the connection that just broke as ready.
constexpr absl::Duration kGoneAfter = absl::Seconds(1);
constexpr absl::Duration kStaleReady = absl::Milliseconds(200);
constexpr absl::string_view kWorkerGonePayload = "gradmesh.dev/worker-gone";

}  // namespace

bool IsWorkerGone(const absl::Status& status) {
  return status.GetPayload(kWorkerGonePayload).has_value();
}

// The connection, shared by the client and its tensor sets.
struct Client::Impl {
  std::string job;
  absl::Duration timeout;
  std::string worker;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Worker::Stub> stub;
  bool connected = false;  // set once, before the client is handed out
  mutable std::atomic<bool> gone = false;  // Check's verdict, once reached

  absl::Mutex mu;
  int rank ABSL_GUARDED_BY(mu) = -1;
  int size ABSL_GUARDED_BY(mu) = 0;
  uint64_t next_sequence ABSL_GUARDED_BY(mu) = 0;      // broadcasts, barriers
  uint64_t next_registration ABSL_GUARDED_BY(mu) = 0;  // every attempt
  // Calls in flight, each kept alive here until its callback has run.
  absl::flat_hash_map<grpc::ClientContext*, std::shared_ptr<void>> in_flight
      ABSL_GUARDED_BY(mu);

  std::string authorization;  // "Bearer TOKEN", or empty
  // RegisterRequest.client_id: this client's, random.
  const std::string client_id =
      absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(absl::BitGen())),
                   absl::Hex(absl::Uniform<uint64_t>(absl::BitGen())));

  void Authorize(grpc::ClientContext* context) const {
    if (!authorization.empty()) {
      context->AddMetadata("authorization", authorization);
    }
  }
  // Calls wait for the worker to be up while connecting; once connected,
  // a worker that can't be reached fails them at once (Check).
  void Prepare(grpc::ClientContext* context) const {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    context->set_wait_for_ready(!connected);
    Authorize(context);
  }
  // A call's status. Unavailable because the worker refuses connections
  // (an attempt within kGoneAfter failed and none succeeded, unlike a
  // stalled worker's, which stay under way) says so (IsWorkerGone), now and
  // for every later call.
  absl::Status Check(const grpc::Status& status) const {
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || !connected) {
      return ToAbsl(status);
    }
    if (!gone.load()) {
      if (!RefusesConnections()) return ToAbsl(status);
      gone = true;
    }
    absl::Status why = absl::UnavailableError(
        absl::StrCat("the worker at ", worker, " is gone (",
                     status.error_message(), "): this trainer should stop"));
    why.SetPayload(kWorkerGonePayload, absl::Cord("1"));
    return why;
  }
  // Whether, within kGoneAfter, a connection attempt to the worker failed
  // and none succeeded: refused, not merely slow to answer (a stalled
  // worker's stays connecting) nor back (ready again). Right after a call
  // broke, the channel may still say "ready" for the broken connection for
  // a moment; one that stays ready for kStaleReady is alive (the worker
  // itself answered Unavailable).
  bool RefusesConnections() const {
    const absl::Time start = absl::Now();
    grpc_connectivity_state state = channel->GetState(true);
    if (state == GRPC_CHANNEL_READY) {
      if (!channel->WaitForStateChange(
              state, absl::ToChronoTime(start + kStaleReady))) {
        return false;
      }
      state = channel->GetState(true);
    }
    const auto until = absl::ToChronoTime(start + kGoneAfter);
    bool failed = false;
    while (state != GRPC_CHANNEL_READY) {
      failed = failed || state == GRPC_CHANNEL_TRANSIENT_FAILURE;
      if (!channel->WaitForStateChange(state, until)) break;
      state = channel->GetState(true);
    }
    return failed && state != GRPC_CHANNEL_READY;
  }
  void SetMembership(int r, int s) {
    absl::MutexLock lock(&mu);
    rank = r;
    size = s;
  }
};

struct TensorSet::State {
  std::shared_ptr<Client::Impl> client;
  std::string bucket;
  std::vector<TensorSpec> tensors;
  std::vector<uint64_t> offsets;  // tensors.size() + 1
  SegmentLayout layout{0};
  SharedSegment segment;
  std::string shm_name;  // names this registration in Unregister
};

struct Handle::Call {
  std::shared_ptr<Client::Impl> client;
  grpc::ClientContext context;
  v1::AllReduceRequest request;
  v1::AllReduceResponse response;
  grpc::Status status;
  absl::Notification done;
  bool waited = false;
};

// ---------------------------------------------------------------- TensorSet

TensorSet::TensorSet(std::unique_ptr<State> state) : state_(std::move(state)) {}

TensorSet::~TensorSet() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  state_->client->Authorize(&context);
  v1::UnregisterRequest request;
  request.set_job(state_->client->job);
  request.set_bucket(state_->bucket);
  request.set_shm_name(state_->shm_name);
  v1::UnregisterResponse response;
  // Best effort: a worker that is gone has forgotten the bucket anyway.
  state_->client->stub->Unregister(&context, request, &response);
}

const std::string& TensorSet::bucket() const { return state_->bucket; }
const std::vector<TensorSpec>& TensorSet::tensors() const {
  return state_->tensors;
}
uint64_t TensorSet::size() const { return state_->layout.n; }

absl::Span<float> TensorSet::values() {
  return {state_->segment.at<float>(state_->layout.values), size()};
}

absl::Span<float> TensorSet::tensor(size_t i) {
  return values().subspan(offset(i), state_->tensors.at(i).size);
}

uint64_t TensorSet::offset(size_t i) const { return state_->offsets.at(i); }

absl::Status TensorSet::CopyFrom(absl::Span<const float> gradient) {
  if (gradient.size() != size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket '", bucket(), "' holds ", size(), " values, got ",
                     gradient.size()));
  }
  std::memcpy(values().data(), gradient.data(), size() * sizeof(float));
  return absl::OkStatus();
}

absl::Span<const uint32_t> TensorSet::sparse_indices(uint64_t nonzeros) const {
  return {state_->segment.at<uint32_t>(state_->layout.indices),
          std::min(nonzeros, size())};
}

absl::Span<const float> TensorSet::sparse_values(uint64_t nonzeros) const {
  return {state_->segment.at<float>(state_->layout.sparse_values),
          std::min(nonzeros, size())};
}

absl::Span<const float> TensorSet::residual() const {
  return {state_->segment.at<float>(state_->layout.residual), size()};
}

// ------------------------------------------------------------------- Handle

Handle::Handle() = default;
Handle::Handle(std::shared_ptr<Call> call) : call_(std::move(call)) {}
Handle::~Handle() = default;
Handle::Handle(Handle&&) noexcept = default;
Handle& Handle::operator=(Handle&&) noexcept = default;

bool Handle::Done() const {
  return call_ == nullptr || call_->done.HasBeenNotified();
}

absl::StatusOr<ReduceInfo> Handle::Wait() {
  if (call_ == nullptr || call_->waited) {
    return absl::FailedPreconditionError("this handle was already waited for");
  }
  call_->done.WaitForNotification();
  call_->waited = true;
  GM_RETURN_IF_ERROR(call_->client->Check(call_->status));
  const v1::AllReduceResponse& r = call_->response;
  call_->client->SetMembership(r.rank(), r.world_size());
  return ReduceInfo{.nonzeros = r.nonzeros(),
                    .epoch = r.epoch(),
                    .rank = r.rank(),
                    .world_size = r.world_size(),
                    .algorithm = r.algorithm(),
                    .teams = r.teams(),
                    .seconds = r.seconds(),
                    .wait_seconds = r.wait_seconds(),
                    .rounds = r.rounds(),
                    .bytes_sent = r.bytes_sent(),
                    .bytes_received = r.bytes_received(),
                    .tensors = r.tensors(),
                    .tensors_missing = r.tensors_missing()};
}

// ------------------------------------------------------------------- Client

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  absl::flat_hash_map<grpc::ClientContext*, std::shared_ptr<void>> calls;
  {
    absl::MutexLock lock(&impl_->mu);
    calls = impl_->in_flight;
  }
  // Outside the lock: a cancelled call's callback may run inline and take it.
  for (const auto& [context, call] : calls) context->TryCancel();
  calls.clear();
  absl::MutexLock lock(&impl_->mu);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_->mu) {
    return impl_->in_flight.empty();
  };
  impl_->mu.Await(absl::Condition(&idle));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  const std::string worker = FromEnv(options.worker, "GRADMESH_WORKER");
  if (worker.empty()) {
    return absl::InvalidArgumentError(
        "no worker: set ClientOptions::worker or GRADMESH_WORKER "
        "(gradmesh run sets it)");
  }
  TlsFiles tls{.ca = FromEnv(options.tls_ca, "GRADMESH_TLS_CA"),
               .cert = FromEnv(options.tls_cert, "GRADMESH_TLS_CERT"),
               .key = FromEnv(options.tls_key, "GRADMESH_TLS_KEY")};
  if (worker.rfind("unix:", 0) == 0) tls = {};  // the socket is owner-only
  GM_ASSIGN_OR_RETURN(auto credentials, ChannelCredentials(tls));
  auto impl = std::make_shared<Impl>();
  impl->job = FromEnv(options.job, "GRADMESH_JOB", "default");
  if (const std::string token = FromEnv(options.token, "GRADMESH_TOKEN");
      !token.empty()) {
    impl->authorization = absl::StrCat("Bearer ", token);
  }
  impl->timeout = options.timeout;
  impl->worker = worker;
  impl->channel =
      grpc::CreateCustomChannel(worker, credentials, DefaultChannelArguments());
  impl->stub = v1::Worker::NewStub(impl->channel);
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  // Wait for a view that has this worker in it.
  const absl::Time deadline = absl::Now() + options.timeout;
  while (true) {
    GM_ASSIGN_OR_RETURN(Plan plan, client->GetPlan());
    if (plan.rank >= 0) break;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("worker ", worker, " joined no view within ",
                       absl::FormatDuration(options.timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  client->impl_->connected = true;
  return client;
}

absl::StatusOr<Plan> Client::GetPlan() {
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::StatusResponse response;
  GM_RETURN_IF_ERROR(impl_->Check(
      impl_->stub->GetStatus(&context, v1::StatusRequest(), &response)));
  const v1::Plan& p = response.plan();
  if (response.rank() >= 0) {
    impl_->SetMembership(response.rank(), response.world_size());
  }
  return Plan{.epoch = response.epoch(),
              .rank = response.rank(),
              .world_size = response.world_size(),
              .algorithm = p.algorithm(),
              .density = p.density(),
              .teams = p.teams(),
              .encoding = p.encoding(),
              .autotuning = p.autotuning(),
              .exact_below = p.exact_below(),
              .dense_sizes = {p.dense_sizes().begin(), p.dense_sizes().end()},
              .warmup_steps = p.warmup_steps(),
              .fusion = p.fusion().empty() ? "per_tensor" : p.fusion(),
              .note = p.note()};
}

int Client::rank() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->rank;
}

int Client::size() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->size;
}

const std::string& Client::job() const { return impl_->job; }

namespace {

// What a registration says of the bucket (Register adds its segment and
// numbers).
v1::RegisterRequest DescribeBucket(const std::string& job,
                                   const std::string& bucket,
                                   const std::vector<TensorSpec>& tensors,
                                   const RegisterOptions& options) {
  v1::RegisterRequest request;
  request.set_job(job);
  request.set_bucket(bucket);
  request.set_fusion(options.fusion == Fusion::kAfterFusion
                         ? v1::FUSION_AFTER_FUSION
                         : v1::FUSION_PER_TENSOR_QUOTA);
  request.set_exact(options.exact);
  request.set_exact_tensors(options.exact_tensors);
  for (const TensorSpec& t : tensors) {
    v1::TensorSpec* spec = request.add_tensors();
    spec->set_name(t.name);
    spec->set_size(t.size);
  }
  return request;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorSet>> Client::Register(
    const std::string& bucket, const std::vector<TensorSpec>& tensors,
    const RegisterOptions& options) {
  auto state = std::make_unique<TensorSet::State>();
  state->client = impl_;
  state->bucket = bucket;
  state->tensors = tensors;
  state->offsets.push_back(0);
  for (const TensorSpec& t : tensors) {
    state->offsets.push_back(state->offsets.back() + t.size);
  }
  v1::RegisterRequest request =
      DescribeBucket(impl_->job, bucket, tensors, options);
  // The daemon checks names and sizes; a size that would not even map
  // fails here first.
  if (state->offsets.back() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket '", bucket, "' holds over 2^32 - 1 values"));
  }
  state->layout = SegmentLayout(state->offsets.back());
  const std::string name = SharedSegment::UniqueName(bucket);
  GM_ASSIGN_OR_RETURN(state->segment,
                      SharedSegment::Create(name, state->layout.bytes));
  // Held while this set lives: the worker forgets the bucket once it is not.
  if (absl::Status locked = state->segment.HoldLock(); !locked.ok()) {
    SharedSegment::Unlink(name).IgnoreError();
    return locked;
  }
  request.set_segment_locked(true);
  request.set_shm_name(name);
  request.set_client_id(impl_->client_id);
  state->shm_name = name;
  {
    absl::MutexLock lock(&impl_->mu);
    request.set_index(impl_->next_registration++);
  }
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::RegisterResponse response;
  const grpc::Status status =
      impl_->stub->Register(&context, request, &response);
  // Mapped on both sides now (or never will be): the name can go.
  GM_RETURN_IF_ERROR(SharedSegment::Unlink(name));
  GM_RETURN_IF_ERROR(impl_->Check(status));
  impl_->SetMembership(response.rank(), response.world_size());
  auto set = std::unique_ptr<TensorSet>(new TensorSet(std::move(state)));
  if (response.exact_tensors() != options.exact_tensors) {
    // Unregistered as `set` goes: the tail would be summed by the plan.
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket '", bucket,
        "': the worker does not sum exact tensors (it "
        "predates RegisterOptions::exact_tensors); upgrade the worker"));
  }
  return set;
}

Handle Client::AllReduceAsync(TensorSet& set, uint64_t step,
                              const AllReduceOptions& options) {
  auto call = std::make_shared<Handle::Call>();
  call->client = impl_;
  call->request.set_job(impl_->job);
  call->request.set_bucket(set.bucket());
  call->request.set_step(step);
  call->request.set_op(options.op == ReduceOp::kMean ? v1::REDUCE_MEAN
                                                     : v1::REDUCE_SUM);
  call->request.set_layout(options.layout == ResultLayout::kSparse
                               ? v1::RESULT_SPARSE
                               : v1::RESULT_DENSE);
  call->request.set_return_residual(options.return_residual);
  impl_->Prepare(&call->context);
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->in_flight.emplace(&call->context, call);
  }
  // The callback holds the call (and so the connection) until it has run.
  impl_->stub->async()->AllReduce(
      &call->context, &call->request, &call->response,
      [call](grpc::Status status) {
        call->status = std::move(status);
        {
          absl::MutexLock lock(&call->client->mu);
          call->client->in_flight.erase(&call->context);
        }
        call->done.Notify();
      });
  return Handle(std::move(call));
}

absl::StatusOr<ReduceInfo> Client::AllReduce(TensorSet& set, uint64_t step,
                                             const AllReduceOptions& options) {
  return AllReduceAsync(set, step, options).Wait();
}

absl::Status Client::BroadcastBucket(const std::string& bucket, int root) {
  Impl& impl = *impl_;
  v1::BroadcastRequest request;
  request.set_job(impl.job);
  request.set_bucket(bucket);
  request.set_root(root);
  {
    absl::MutexLock lock(&impl.mu);
    request.set_sequence(impl.next_sequence++);
  }
  grpc::ClientContext context;
  impl.Prepare(&context);
  v1::BroadcastResponse response;
  GM_RETURN_IF_ERROR(
      impl.Check(impl.stub->Broadcast(&context, request, &response)));
  impl.SetMembership(response.rank(), response.world_size());
  return absl::OkStatus();
}

absl::Status Client::Broadcast(TensorSet& set, int root) {
  return BroadcastBucket(set.bucket(), root);
}

absl::Status Client::Barrier() { return BroadcastBucket("", 0); }

absl::Status Client::ResidualCall(TensorSet& set, bool load) {
  Impl& impl = *impl_;
  v1::ResidualRequest request;
  request.set_job(impl.job);
  request.set_bucket(set.bucket());
  request.set_action(load ? v1::ResidualRequest::LOAD
                          : v1::ResidualRequest::SAVE);
  grpc::ClientContext context;
  impl.Prepare(&context);
  v1::ResidualResponse response;
  return impl.Check(impl.stub->Residual(&context, request, &response));
}

absl::Status Client::SaveResidual(TensorSet& set) {
  return ResidualCall(set, /*load=*/false);
}

absl::Status Client::LoadResidual(TensorSet& set,
                                  absl::Span<const float> residual) {
  if (residual.size() != set.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a residual of ", residual.size(), " values for bucket '",
                     set.bucket(), "' of ", set.size()));
  }
  float* region = set.state_->segment.at<float>(set.state_->layout.residual);
  std::copy(residual.begin(), residual.end(), region);
  return ResidualCall(set, /*load=*/true);
}

}  // namespace gradmesh

#include "worker/daemon/data_plane.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"
#include "worker/collectives/primitives.h"
#include "worker/collectives/registry.h"
#include "worker/collectives/tensor_quota.h"
#include "worker/daemon/worker_metrics.h"

namespace gradmesh::daemon {

// What the members exchange before an operation.
struct DataPlane::AgreeRecord {
  uint64_t fingerprint = 0;
  uint64_t values = 0;
  uint64_t nonfinite = 0;
  int64_t root = -1;  // a broadcast's root; -1 for an all-reduce
};

struct DataPlane::Bucket {
  BucketName name;
  std::string key;         // "job/bucket"
  uint64_t id = 0;         // this registration's, agreed by the members
  std::string buffer;      // the engine's buffer: key and id
  std::string descriptor;  // bucket name, tensor names and sizes, options
  uint64_t fingerprint = 0;
  std::vector<uint64_t> tensor_starts;  // each tensor's first index
  // The members (node id, incarnation) that registered it: a step on a view
  // with anyone else needs the bucket registered again.
  absl::flat_hash_set<std::pair<std::string, uint64_t>> members;
  bool per_tensor_quota = true;
  SegmentLayout layout{0};
  SharedSegment segment;
  absl::Mutex mu;                         // held briefly
  bool busy ABSL_GUARDED_BY(mu) = false;  // a call runs on it
  std::optional<uint64_t> last_step ABSL_GUARDED_BY(mu);
  bool forgotten ABSL_GUARDED_BY(mu) = false;  // unregistered or replaced

  absl::Span<float> values() const {
    return {segment.at<float>(layout.values), layout.n};
  }
};

namespace {

constexpr uint64_t kMaxNameBytes = 256;

// Member `rank`'s incarnation in `group`'s view (0 where views carry none).
uint64_t Incarnation(const Group& group, int rank) {
  const auto& all = group.view.incarnations;
  return rank < static_cast<int>(all.size()) ? all[rank] : 0;
}

// An operation-id scope under `group`'s membership.
std::string MembershipScope(absl::string_view scope, const Group& group) {
  return absl::StrCat(scope, "/", group.view.membership_epoch);
}

std::string Key(const BucketName& name) {
  return absl::StrCat(name.job, "/", name.bucket);
}

absl::Status CheckName(absl::string_view what, absl::string_view name,
                       bool may_be_empty) {
  if ((name.empty() && !may_be_empty) || name.size() > kMaxNameBytes ||
      name.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad ", what, " name '", name, "': 1 to 256 bytes without '/'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Describe(const BucketName& name,
                                     const std::vector<TensorSpec>& tensors,
                                     uint64_t* n) {
  GM_RETURN_IF_ERROR(CheckName("job", name.job, false));
  GM_RETURN_IF_ERROR(CheckName("bucket", name.bucket, false));
  if (tensors.empty()) {
    return absl::InvalidArgumentError("a tensor set needs a tensor");
  }
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> parts;
  *n = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty() || t.name.size() > kMaxNameBytes ||
        !seen.insert(t.name).second || t.size == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' of bucket '", name.bucket,
          "': names must be unique and non-empty, sizes positive"));
    }
    *n += t.size;
    if (*n > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket '", name.bucket, "' holds over 2^32 - 1 values"));
    }
    parts.push_back(absl::StrCat(t.name, ":", t.size));
  }
  return absl::StrCat(name.bucket, " [", absl::StrJoin(parts, ","), "]");
}

Membership MembershipOf(const Group& group) {
  return {.epoch = group.view.epoch,
          .rank = group.rank,
          .world_size = group.size()};
}

}  // namespace

uint64_t OperationId(absl::string_view kind, absl::string_view scope,
                     uint64_t number) {
  char tail[sizeof(number)];
  std::memcpy(tail, &number, sizeof(number));
  const absl::string_view zero("\0", 1);
  uint64_t hash = Fnv1a(kind);
  hash = Fnv1a(zero, hash);
  hash = Fnv1a(scope, hash);
  hash = Fnv1a(zero, hash);
  return Fnv1a(absl::string_view(tail, sizeof(tail)), hash);
}

DataPlane::DataPlane(ViewTracker* views, DataPlaneHooks hooks,
                     DataPlaneOptions options)
    : views_(views),
      hooks_(std::move(hooks)),
      options_(options),
      protocol_({.gather =
                     [this](const Group& g, uint64_t op, std::string mine,
                            absl::Time deadline) {
                       return GatherSmall(g, op, std::move(mine), deadline);
                     },
                 .ask_outcome = hooks_.ask_outcome,
                 .current = [views] { return views->current(); }},
                views->clock(), hooks_.metrics,
                {.view_wait = options.view_wait,
                 .outcome_retention = options.outcome_retention}) {}

absl::StatusOr<Membership> DataPlane::Register(
    const BucketName& name, const std::vector<TensorSpec>& tensors,
    const std::string& shm_name, uint64_t index, absl::Time deadline,
    const BucketOptions& options) {
  auto bucket = std::make_shared<Bucket>();
  bucket->name = name;
  bucket->key = Key(name);
  uint64_t n = 0;
  GM_ASSIGN_OR_RETURN(bucket->descriptor, Describe(name, tensors, &n));
  if (!options.per_tensor_quota) {
    absl::StrAppend(&bucket->descriptor, " after-fusion");
  }
  bucket->per_tensor_quota = options.per_tensor_quota;
  for (uint64_t start = 0; const TensorSpec& t : tensors) {
    bucket->tensor_starts.push_back(start);
    start += t.size;
  }
  bucket->fingerprint = Fnv1a(bucket->descriptor);
  bucket->layout = SegmentLayout(n);
  GM_ASSIGN_OR_RETURN(bucket->segment,
                      SharedSegment::Open(shm_name, bucket->layout.bytes));
  // Mapped: the name can go, so a client killed now leaves nothing behind.
  SharedSegment::Unlink(shm_name).IgnoreError();
  uint64_t nonce;
  {
    absl::MutexLock lock(&mu_);
    nonce = absl::Uniform<uint64_t>(bitgen_);
  }
  GM_ASSIGN_OR_RETURN(std::shared_ptr<Group> group,
                      views_->Acquire(std::nullopt, deadline));
  // Each member proposes a random id; rank 0's names the registration, so
  // that a bucket registered again (a new process, a new run of the job)
  // never reuses the operation ids of the one before.
  std::string mine = bucket->descriptor;
  mine.append(reinterpret_cast<const char*>(&nonce), sizeof(nonce));
  const uint64_t op =
      OperationId("register", MembershipScope(name.job, *group),
                  Renumber(absl::StrCat(name.job, "#register"), *group, index));
  GM_ASSIGN_OR_RETURN(std::vector<std::string> all,
                      GatherSmall(*group, op, std::move(mine), deadline));
  for (int r = 0; r < group->size(); ++r) {
    const absl::string_view theirs = all[r];
    if (theirs.size() < sizeof(nonce) ||
        theirs.substr(0, theirs.size() - sizeof(nonce)) != bucket->descriptor) {
      const size_t shown = std::min<size_t>(
          512, theirs.size() - std::min(theirs.size(), sizeof(nonce)));
      return absl::InvalidArgumentError(absl::StrCat(
          "registration #", index, " of job '", name.job,
          "' differs between workers: rank ", group->rank, " has ",
          bucket->descriptor, ", rank ", r, " has ", theirs.substr(0, shown)));
    }
  }
  std::memcpy(&bucket->id, all[0].data() + all[0].size() - sizeof(nonce),
              sizeof(nonce));
  for (int r = 0; r < group->size(); ++r) {
    bucket->members.emplace(group->view.member_ids[r], Incarnation(*group, r));
  }
  bucket->buffer = absl::StrCat(bucket->key, "#", absl::Hex(bucket->id));
  std::shared_ptr<Bucket> replaced;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Bucket>& slot = buckets_[bucket->key];
    replaced = std::exchange(slot, bucket);
  }
  // The same bucket registered again: its process is gone or starts over.
  if (replaced != nullptr) Forget(*replaced);
  return MembershipOf(*group);
}

absl::Status DataPlane::Hold(Bucket& bucket, absl::Time deadline) {
  absl::MutexLock lock(&bucket.mu);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(bucket.mu) {
    return !bucket.busy;
  };
  if (!bucket.mu.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "bucket '", bucket.name.bucket,
        "' was still busy with an earlier call at the deadline; this call's "
        "gradient was not read"));
  }
  bucket.busy = true;
  return absl::OkStatus();
}

void DataPlane::Release(Bucket& bucket) {
  absl::MutexLock lock(&bucket.mu);
  bucket.busy = false;
}

void DataPlane::Forget(Bucket& bucket) {
  // Bounded: a call in flight ends by its own deadline.
  Hold(bucket, absl::InfiniteFuture()).IgnoreError();
  {
    absl::MutexLock lock(&bucket.mu);
    bucket.forgotten = true;  // calls that found it before see this
  }
  engine_.Drop(bucket.buffer);
  Release(bucket);
}

absl::Status DataPlane::Usable(Bucket& bucket,
                               const std::function<bool()>& cancelled) const {
  absl::MutexLock lock(&bucket.mu);
  if (bucket.forgotten) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket '", bucket.name.bucket, "' of job '", bucket.name.job,
        "' was unregistered or registered again"));
  }
  // The client gave up while this call waited: its memory is its own again.
  if (cancelled != nullptr && cancelled()) {
    return absl::CancelledError("the client gave up before the call started");
  }
  return absl::OkStatus();
}

absl::Status DataPlane::Unregister(const BucketName& name) {
  std::shared_ptr<Bucket> bucket;
  {
    absl::MutexLock lock(&mu_);
    auto it = buckets_.find(Key(name));
    if (it == buckets_.end()) {
      return absl::NotFoundError(absl::StrCat("bucket '", name.bucket,
                                              "' of job '", name.job,
                                              "' is not registered"));
    }
    bucket = std::move(it->second);
    buckets_.erase(it);
  }
  Forget(*bucket);
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<T> DataPlane::WithBucket(
    const BucketName& name, absl::Time deadline,
    const std::function<bool()>& cancelled,
    absl::FunctionRef<absl::StatusOr<T>(Bucket&)> body) {
  GM_ASSIGN_OR_RETURN(std::shared_ptr<Bucket> bucket, Find(name));
  GM_RETURN_IF_ERROR(Hold(*bucket, deadline));
  absl::Cleanup release = [&] { Release(*bucket); };
  GM_RETURN_IF_ERROR(Usable(*bucket, cancelled));
  return body(*bucket);
}

absl::Status DataPlane::SaveResidual(const BucketName& name,
                                     absl::Time deadline) {
  return WithBucket<bool>(
             name, deadline, nullptr,
             [&](Bucket& bucket) -> absl::StatusOr<bool> {
               float* out = bucket.segment.at<float>(bucket.layout.residual);
               engine_.ReadResidual(
                   bucket.buffer, [&](absl::Span<const float> residual) {
                     if (residual.empty()) {  // no step yet: zeros
                       std::fill(out, out + bucket.layout.n, 0.0f);
                     }
                     std::copy(residual.begin(), residual.end(), out);
                   });
               return true;
             })
      .status();
}

absl::Status DataPlane::LoadResidual(const BucketName& name,
                                     absl::Time deadline) {
  return WithBucket<bool>(
             name, deadline, nullptr,
             [&](Bucket& bucket) -> absl::StatusOr<bool> {
               const absl::Span<const float> residual(
                   bucket.segment.at<float>(bucket.layout.residual),
                   bucket.layout.n);
               for (size_t i = 0; i < residual.size(); ++i) {
                 if (!std::isfinite(residual[i])) {
                   return absl::InvalidArgumentError(
                       absl::StrCat("residual of bucket '", name.bucket,
                                    "' to load has a non-finite value at ", i,
                                    "; the worker's residual is unchanged"));
                 }
               }
               GM_RETURN_IF_ERROR(engine_.SetResidual(bucket.buffer, residual));
               return true;
             })
      .status();
}

// Every member's small payload, by rank (Bruck all-gather, ceil(log2 P)
// rounds), under its own operation id so that it never mixes with others.
absl::StatusOr<std::vector<std::string>> DataPlane::GatherSmall(
    const Group& group, uint64_t operation, std::string mine,
    absl::Time deadline, double* waited) {
  collectives::OpStats stats;
  const collectives::OpContext context{.transport = group.transport.get(),
                                       .epoch = group.view.epoch,
                                       .operation = operation,
                                       .deadline = deadline};
  collectives::StepRunner runner(context, &stats);
  auto all = collectives::AllGather(
      runner, 0, collectives::Group::World(group.size(), group.rank),
      std::move(mine), collectives::AllGatherKind::kBruck);
  if (waited != nullptr) *waited += stats.wait_seconds;
  Retire(group, operation);
  return all;
}

void DataPlane::Retire(const Group& group, uint64_t operation) {
  if (hooks_.retire) hooks_.retire(group.view.epoch, operation);
}

absl::StatusOr<std::shared_ptr<DataPlane::Bucket>> DataPlane::Find(
    const BucketName& name) const {
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(Key(name));
  if (it == buckets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket '", name.bucket, "' of job '", name.job,
                     "' is not registered with this worker"));
  }
  return it->second;
}

absl::Status DataPlane::Agree(const Group& group, const Bucket& bucket,
                              uint64_t op, const AgreeRecord& mine,
                              absl::Time deadline, double* waited) {
  std::string bytes(sizeof(mine), '\0');
  std::memcpy(bytes.data(), &mine, sizeof(mine));
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      GatherSmall(group, op, std::move(bytes), deadline, waited));
  std::vector<std::string> nonfinite;
  for (int r = 0; r < group.size(); ++r) {
    AgreeRecord theirs;
    if (all[r].size() != sizeof(theirs)) {
      return collectives::PeerError(
          absl::InvalidArgumentError("malformed agreement record"), r);
    }
    std::memcpy(&theirs, all[r].data(), sizeof(theirs));
    if (theirs.fingerprint != mine.fingerprint || theirs.root != mine.root) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket '", bucket.name.bucket, "' differs between workers: rank ",
          group.rank, " has ", mine.values, " values (root ", mine.root,
          "), rank ", r, " has ", theirs.values, " (root ", theirs.root,
          "): tensor names, sizes or the broadcast root differ"));
    }
    if (theirs.nonfinite > 0) {
      nonfinite.push_back(absl::StrCat("rank ", r, ": ", theirs.nonfinite));
    }
  }
  if (!nonfinite.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "non-finite values (NaN or Inf) in the gradient of bucket '",
        bucket.name.bucket, "' (", absl::StrJoin(nonfinite, ", "),
        "); the step is skipped on every worker and the finite values stay "
        "in the residuals"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReduceResult> DataPlane::AllReduce(const ReduceCall& call,
                                                  absl::Time deadline) {
  absl::StatusOr<ReduceResult> result = WithBucket<ReduceResult>(
      call.name, deadline, call.cancelled,
      [&](Bucket& bucket) { return Run(call, bucket, deadline); });
  if (!result.ok() && hooks_.metrics != nullptr) {
    hooks_.metrics->operations(absl::StatusCodeToString(result.status().code()))
        .Increment();
  }
  return result;
}

absl::StatusOr<ReduceResult> DataPlane::Run(const ReduceCall& call,
                                            Bucket& bucket,
                                            absl::Time deadline) {
  absl::Status refused;
  {
    absl::MutexLock lock(&bucket.mu);
    if (bucket.last_step.has_value() && call.step <= *bucket.last_step) {
      refused = absl::InvalidArgumentError(
          absl::StrCat("step ", call.step, " is not after step ",
                       *bucket.last_step, " of bucket '", call.name.bucket,
                       "'; the gradient is kept in the residual"));
    }
    // A step number is used once per registration, so that no operation id
    // is ever reused (a failed operation's id is retired).
    bucket.last_step = std::max(call.step, bucket.last_step.value_or(0));
  }
  absl::StatusOr<std::shared_ptr<Group>> group =
      refused.ok() ? views_->Acquire(call.step, deadline) : refused;
  if (group.ok()) group = RegisteredOn(bucket, *std::move(group));
  if (!group.ok()) {
    // Nothing is lost: the next step carries this gradient.
    engine_.Keep(bucket.buffer, bucket.values()).IgnoreError();
    return group.status();
  }
  // A step that failed because membership changed runs again on the new
  // view, from the residual, which holds its gradient now: every member
  // whose attempt failed does the same (an attempt is all or nothing), so
  // the survivors meet on the new view under the same step.
  std::vector<float> zeros;
  absl::Span<const float> gradient = bucket.values();
  while (true) {
    bool retriable = false;
    absl::StatusOr<ReduceResult> out =
        Attempt(call, bucket, **group, gradient, deadline, &retriable);
    if (out.ok() || !retriable) return out;
    const uint64_t failed = (*group)->view.epoch;
    const absl::Time wait =
        std::min(deadline, absl::Now() + options_.view_wait);
    if (!views_->AwaitNewer(failed, wait)) return out;
    group = views_->Acquire(call.step, deadline);
    if (!group.ok() || (*group)->view.epoch == failed) return out;
    // (The gradient is in the residual already.)
    if (group = RegisteredOn(bucket, *std::move(group)); !group.ok()) {
      return group.status();
    }
    if (hooks_.metrics != nullptr) hooks_.metrics->retries().Increment();
    zeros.assign(bucket.layout.n, 0.0f);
    gradient = zeros;
  }
}

uint64_t DataPlane::Renumber(const std::string& key, const Group& group,
                             uint64_t number) {
  absl::MutexLock lock(&mu_);
  auto [it, added] = numbering_.try_emplace(key);
  Numbering& n = it->second;
  // A new membership, or a new caller (its counters start over): this
  // number is 0.
  if (added || n.membership_epoch != group.view.membership_epoch ||
      number < n.base) {
    n = {.membership_epoch = group.view.membership_epoch, .base = number};
  }
  return number - n.base;
}

absl::StatusOr<std::shared_ptr<Group>> DataPlane::RegisteredOn(
    const Bucket& bucket, std::shared_ptr<Group> group) const {
  for (int r = 0; r < group->size(); ++r) {
    const std::string& id = group->view.member_ids[r];
    if (!bucket.members.contains(std::pair(id, Incarnation(*group, r)))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "member ", id, " (rank ", r, " of epoch ", group->view.epoch,
          ") joined or restarted after bucket '", bucket.name.bucket,
          "' was registered: register the bucket again on every process "
          "(then broadcast the parameters); this step's gradient is in the "
          "residual"));
    }
  }
  return group;
}

absl::StatusOr<ReduceResult> DataPlane::Attempt(
    const ReduceCall& call, Bucket& bucket, const Group& g,
    absl::Span<const float> gradient, absl::Time deadline, bool* retriable) {
  const uint64_t op = OperationId("allreduce", bucket.buffer, call.step);
  const uint64_t agree_op = OperationId("agree", bucket.buffer, call.step);
  AgreeRecord record{.fingerprint = bucket.fingerprint,
                     .values = bucket.layout.n};
  ReduceResult out{.epoch = g.view.epoch,
                   .rank = g.rank,
                   .world_size = g.size(),
                   .plan = g.view.plan,
                   .step = call.step,
                   .values = bucket.layout.n};
  bool refused_by_vote = false;
  engine::Request request{.buffer = bucket.buffer,
                          .gradient = gradient,
                          .operation = op,
                          .deadline = deadline,
                          .agree =
                              [&](uint64_t nonfinite) {
                                record.nonfinite = nonfinite;
                                // Its wait is the operation's (peers' skew
                                // lands there); its rounds and bytes are not
                                // the algorithm's and stay out of the stats.
                                return Agree(g, bucket, agree_op, record,
                                             deadline, &out.stats.wait_seconds);
                              },
                          .commit =
                              [&](const sparse::SparseBlock& result) {
                                return Commit(g, bucket, call, result, deadline,
                                              &refused_by_vote);
                              }};
  if (bucket.per_tensor_quota) request.tensor_starts = bucket.tensor_starts;
  if (call.return_residual) {
    request.residual_out = [&](absl::Span<const float> residual) {
      std::memcpy(bucket.segment.at<float>(bucket.layout.residual),
                  residual.data(), residual.size() * sizeof(float));
    };
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<sparse::SparseBlock> result =
      engine_.AllReduce(g.config(), request, &out.stats);
  out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Retire(g, op);
  if (!result.ok()) {
    const absl::Status& why = result.status();
    *retriable =
        (absl::IsAborted(why) || absl::IsUnavailable(why)) && !refused_by_vote;
    return absl::Status(why.code(),
                        absl::StrCat("step ", call.step, " of bucket '",
                                     call.name.bucket, "': ", why.message()));
  }
  // The client gave up after voting to apply the step (a narrow window):
  // its memory is its own again.
  if (call.cancelled != nullptr && call.cancelled()) {
    return absl::CancelledError(absl::StrCat(
        "step ", call.step, " of bucket '", call.name.bucket,
        "' was applied on every member, but this worker's client gave up "
        "just before its result was written: this replica missed it"));
  }
  WriteResult(call, bucket, *result, g.size());
  out.nonzeros = result->size();
  out.tensors = bucket.tensor_starts.size();
  out.tensors_missing = collectives::CountMissingTensors(
      bucket.tensor_starts, bucket.layout.n, *result);
  const collectives::AlgorithmEntry* entry =
      collectives::FindAlgorithm(out.plan.algorithm);
  Record(out, g,
         bucket.per_tensor_quota && entry != nullptr && entry->tensor_quotas);
  if (hooks_.on_success) hooks_.on_success(out);
  return out;
}

Outcome DataPlane::Decide(const OutcomeKey& key) {
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, bucket] : buckets_)
      known |= bucket->id == key.bucket_id;
  }
  return protocol_.Decide(key, known);
}

absl::Status DataPlane::Commit(const Group& g, const Bucket& bucket,
                               const ReduceCall& call,
                               const sparse::SparseBlock& result,
                               absl::Time deadline, bool* refused_by_vote) {
  // Yes, unless the client gave up.
  const bool yes = call.cancelled == nullptr || !call.cancelled();
  return protocol_.Vote(g, {bucket.id, call.step, g.view.epoch},
                        OperationId("commit", bucket.buffer, call.step), yes,
                        sparse::Digest(result), deadline, refused_by_vote);
}

void DataPlane::WriteResult(const ReduceCall& call, const Bucket& bucket,
                            const sparse::SparseBlock& result, int world_size) {
  const float divisor = call.mean ? static_cast<float>(world_size) : 1.0f;
  if (call.sparse) {
    std::memcpy(bucket.segment.at<uint32_t>(bucket.layout.indices),
                result.indices.data(), result.size() * sizeof(uint32_t));
    float* values = bucket.segment.at<float>(bucket.layout.sparse_values);
    for (size_t e = 0; e < result.size(); ++e) {
      values[e] = result.values[e] / divisor;
    }
    return;
  }
  absl::Span<float> values = bucket.values();
  std::fill(values.begin(), values.end(), 0.0f);
  for (size_t e = 0; e < result.size(); ++e) {
    values[result.indices[e]] = result.values[e] / divisor;
  }
}

void DataPlane::Record(const ReduceResult& result, const Group& group,
                       bool per_tensor_quota) {
  if (hooks_.metrics == nullptr) return;
  WorkerMetrics& m = *hooks_.metrics;
  const std::string fusion = per_tensor_quota ? "per_tensor" : "after_fusion";
  m.tensors_reduced(fusion).Increment(static_cast<double>(result.tensors));
  m.tensors_missing(fusion).Increment(
      static_cast<double>(result.tensors_missing));
  const collectives::OpStats& stats = result.stats;
  const std::string& algorithm = result.plan.algorithm;
  m.operations_ok().Increment();
  m.operation_seconds(algorithm).Observe(result.seconds);
  // The yardstick: the dense ring's cost formula for the same values.
  m.dense_ring_model_bytes().Increment(
      collectives::FindAlgorithm("dense")
          ->cost(group.size(), 1, result.values, 1.0)
          .model_bytes);
  m.topk_seconds(algorithm).Observe(stats.topk_seconds);
  {
    // Bytes per peer: what the group's transport counted since the last
    // record, so that buckets running at once are not counted twice.
    absl::MutexLock lock(&counted_mu_);
    if (counted_epoch_ != group.view.epoch) {
      counted_epoch_ = group.view.epoch;
      counted_ = transport::Counters{};
      counted_.bytes_sent_to.assign(group.size(), 0);
      counted_.bytes_received_from.assign(group.size(), 0);
    }
    const transport::Counters now = group.transport->counters();
    for (int p = 0; p < group.size(); ++p) {
      const std::string& peer = group.view.member_ids[p];
      m.bytes_sent(peer).Increment(static_cast<double>(
          now.bytes_sent_to[p] - counted_.bytes_sent_to[p]));
      m.bytes_received(peer).Increment(static_cast<double>(
          now.bytes_received_from[p] - counted_.bytes_received_from[p]));
    }
    counted_ = now;
  }
  for (const char* phase : {"srs", "sag"}) {
    const int64_t v = stats.detail(absl::StrCat(phase, "_nonzeros"));
    if (v >= 0) m.nonzeros(phase).Set(static_cast<double>(v));
  }
  m.nonzeros("result").Set(static_cast<double>(stats.result_nonzeros));
  if (stats.detail("bsag_h") >= 0) {
    m.bsag_h().Set(static_cast<double>(stats.detail("bsag_h")));
  }
  m.teams().Set(result.plan.teams);
  m.rank().Set(group.rank);
  m.world_size().Set(group.size());
}

absl::StatusOr<Membership> DataPlane::Broadcast(const BucketName& name,
                                                uint64_t sequence, int root,
                                                absl::Time deadline) {
  if (name.bucket.empty()) {  // a barrier
    GM_RETURN_IF_ERROR(CheckName("job", name.job, false));
    GM_ASSIGN_OR_RETURN(std::shared_ptr<Group> group,
                        views_->Acquire(std::nullopt, deadline));
    const uint64_t op = OperationId(
        "barrier", MembershipScope(name.job, *group),
        Renumber(absl::StrCat(name.job, "#sequence"), *group, sequence));
    GM_RETURN_IF_ERROR(GatherSmall(*group, op, "", deadline).status());
    return MembershipOf(*group);
  }
  return WithBucket<Membership>(name, deadline, nullptr, [&](Bucket& bucket) {
    return BroadcastHeld(bucket, sequence, root, deadline);
  });
}

absl::StatusOr<Membership> DataPlane::BroadcastHeld(Bucket& bucket,
                                                    uint64_t sequence, int root,
                                                    absl::Time deadline) {
  GM_ASSIGN_OR_RETURN(std::shared_ptr<Group> group,
                      views_->Acquire(std::nullopt, deadline));
  GM_ASSIGN_OR_RETURN(group, RegisteredOn(bucket, std::move(group)));
  if (root < 0 || root >= group->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "broadcast root ", root, " is not a rank of ", group->size()));
  }
  const std::string scope = MembershipScope(bucket.buffer, *group);
  const uint64_t number =
      Renumber(absl::StrCat(bucket.name.job, "#sequence"), *group, sequence);
  GM_RETURN_IF_ERROR(Agree(*group, bucket,
                           OperationId("broadcast-agree", scope, number),
                           {.fingerprint = bucket.fingerprint,
                            .values = bucket.layout.n,
                            .root = root},
                           deadline));
  // Flat: the root sends its values to every member directly.
  const uint64_t op = OperationId("broadcast", scope, number);
  collectives::OpStats stats;
  const collectives::OpContext context{.transport = group->transport.get(),
                                       .epoch = group->view.epoch,
                                       .operation = op,
                                       .deadline = deadline};
  collectives::StepRunner runner(context, &stats);
  absl::Span<float> values = bucket.values();
  const absl::string_view bytes(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float));
  absl::Status status;
  if (group->rank == root) {
    for (int p = 0; p < group->size() && status.ok(); ++p) {
      if (p != root) status = runner.Send(0, p, {std::string(bytes)});
    }
  } else {
    auto received = runner.Receive(0, root, 1);
    status = received.status();
    if (status.ok() && (*received)[0].size() != bytes.size()) {
      status = collectives::PeerError(
          absl::InvalidArgumentError("broadcast of another size"), root);
    }
    if (status.ok()) {
      std::memcpy(values.data(), (*received)[0].data(), bytes.size());
    }
  }
  Retire(*group, op);
  GM_RETURN_IF_ERROR(status);
  return MembershipOf(*group);
}

std::vector<std::pair<std::string, double>> DataPlane::ResidualNorms() const {
  std::vector<std::pair<std::string, std::string>> keys;  // key, buffer
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, bucket] : buckets_) {
      keys.emplace_back(key, bucket->buffer);
    }
  }
  std::vector<std::pair<std::string, double>> norms;
  for (const auto& [key, buffer] : keys) {
    double norm = 0;
    const bool read = engine_.ReadResidual(
        buffer,
        [&](absl::Span<const float> residual) {
          for (float v : residual) norm += double{v} * v;
        },
        /*if_idle=*/true);
    norms.emplace_back(key, read ? std::sqrt(norm) : -1.0);
  }
  return norms;
}

}  // namespace gradmesh::daemon

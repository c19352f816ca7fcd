#include "worker/daemon/data_plane.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"
#include "worker/daemon/data_plane_internal.h"
#include "worker/daemon/worker_metrics.h"

namespace gradmesh::daemon {

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
      recorder_(hooks_.metrics),
      protocol_({.gather =
                     [this](const Group& g, uint64_t op, std::string mine,
                            absl::Time deadline, double* waited) {
                       return GatherSmall(g, op, std::move(mine), deadline,
                                          /*same_size=*/false, waited);
                     },
                 .ask_outcome = hooks_.ask_outcome,
                 .current = [views] { return views->current(); }},
                views->clock(), hooks_.metrics,
                {.view_wait = options.view_wait,
                 .outcome_retention = options.outcome_retention}) {}

absl::StatusOr<Membership> DataPlane::Register(
    const BucketName& name, const std::vector<TensorSpec>& tensors,
    const std::string& shm_name, uint64_t index, absl::Time deadline,
    const BucketOptions& options, const BucketClient& client) {
  GM_ASSIGN_OR_RETURN(std::shared_ptr<Bucket> bucket,
                      OpenBucket(name, tensors, shm_name, options));
  bucket->client_id = client.id;
  bucket->client_locks_segment = client.locks_segment;
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

void DataPlane::Forget(Bucket& bucket) {
  // Bounded: a call in flight ends by its own deadline.
  Hold(bucket, absl::InfiniteFuture()).IgnoreError();
  ForgetHeld(bucket);
}

void DataPlane::ForgetHeld(Bucket& bucket) {
  {
    absl::MutexLock lock(&bucket.mu);
    bucket.forgotten = true;  // calls that found it before see this
  }
  engine_.Drop(bucket.buffer);
  Release(bucket);
}

bool DataPlane::RemoveLocked(const Bucket& bucket) {
  auto it = buckets_.find(bucket.key);
  if (it == buckets_.end() || it->second.get() != &bucket) return false;
  buckets_.erase(it);
  // A job with no bucket left here has no replica left to be behind.
  const bool last = std::none_of(
      buckets_.begin(), buckets_.end(),
      [&](const auto& b) { return b.second->name.job == bucket.name.job; });
  if (last) missed_.erase(bucket.name.job);
  return true;
}

absl::Status DataPlane::Unregister(const BucketName& name,
                                   absl::string_view shm_name) {
  std::shared_ptr<Bucket> bucket;
  {
    absl::MutexLock lock(&mu_);
    auto it = buckets_.find(BucketKey(name));
    if (it == buckets_.end()) {
      return absl::NotFoundError(absl::StrCat("bucket '", name.bucket,
                                              "' of job '", name.job,
                                              "' is not registered"));
    }
    // An older registration's end (its TensorSet freed late).
    if (!shm_name.empty() && it->second->shm_name != shm_name) {
      return absl::OkStatus();
    }
    bucket = it->second;
    RemoveLocked(*bucket);
  }
  Forget(*bucket);
  return absl::OkStatus();
}

// Every member's small payload, by rank, under its own operation id.
absl::StatusOr<std::vector<std::string>> DataPlane::GatherSmall(
    const Group& group, uint64_t operation, std::string mine,
    absl::Time deadline, bool same_size, double* waited) {
  return engine::GatherSmall(PlaceOf(group), operation, std::move(mine),
                             deadline, same_size, waited);
}

absl::StatusOr<std::shared_ptr<Bucket>> DataPlane::Find(
    const BucketName& name) const {
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(BucketKey(name));
  if (it == buckets_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket '", name.bucket, "' of job '", name.job,
                     "' is not registered with this worker"));
  }
  return it->second;
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

Outcome DataPlane::Decide(const OutcomeKey& key,
                          const std::vector<std::string>& gone) {
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, bucket] : buckets_)
      known |= bucket->id == key.bucket_id;
  }
  return protocol_.Decide(key, known, gone);
}

absl::Status DataPlane::Commit(const Group& g, const Bucket& bucket,
                               const ReduceCall& call,
                               const sparse::SparseBlock& result,
                               absl::Time deadline, bool* refused_by_vote) {
  // Yes, unless the client gave up.
  const bool yes = call.cancelled == nullptr || !call.cancelled();
  absl::Status vote =
      protocol_.Vote(g, {bucket.id, call.step, g.view.epoch},
                     OperationId("commit", bucket.buffer, call.step), yes,
                     sparse::Digest(result), deadline, refused_by_vote);
  // The others may have applied it: this replica may be behind.
  if (absl::IsDataLoss(vote)) MarkMissed(bucket, call.step);
  return vote;
}

}  // namespace gradmesh::daemon

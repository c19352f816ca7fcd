// The data plane's view of whether this worker's trainer takes part: peers
// that started a step this worker's client has not (see DataPlane::Absent),
// a client gone without a word (ForgetAbandoned), a new client in place of
// the one before (TakenOver).

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/steady_clock.h"
#include "worker/daemon/data_plane_internal.h"

namespace gradmesh::daemon {

std::optional<std::string> DataPlane::Absent(
    absl::Duration join_timeout) const {
  std::vector<std::shared_ptr<Group>> groups = views_->groups();
  std::erase_if(groups, [](const std::shared_ptr<Group>& g) {
    return g->rank < 0 || g->transport == nullptr;
  });
  if (groups.empty()) return std::nullopt;
  if (std::optional<std::string> why = OrphanStarted(groups)) return why;
  std::vector<std::shared_ptr<Bucket>> buckets;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, bucket] : buckets_) buckets.push_back(bucket);
  }
  const absl::Time now = SteadyNow();
  for (const std::shared_ptr<Bucket>& bucket : buckets) {
    uint64_t last;
    bool refused;
    {
      absl::MutexLock lock(&bucket->mu);
      if (bucket->busy || bucket->forgotten || !bucket->last_step) continue;
      last = *bucket->last_step;
      refused = bucket->last_step_refused;
    }
    // The next step, and the last one when this worker refused it.
    const uint64_t watched[] = {last + 1, last};
    for (uint64_t step : absl::MakeConstSpan(watched, refused ? 2 : 1)) {
      const uint64_t agree = AgreeOperation(*bucket, step);
      // Peers run the step on whichever group it falls in.
      for (const std::shared_ptr<Group>& group : groups) {
        const std::optional<absl::Time> since =
            group->transport->UnclaimedSince(group->view.epoch, agree);
        if (!since.has_value() || now - *since < join_timeout) continue;
        return absl::StrFormat(
            "its peers started step %d of bucket '%s' (job '%s') %.1f s "
            "before, and %s (--step_join_timeout_s=%g)",
            step, bucket->name.bucket, bucket->name.job,
            absl::ToDoubleSeconds(now - *since),
            step > last ? "its trainer had not" : "this worker had refused it",
            absl::ToDoubleSeconds(join_timeout));
      }
    }
  }
  return std::nullopt;
}

std::vector<BucketName> DataPlane::ForgetAbandoned() {
  std::vector<std::shared_ptr<Bucket>> found;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, bucket] : buckets_) {
      if (bucket->client_locks_segment) found.push_back(bucket);
    }
  }
  std::erase_if(found, [](const std::shared_ptr<Bucket>& bucket) {
    return !bucket->segment.Abandoned();
  });
  std::vector<BucketName> forgotten;
  for (const std::shared_ptr<Bucket>& bucket : found) {
    // Not while a call runs on it: it ends by its deadline.
    if (!Hold(*bucket, absl::InfinitePast()).ok()) continue;
    std::optional<uint64_t> last;
    bool refused;
    {
      absl::MutexLock lock(&bucket->mu);
      last = bucket->last_step;
      refused = bucket->last_step_refused;
    }
    bool removed;
    {
      absl::MutexLock lock(&mu_);
      removed = RemoveLocked(*bucket);
      if (removed && last.has_value()) {
        if (orphans_.size() >= kMaxOrphans) orphans_.erase(orphans_.begin());
        Orphan& orphan = orphans_.emplace_back(
            Orphan{.name = bucket->name,
                   .client_id = bucket->client_id,
                   .step = *last + 1,
                   .agree = {AgreeOperation(*bucket, *last + 1)}});
        if (refused) orphan.agree.push_back(AgreeOperation(*bucket, *last));
      }
    }
    if (!removed) {  // registered again since
      Release(*bucket);
      continue;
    }
    ForgetHeld(*bucket);
    forgotten.push_back(bucket->name);
  }
  return forgotten;
}

std::optional<std::string> DataPlane::OrphanStarted(
    const std::vector<std::shared_ptr<Group>>& groups) const {
  absl::MutexLock lock(&mu_);
  for (const Orphan& orphan : orphans_) {
    for (const std::shared_ptr<Group>& group : groups) {
      if (std::none_of(orphan.agree.begin(), orphan.agree.end(),
                       [&](uint64_t agree) {
                         return group->transport
                             ->UnclaimedSince(group->view.epoch, agree)
                             .has_value();
                       })) {
        continue;
      }
      return absl::StrFormat(
          "its peers started step %d of bucket '%s' (job '%s'), whose "
          "trainer had exited without unregistering it",
          orphan.step, orphan.name.bucket, orphan.name.job);
    }
  }
  return std::nullopt;
}

std::vector<std::shared_ptr<Bucket>> DataPlane::SteppedBuckets(
    absl::string_view job, absl::string_view client_id, bool theirs) const {
  std::vector<std::shared_ptr<Bucket>> found;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, bucket] : buckets_) {
      if (bucket->name.job == job && !bucket->client_id.empty() &&
          (bucket->client_id == client_id) == theirs) {
        found.push_back(bucket);
      }
    }
  }
  std::erase_if(found, [](const std::shared_ptr<Bucket>& bucket) {
    absl::MutexLock lock(&bucket->mu);
    return !bucket->last_step.has_value();
  });
  return found;
}

bool DataPlane::TakenOver(const BucketName& name,
                          const std::string& client_id) const {
  if (client_id.empty()) return false;
  {
    absl::MutexLock lock(&mu_);
    for (const Orphan& orphan : orphans_) {
      if (orphan.name.job == name.job && orphan.client_id != client_id) {
        return true;
      }
    }
  }
  const std::shared_ptr<Group> group = views_->current();
  if (group == nullptr || group->rank < 0) return false;
  for (const std::shared_ptr<Bucket>& bucket :
       SteppedBuckets(name.job, client_id, /*theirs=*/false)) {
    if (RegisteredOn(*bucket, group).ok()) return true;
  }
  return false;
}

bool DataPlane::Stepped(const BucketName& name,
                        const std::string& client_id) const {
  return !client_id.empty() &&
         !SteppedBuckets(name.job, client_id, /*theirs=*/true).empty();
}

void DataPlane::UnregisterOthers(const BucketName& name,
                                 const std::string& client_id) {
  std::vector<std::shared_ptr<Bucket>> others;
  {
    absl::MutexLock lock(&mu_);
    std::erase_if(orphans_, [&](const Orphan& o) {
      return o.name.job == name.job && o.client_id != client_id;
    });
    for (const auto& [key, bucket] : buckets_) {
      if (bucket->name.job == name.job && bucket->client_id != client_id) {
        others.push_back(bucket);
      }
    }
  }
  for (const std::shared_ptr<Bucket>& bucket : others) {
    Unregister(bucket->name, bucket->shm_name).IgnoreError();  // raced: gone
  }
}

}  // namespace gradmesh::daemon

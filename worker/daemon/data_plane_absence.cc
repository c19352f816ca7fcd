// The data plane's view of whether this worker's trainer takes part: peers
// that started a step this worker's client has not (see DataPlane::Absent).

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
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
  std::vector<std::shared_ptr<Bucket>> buckets;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, bucket] : buckets_) buckets.push_back(bucket);
  }
  const absl::Time now = SteadyNow();
  for (const std::shared_ptr<Bucket>& bucket : buckets) {
    uint64_t next;
    {
      absl::MutexLock lock(&bucket->mu);
      if (bucket->busy || bucket->forgotten || !bucket->last_step) continue;
      next = *bucket->last_step + 1;
    }
    const uint64_t agree = OperationId("agree", bucket->buffer, next);
    // Peers run the step on whichever group it falls in.
    for (const std::shared_ptr<Group>& group : groups) {
      const std::optional<absl::Time> since =
          group->transport->UnclaimedSince(group->view.epoch, agree);
      if (!since.has_value() || now - *since < join_timeout) continue;
      return absl::StrFormat(
          "its peers started step %d of bucket '%s' (job '%s') %.1f s "
          "before, and its trainer had not (--step_join_timeout_s=%g)",
          next, bucket->name.bucket, bucket->name.job,
          absl::ToDoubleSeconds(now - *since),
          absl::ToDoubleSeconds(join_timeout));
    }
  }
  return std::nullopt;
}

bool DataPlane::TakenOver(const BucketName& name,
                          const std::string& client_id) const {
  if (client_id.empty()) return false;
  std::vector<std::shared_ptr<Bucket>> others;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, bucket] : buckets_) {
      if (bucket->name.job == name.job && !bucket->client_id.empty() &&
          bucket->client_id != client_id) {
        others.push_back(bucket);
      }
    }
  }
  const std::shared_ptr<Group> group = views_->current();
  if (group == nullptr || group->rank < 0) return false;
  for (const std::shared_ptr<Bucket>& bucket : others) {
    {
      absl::MutexLock lock(&bucket->mu);
      if (!bucket->last_step.has_value()) continue;
    }
    if (RegisteredOn(*bucket, group).ok()) return true;
  }
  return false;
}

}  // namespace gradmesh::daemon

// The data plane's broadcast of a bucket's values, and the barrier.

#include <optional>

#include "worker/daemon/data_plane_internal.h"

namespace gradmesh::daemon {

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
  GM_RETURN_IF_ERROR(protocol_.Agree(
      *group, bucket.name.bucket, OperationId("broadcast-agree", scope, number),
      {.fingerprint = bucket.fingerprint,
       .values = bucket.layout.n,
       .root = root,
       .missed = MissedMark(bucket)},
      deadline));
  // Flat: the root sends its values to every member directly.
  const uint64_t op = OperationId("broadcast", scope, number);
  GM_RETURN_IF_ERROR(engine::BroadcastValues(PlaceOf(*group), op, root,
                                             bucket.values(), deadline));
  MarkWhole(bucket);  // the parameters are the root's again
  return MembershipOf(*group);
}

}  // namespace gradmesh::daemon

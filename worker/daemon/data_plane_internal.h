// Shared by the data plane's files (data_plane*.cc), not part of its
// interface.
#ifndef GRADMESH_WORKER_DAEMON_DATA_PLANE_INTERNAL_H_
#define GRADMESH_WORKER_DAEMON_DATA_PLANE_INTERNAL_H_

#include <memory>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/daemon/data_plane.h"
#include "worker/engine/group_ops.h"

namespace gradmesh::daemon {

// Member `rank`'s incarnation in `group`'s view (0 where views carry none).
inline uint64_t Incarnation(const Group& group, int rank) {
  const auto& all = group.view.incarnations;
  return rank < static_cast<int>(all.size()) ? all[rank] : 0;
}

// An operation-id scope under `group`'s membership.
inline std::string MembershipScope(absl::string_view scope,
                                   const Group& group) {
  return absl::StrCat(scope, "/", group.view.membership_epoch);
}

// The operation id of step `step`'s agreement on `bucket`: the first thing
// peers send for a step (DataPlane::Absent watches for it).
inline uint64_t AgreeOperation(const Bucket& bucket, uint64_t step) {
  return OperationId("agree", bucket.buffer, step);
}

inline engine::GroupPlace PlaceOf(const Group& group) {
  return {.transport = group.transport.get(),
          .epoch = group.view.epoch,
          .rank = group.rank,
          .size = group.size()};
}

inline Membership MembershipOf(const Group& group) {
  return {.epoch = group.view.epoch,
          .rank = group.rank,
          .world_size = group.size()};
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

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_DATA_PLANE_INTERNAL_H_

#include "worker/engine/group_ops.h"

#include <cstring>
#include <utility>

#include "common/status_macros.h"
#include "worker/collectives/primitives.h"
#include "worker/collectives/schedule.h"

namespace gradmesh::engine {
namespace {

collectives::OpContext ContextOf(const GroupPlace& place, uint64_t operation,
                                 absl::Time deadline) {
  return {.transport = place.transport,
          .epoch = place.epoch,
          .operation = operation,
          .deadline = deadline};
}

}  // namespace

absl::StatusOr<std::vector<std::string>> GatherSmall(
    const GroupPlace& place, uint64_t operation, std::string mine,
    absl::Time deadline, bool same_size, double* waited) {
  const transport::OperationScope scope(place.transport, place.epoch,
                                        operation);
  collectives::OpStats stats;
  const collectives::OpContext context = ContextOf(place, operation, deadline);
  collectives::StepRunner runner(context, &stats);
  const size_t size = mine.size();
  auto all = collectives::AllGather(
      runner, collectives::PhaseStep(0),
      collectives::Group::World(place.size, place.rank), std::move(mine),
      collectives::AllGatherKind::kBruck);
  if (waited != nullptr) *waited += stats.wait_seconds;
  if (!all.ok() || !same_size) return all;
  for (int r = 0; r < place.size; ++r) {
    if ((*all)[r].size() != size) {
      return collectives::PeerError(
          absl::InvalidArgumentError("malformed record"), r);
    }
  }
  return all;
}

absl::Status BroadcastValues(const GroupPlace& place, uint64_t operation,
                             int root, absl::Span<float> values,
                             absl::Time deadline) {
  const transport::OperationScope scope(place.transport, place.epoch,
                                        operation);
  collectives::OpStats stats;
  const collectives::OpContext context = ContextOf(place, operation, deadline);
  collectives::StepRunner runner(context, &stats);
  const absl::string_view bytes(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float));
  if (place.rank == root) {
    for (int p = 0; p < place.size; ++p) {
      if (p != root)
        GM_RETURN_IF_ERROR(runner.Send(0, p, {std::string(bytes)}));
    }
    return absl::OkStatus();
  }
  GM_ASSIGN_OR_RETURN(std::vector<std::string> received,
                      runner.Receive(0, root, 1));
  if (received[0].size() != bytes.size()) {
    return collectives::PeerError(
        absl::InvalidArgumentError("broadcast of another size"), root);
  }
  std::memcpy(values.data(), received[0].data(), bytes.size());
  return absl::OkStatus();
}

}  // namespace gradmesh::engine

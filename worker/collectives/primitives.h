// Building blocks shared by the algorithms: all-gathers over a group of
// ranks, with one opaque payload per member.
//
// Payloads of different members travel as separate messages (they may cover
// the same index range), in position order within a step, so byte counts are
// exactly the payload sizes.
#ifndef GRADMESH_WORKER_COLLECTIVES_PRIMITIVES_H_
#define GRADMESH_WORKER_COLLECTIVES_PRIMITIVES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/collectives/collective.h"
#include "worker/collectives/wire.h"

namespace gradmesh::collectives {

// The ranks of a sub-collective, in position order, and this worker's
// position among them.
struct Group {
  std::vector<int> ranks;
  int position = 0;

  int size() const { return static_cast<int>(ranks.size()); }
  // All `world_size` ranks, this worker at `rank`.
  static Group World(int world_size, int rank);
};

enum class AllGatherKind {
  kBruck,              // any group size, ceil(log2 p) rounds
  kRecursiveDoubling,  // power-of-two sizes only, log2 p rounds
};

// Gathers every member's payload to every member; returns them by position.
// Uses tag steps step_base .. step_base + ceil(log2 p) - 1.
absl::StatusOr<std::vector<std::string>> AllGather(StepRunner& runner,
                                                   uint32_t step_base,
                                                   const Group& group,
                                                   std::string mine,
                                                   AllGatherKind kind);

// Recursive doubling where the group size is a power of two, Bruck
// otherwise: the sparse all-gather of SparCML's TopkA.
AllGatherKind PreferredAllGather(int group_size);

// The split of SparCML's DSAR and Ok-Topk: `block` (sorted) is cut by
// `regions` (one per rank, in rank order) and rank r's part goes to rank r
// directly, with destination rotation (step s: to w + s, from w - s),
// P - 1 rounds under tag steps step_base .. step_base + P - 2. Returns the
// parts of this worker's region by source rank, its own included.
absl::StatusOr<std::vector<sparse::SparseBlock>> SplitExchange(
    StepRunner& runner, uint32_t step_base, const BlockCodec& codec,
    const Group& world, const sparse::SparseBlock& block,
    absl::Span<const sparse::IndexRange> regions);

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_PRIMITIVES_H_

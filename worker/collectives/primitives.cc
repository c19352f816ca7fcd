#include "worker/collectives/primitives.h"

#include "common/status_macros.h"
#include "worker/collectives/schedule.h"

namespace gradmesh::collectives {

Group Group::World(int world_size, int rank) {
  Group group;
  for (int r = 0; r < world_size; ++r) group.ranks.push_back(r);
  group.position = rank;
  return group;
}

AllGatherKind PreferredAllGather(int group_size) {
  return IsPowerOfTwo(group_size) ? AllGatherKind::kRecursiveDoubling
                                  : AllGatherKind::kBruck;
}

absl::StatusOr<std::vector<std::string>> AllGather(StepRunner& runner,
                                                   uint32_t step_base,
                                                   const Group& group,
                                                   std::string mine,
                                                   AllGatherKind kind) {
  const int p = group.size();
  const int w = group.position;
  std::vector<std::string> payloads(p);
  payloads[w] = std::move(mine);
  if (kind == AllGatherKind::kRecursiveDoubling) {
    GM_CHECK(IsPowerOfTwo(p)) << p;
    const std::vector<int> partners = PlanRecursiveDoubling(p, w);
    for (size_t t = 0; t < partners.size(); ++t) {
      // Before step t each member holds the aligned run of 2^t positions
      // around it; the partner holds the neighbouring run.
      const int width = 1 << t;
      const int own_first = w & ~(width - 1);
      const int peer_first = partners[t] & ~(width - 1);
      std::vector<std::string> outgoing(payloads.begin() + own_first,
                                        payloads.begin() + own_first + width);
      const int peer = group.ranks[partners[t]];
      GM_ASSIGN_OR_RETURN(std::vector<std::string> received,
                          runner.Exchange(step_base + t, peer,
                                          std::move(outgoing), peer, width));
      for (int i = 0; i < width; ++i) {
        payloads[peer_first + i] = std::move(received[i]);
      }
    }
    return payloads;
  }
  const std::vector<Step> steps = PlanBruckAllGather(p, w);
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& step = steps[s];
    std::vector<std::string> outgoing;
    for (int i = 0; i < step.send.count; ++i) {
      outgoing.push_back(payloads[(step.send.first + i) % p]);
    }
    GM_ASSIGN_OR_RETURN(
        std::vector<std::string> received,
        runner.Exchange(step_base + s, group.ranks[step.send_to],
                        std::move(outgoing), group.ranks[step.recv_from],
                        step.recv.count));
    for (int i = 0; i < step.recv.count; ++i) {
      payloads[(step.recv.first + i) % p] = std::move(received[i]);
    }
  }
  return payloads;
}

absl::StatusOr<std::vector<sparse::SparseBlock>> SplitExchange(
    StepRunner& runner, uint32_t step_base, const BlockCodec& codec,
    const Group& world, const sparse::SparseBlock& block,
    absl::Span<const sparse::IndexRange> regions) {
  const int p = world.size();
  const int w = world.position;
  GM_CHECK(static_cast<int>(regions.size()) == p);
  std::vector<sparse::SparseBlock> parts(p);
  parts[w] = sparse::Slice(block, regions[w]);
  const std::vector<Step> steps = PlanRotation(p, w);
  for (size_t s = 0; s < steps.size(); ++s) {
    const int to = steps[s].send_to;
    const int from = steps[s].recv_from;
    GM_ASSIGN_OR_RETURN(
        std::string bytes,
        runner.Exchange(
            step_base + s, world.ranks[to],
            codec.Encode(sparse::Slice(block, regions[to]), regions[to]),
            world.ranks[from]));
    auto part = codec.Decode(bytes, regions[w], runner.stats());
    if (!part.ok()) return PeerError(part.status(), world.ranks[from]);
    parts[from] = *std::move(part);
  }
  return parts;
}

}  // namespace gradmesh::collectives

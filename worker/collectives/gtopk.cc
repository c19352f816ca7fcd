#include "worker/collectives/gtopk.h"

#include <vector>

#include "common/status_macros.h"
#include "worker/collectives/schedule.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/coo.h"

namespace gradmesh::collectives {
namespace {

constexpr int kReducePhase = 0;
constexpr int kBroadcastPhase = 1;

// One block over [0, n) from `peer` under `tag`.
absl::StatusOr<sparse::SparseBlock> ReceiveBlock(StepRunner& runner,
                                                 const BlockCodec& codec,
                                                 uint32_t tag, int peer,
                                                 uint64_t n) {
  GM_ASSIGN_OR_RETURN(std::vector<std::string> bytes,
                      runner.Receive(tag, peer, 1));
  auto received =
      codec.Decode(bytes[0], sparse::IndexRange{0, n}, runner.stats());
  if (!received.ok()) return PeerError(received.status(), peer);
  return received;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GTopk>> GTopk::Create(int world_size, int rank,
                                                     uint64_t n, double density,
                                                     const WireFormat& wire) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, density));
  return std::unique_ptr<GTopk>(
      new GTopk(world_size, rank, n, SelectionSize(n, density), wire));
}

absl::StatusOr<uint64_t> GTopk::Accumulate(absl::Span<const float> gradient,
                                           absl::Span<float> residual,
                                           OpStats* stats) {
  return AccumulateChecked("gTopk", n_, gradient, residual, stats);
}

absl::StatusOr<Proposal> GTopk::Reduce(absl::Span<const float> accumulator,
                                       const OpContext& context,
                                       OpStats* stats) {
  sparse::SparseBlock selected = TimedTopKAbs(topk(), accumulator, k_, stats);
  sparse::SparseBlock local_loss = codec_.Round(&selected);
  StepRunner runner(context, stats);
  const sparse::IndexRange all{0, n_};

  // Reduce up the binomial tree, keeping what re-selection drops.
  sparse::SparseBlock current = selected;
  std::vector<sparse::SparseBlock> discarded;
  for (const TreeStep& step : PlanTreeReduce(world_size_, rank_)) {
    const uint32_t tag = PhaseStep(kReducePhase, step.level);
    if (step.send) {
      GM_RETURN_IF_ERROR(
          runner.Send(tag, step.peer, {codec_.Encode(current, all)}));
      continue;
    }
    GM_ASSIGN_OR_RETURN(const sparse::SparseBlock received,
                        ReceiveBlock(runner, codec_, tag, step.peer, n_));
    const sparse::SparseBlock sum = sparse::Add(current, received);
    discarded.emplace_back();
    topk().SplitTopKAbs(sum, k_, &current, &discarded.back());
    // Rounding for the wire: what it takes off or drops stays here too.
    sparse::SparseBlock loss = codec_.Round(&current, &discarded.back());
    discarded.push_back(std::move(loss));
  }

  // Broadcast the root's block down the same tree.
  for (const TreeStep& step : PlanTreeBroadcast(world_size_, rank_)) {
    const uint32_t tag = PhaseStep(kBroadcastPhase, step.level);
    if (step.send) {
      GM_RETURN_IF_ERROR(
          runner.Send(tag, step.peer, {codec_.Encode(current, all)}));
      continue;
    }
    GM_ASSIGN_OR_RETURN(current,
                        ReceiveBlock(runner, codec_, tag, step.peer, n_));
  }

  stats->result_nonzeros = current.size();
  return Proposal{
      .result = std::move(current),
      .apply = [selected = std::move(selected),
                local_loss = std::move(local_loss),
                discarded = std::move(discarded)](const sparse::SparseBlock&,
                                                  absl::Span<float> residual) {
        LeaveSelected(selected, local_loss, residual);
        for (const sparse::SparseBlock& d : discarded) {
          sparse::ScatterAdd(d, residual);
        }
      }};
}

}  // namespace gradmesh::collectives

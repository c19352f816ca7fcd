#include "worker/collectives/gtopk.h"

#include <vector>

#include "common/status_macros.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/coo.h"

namespace gradmesh::collectives {
namespace {

constexpr uint32_t kReduceStep = 0;
constexpr uint32_t kBroadcastStep = 1u << 12;

}  // namespace

absl::StatusOr<std::unique_ptr<GTopk>> GTopk::Create(int world_size, int rank,
                                                     uint64_t n, double density,
                                                     const WireFormat& wire) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, density));
  return std::unique_ptr<GTopk>(
      new GTopk(world_size, rank, n, SelectionSize(n, density), wire));
}

absl::StatusOr<sparse::SparseBlock> GTopk::AllReduce(
    absl::Span<const float> gradient, absl::Span<float> residual,
    const OpContext& context, OpStats* stats) {
  GM_RETURN_IF_ERROR(
      BeginAllReduce("gTopk", n_, gradient, residual, context, stats));
  sparse::SparseBlock selected = TimedTopKAbs(residual, k_, stats);
  const sparse::SparseBlock local_loss = codec_.Round(&selected);
  StepRunner runner(context, stats);
  const sparse::IndexRange all{0, n_};
  const int w = rank_;
  int levels = 0;
  while ((1 << levels) < world_size_) ++levels;

  // Reduce up the binomial tree, keeping what re-selection drops.
  sparse::SparseBlock current = selected;
  std::vector<sparse::SparseBlock> discarded;
  for (int t = 0; t < levels; ++t) {
    const int bit = 1 << t;
    if (w % (2 * bit) == bit) {
      GM_RETURN_IF_ERROR(
          runner.Send(kReduceStep + t, w - bit, {codec_.Encode(current, all)}));
      break;
    }
    if (w + bit >= world_size_) continue;
    GM_ASSIGN_OR_RETURN(std::vector<std::string> bytes,
                        runner.Receive(kReduceStep + t, w + bit, 1));
    auto received = codec_.Decode(bytes[0], all, stats);
    if (!received.ok()) return PeerError(received.status(), w + bit);
    const sparse::SparseBlock sum = sparse::Add(current, *received);
    discarded.emplace_back();
    kernels::SplitTopKAbs(sum, k_, &current, &discarded.back());
    // Rounding for the wire: what it takes off or drops stays here too.
    sparse::SparseBlock loss = codec_.Round(&current, &discarded.back());
    discarded.push_back(std::move(loss));
  }

  // Broadcast the root's block down the same tree.
  for (int t = levels - 1; t >= 0; --t) {
    const int bit = 1 << t;
    if (w % (2 * bit) == 0) {
      if (w + bit < world_size_) {
        GM_RETURN_IF_ERROR(runner.Send(kBroadcastStep + t, w + bit,
                                       {codec_.Encode(current, all)}));
      }
    } else if (w % (2 * bit) == bit) {
      GM_ASSIGN_OR_RETURN(std::vector<std::string> bytes,
                          runner.Receive(kBroadcastStep + t, w - bit, 1));
      auto received = codec_.Decode(bytes[0], all, stats);
      if (!received.ok()) return PeerError(received.status(), w - bit);
      current = *std::move(received);
    }
  }

  GM_RETURN_IF_ERROR(Commit(context, current));
  LeaveSelected(selected, local_loss, residual);
  for (const sparse::SparseBlock& d : discarded) {
    sparse::ScatterAdd(d, residual);
  }
  stats->result_nonzeros = current.size();
  return current;
}

}  // namespace gradmesh::collectives

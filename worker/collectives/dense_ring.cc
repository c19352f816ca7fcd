#include "worker/collectives/dense_ring.h"

#include <algorithm>
#include <numeric>

#include "common/status_macros.h"
#include "common/work_meter.h"
#include "worker/collectives/schedule.h"
#include "worker/sparse/dense.h"

namespace gradmesh::collectives {
namespace {

constexpr int kReduceScatterPhase = 0;
constexpr int kAllGatherPhase = 1;
constexpr int kPhases = 2;

constexpr uint64_t kPieceValues = 256 * 1024;  // 1 MiB

// The pieces a chunk moves in: about kPieceValues values each, at least one
// (an empty chunk still moves as one empty message).
std::vector<sparse::IndexRange> Pieces(const sparse::IndexRange& chunk) {
  const int count = static_cast<int>(
      std::max<uint64_t>(1, (chunk.size() + kPieceValues - 1) / kPieceValues));
  std::vector<sparse::IndexRange> pieces;
  pieces.reserve(count);
  for (int j = 0; j < count; ++j) {
    const sparse::IndexRange part = BlockRange(chunk.size(), count, j);
    pieces.push_back({chunk.begin + part.begin, chunk.begin + part.end});
  }
  return pieces;
}

}  // namespace

uint32_t DenseRing::RingStep::PieceTag(int piece) const {
  // At most 2^14 pieces of a chunk (n < 2^32): phases below 2^15.
  return PhaseStep(kPhases * piece + phase, index);
}

absl::StatusOr<std::unique_ptr<DenseRing>> DenseRing::Create(int world_size,
                                                             int rank,
                                                             uint64_t n) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, /*density=*/1.0));
  return std::unique_ptr<DenseRing>(new DenseRing(world_size, rank, n));
}

absl::StatusOr<uint64_t> DenseRing::Accumulate(absl::Span<const float> gradient,
                                               absl::Span<float> residual,
                                               OpStats* stats) {
  return AccumulateChecked("dense", n_, gradient, residual, stats);
}

absl::StatusOr<Proposal> DenseRing::Reduce(absl::Span<const float> accumulator,
                                           const OpContext& context,
                                           OpStats* stats) {
  std::copy(accumulator.begin(), accumulator.end(), sum_.begin());
  StepRunner runner(context, stats);
  const std::vector<RingStep> steps = PlanSteps();
  if (!steps.empty()) {
    const RingStep& first = steps.front();
    const std::vector<sparse::IndexRange> pieces =
        Pieces(BlockRange(n_, world_size_, first.step.send.first));
    for (size_t j = 0; j < pieces.size(); ++j) {
      GM_RETURN_IF_ERROR(runner.SendPiece(
          first.PieceTag(j), first.step.send_to,
          sparse::EncodeDense(absl::MakeConstSpan(sum_).subspan(
              pieces[j].begin, pieces[j].size()))));
    }
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    GM_RETURN_IF_ERROR(RunStep(runner, steps[i],
                               i + 1 < steps.size() ? &steps[i + 1] : nullptr));
  }
  sparse::SparseBlock result;
  result.indices.resize(n_);
  std::iota(result.indices.begin(), result.indices.end(), uint32_t{0});
  result.values.assign(sum_.begin(), sum_.end());
  stats->result_nonzeros = result.size();
  return Proposal{
      .result = std::move(result),
      .apply = [](const sparse::SparseBlock&, absl::Span<float> residual) {
        std::fill(residual.begin(), residual.end(), 0.0f);
      }};
}

std::vector<DenseRing::RingStep> DenseRing::PlanSteps() const {
  std::vector<RingStep> steps;
  const std::vector<Step> reduce = PlanRingReduceScatter(world_size_, rank_);
  for (size_t s = 0; s < reduce.size(); ++s) {
    steps.push_back({kReduceScatterPhase, static_cast<uint32_t>(s), reduce[s],
                     /*add=*/true});
  }
  const std::vector<Step> gather = PlanRingAllGather(world_size_, rank_);
  for (size_t s = 0; s < gather.size(); ++s) {
    steps.push_back({kAllGatherPhase, static_cast<uint32_t>(s), gather[s],
                     /*add=*/false});
  }
  // The pipeline's premise: each step sends what the step before received.
  for (size_t i = 1; i < steps.size(); ++i) {
    GM_CHECK(steps[i].step.send.first == steps[i - 1].step.recv.first);
  }
  return steps;
}

absl::Status DenseRing::RunStep(StepRunner& runner, const RingStep& step,
                                const RingStep* next) {
  runner.CountRound();
  const int from = step.step.recv_from;
  const std::vector<sparse::IndexRange> pieces =
      Pieces(BlockRange(n_, world_size_, step.step.recv.first));
  for (size_t j = 0; j < pieces.size(); ++j) {
    GM_ASSIGN_OR_RETURN(std::string bytes,
                        runner.ReceivePiece(step.PieceTag(j), from));
    absl::Span<float> target =
        absl::MakeSpan(sum_).subspan(pieces[j].begin, pieces[j].size());
    if (absl::Status status = Take(step, bytes, target); !status.ok()) {
      return PeerError(status, from);
    }
    if (next == nullptr) continue;
    // A stored piece goes on as it came; an added one is encoded anew.
    GM_RETURN_IF_ERROR(runner.SendPiece(
        next->PieceTag(j), next->step.send_to,
        step.add ? sparse::EncodeDense(target) : std::move(bytes)));
  }
  return absl::OkStatus();
}

absl::Status DenseRing::Take(const RingStep& step, absl::string_view bytes,
                             absl::Span<float> target) {
  if (!step.add) return sparse::DecodeDense(bytes, target);
  // sum_ is this operation's scratch: a bad message fails the operation.
  GM_RETURN_IF_ERROR(sparse::AddDense(bytes, target));
  CountAccumulated(target.size());
  return absl::OkStatus();
}

}  // namespace gradmesh::collectives

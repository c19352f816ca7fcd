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

}  // namespace

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
  const std::vector<Step> reduce = PlanRingReduceScatter(world_size_, rank_);
  for (size_t s = 0; s < reduce.size(); ++s) {
    GM_RETURN_IF_ERROR(RingStep(runner, PhaseStep(kReduceScatterPhase, s),
                                reduce[s], /*add=*/true));
  }
  const std::vector<Step> gather = PlanRingAllGather(world_size_, rank_);
  for (size_t s = 0; s < gather.size(); ++s) {
    GM_RETURN_IF_ERROR(RingStep(runner, PhaseStep(kAllGatherPhase, s),
                                gather[s], /*add=*/false));
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

absl::Status DenseRing::RingStep(StepRunner& runner, uint32_t tag,
                                 const Step& step, bool add) {
  const int p = world_size_;
  const sparse::IndexRange out = BlockRange(n_, p, step.send.first);
  const sparse::IndexRange in = BlockRange(n_, p, step.recv.first);
  GM_ASSIGN_OR_RETURN(
      std::string bytes,
      runner.Exchange(tag, step.send_to,
                      sparse::EncodeDense(absl::MakeConstSpan(sum_).subspan(
                          out.begin, out.size())),
                      step.recv_from));
  absl::Span<float> target = absl::MakeSpan(sum_).subspan(in.begin, in.size());
  if (!add) {
    const absl::Status status = sparse::DecodeDense(bytes, target);
    return status.ok() ? status : PeerError(status, step.recv_from);
  }
  // sum_ is this operation's scratch: a bad message fails the operation.
  if (absl::Status status = sparse::AddDense(bytes, target); !status.ok()) {
    return PeerError(status, step.recv_from);
  }
  CountAccumulated(target.size());
  return absl::OkStatus();
}

}  // namespace gradmesh::collectives

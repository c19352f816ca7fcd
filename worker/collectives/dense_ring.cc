#include "worker/collectives/dense_ring.h"

#include <algorithm>

#include "common/status_macros.h"
#include "common/work_meter.h"
#include "worker/collectives/schedule.h"
#include "worker/sparse/dense.h"

namespace gradmesh::collectives {
namespace {

constexpr uint32_t kReduceScatterStep = 0;
constexpr uint32_t kAllGatherStep = 1u << 12;

}  // namespace

absl::StatusOr<std::unique_ptr<DenseRing>> DenseRing::Create(int world_size,
                                                             int rank,
                                                             uint64_t n) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, /*density=*/1.0));
  return std::unique_ptr<DenseRing>(new DenseRing(world_size, rank, n));
}

absl::StatusOr<sparse::SparseBlock> DenseRing::AllReduce(
    absl::Span<const float> gradient, absl::Span<float> residual,
    const OpContext& context, OpStats* stats) {
  GM_RETURN_IF_ERROR(
      BeginAllReduce("dense", n_, gradient, residual, context, stats));
  std::copy(residual.begin(), residual.end(), sum_.begin());
  StepRunner runner(context, stats);
  const int p = world_size_;
  const int w = rank_;
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  for (int s = 0; s + 1 < p; ++s) {
    GM_RETURN_IF_ERROR(RingStep(runner, kReduceScatterStep + s, mod(w - s),
                                mod(w - s - 1), /*add=*/true));
  }
  for (int s = 0; s + 1 < p; ++s) {
    GM_RETURN_IF_ERROR(RingStep(runner, kAllGatherStep + s, mod(w + 1 - s),
                                mod(w - s), /*add=*/false));
  }
  sparse::SparseBlock result;
  result.reserve(n_);
  for (uint64_t i = 0; i < n_; ++i) {
    result.push_back(static_cast<uint32_t>(i), sum_[i]);
  }
  GM_RETURN_IF_ERROR(Commit(context, result));
  std::fill(residual.begin(), residual.end(), 0.0f);
  stats->result_nonzeros = result.size();
  return result;
}

absl::Status DenseRing::RingStep(StepRunner& runner, uint32_t step, int send,
                                 int recv, bool add) {
  const int p = world_size_;
  const sparse::IndexRange out = BlockRange(n_, p, send);
  const sparse::IndexRange in = BlockRange(n_, p, recv);
  GM_ASSIGN_OR_RETURN(
      std::string bytes,
      runner.Exchange(step, (rank_ + 1) % p,
                      sparse::EncodeDense(absl::MakeConstSpan(sum_).subspan(
                          out.begin, out.size())),
                      (rank_ + p - 1) % p));
  absl::Span<float> target = absl::MakeSpan(sum_).subspan(in.begin, in.size());
  const int source = (rank_ + p - 1) % p;
  if (!add) {
    const absl::Status status = sparse::DecodeDense(bytes, target);
    return status.ok() ? status : PeerError(status, source);
  }
  std::vector<float> received(in.size());
  if (absl::Status status =
          sparse::DecodeDense(bytes, absl::MakeSpan(received));
      !status.ok()) {
    return PeerError(status, source);
  }
  CountAccumulated(received.size());
  for (size_t i = 0; i < received.size(); ++i) target[i] += received[i];
  return absl::OkStatus();
}

}  // namespace gradmesh::collectives

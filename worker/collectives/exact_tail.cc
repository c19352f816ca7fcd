#include "worker/collectives/exact_tail.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collectives/dense_ring.h"

namespace gradmesh::collectives {

std::vector<uint64_t> StartsBelow(absl::Span<const uint64_t> starts,
                                  uint64_t head) {
  std::vector<uint64_t> out;
  for (uint64_t start : starts) {
    if (start < head) out.push_back(start);
  }
  return out;
}

std::unique_ptr<ExactTail> ExactTail::Create(std::unique_ptr<Collective> inner,
                                             int world_size, int rank,
                                             uint64_t n, uint64_t tail) {
  GM_CHECK(inner != nullptr && tail > 0 && tail < n &&
           n <= std::numeric_limits<uint32_t>::max())
      << tail << " " << n;
  absl::StatusOr<std::unique_ptr<DenseRing>> ring =
      DenseRing::Create(world_size, rank, tail);
  GM_CHECK(ring.ok()) << ring.status();  // the inner one took the same group
  return std::unique_ptr<ExactTail>(
      new ExactTail(std::move(inner), *std::move(ring), n, n - tail));
}

absl::StatusOr<uint64_t> ExactTail::Accumulate(absl::Span<const float> gradient,
                                               absl::Span<float> residual,
                                               OpStats* stats) {
  // Checked here, so that a bad size changes nothing in either part.
  if (gradient.size() != n_ || residual.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("exact tail: expected n = ", n_, " values, got ",
                     gradient.size(), " and a residual of ", residual.size()));
  }
  GM_ASSIGN_OR_RETURN(
      const uint64_t head_nonfinite,
      inner_->Accumulate(gradient.first(head_), residual.first(head_), stats));
  OpStats ring_stats;
  GM_ASSIGN_OR_RETURN(const uint64_t tail_nonfinite,
                      ring_->Accumulate(gradient.subspan(head_),
                                        residual.subspan(head_), &ring_stats));
  return head_nonfinite + tail_nonfinite;
}

absl::StatusOr<Proposal> ExactTail::Reduce(absl::Span<const float> accumulator,
                                           const OpContext& context,
                                           OpStats* stats) {
  GM_ASSIGN_OR_RETURN(Proposal inner,
                      inner_->Reduce(accumulator.first(head_), context, stats));
  OpContext ring_context = context;
  ring_context.first_step = context.first_step + kPartSteps;
  // The ring's counts add to the inner ones (Reduce only adds to `stats`;
  // result_nonzeros is set below).
  GM_ASSIGN_OR_RETURN(Proposal ring, ring_->Reduce(accumulator.subspan(head_),
                                                   ring_context, stats));

  sparse::SparseBlock result;
  const size_t size = inner.result.size() + ring.result.size();
  result.indices.reserve(size);
  result.values.reserve(size);
  result.indices.insert(result.indices.end(), inner.result.indices.begin(),
                        inner.result.indices.end());
  result.values.insert(result.values.end(), inner.result.values.begin(),
                       inner.result.values.end());
  const uint32_t shift = static_cast<uint32_t>(head_);
  for (uint32_t i : ring.result.indices) result.indices.push_back(i + shift);
  result.values.insert(result.values.end(), ring.result.values.begin(),
                       ring.result.values.end());
  ring.result = {};  // its apply reads none of it
  stats->result_nonzeros = result.size();
  return Proposal{
      .result = std::move(result),
      .apply = [head = head_, inner = std::move(inner), ring = std::move(ring)](
                   const sparse::SparseBlock&,
                   absl::Span<float> residual) mutable {
        std::move(inner.apply)(inner.result, residual.first(head));
        std::move(ring.apply)(ring.result, residual.subspan(head));
      }};
}

}  // namespace gradmesh::collectives

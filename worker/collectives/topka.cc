#include "worker/collectives/topka.h"

#include <cfloat>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collectives/primitives.h"
#include "worker/collectives/schedule.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/coo.h"

namespace gradmesh::collectives {

double NormalPpf(double p) {
  GM_CHECK(p > 0.0 && p < 1.0) << p;
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  double x;
  if (p < kLow) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - kLow) {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) *
        q / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  // One Halley step against the exact CDF.
  const double e = 0.5 * std::erfc(-x / std::numbers::sqrt2) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

sparse::SparseBlock GaussianSelect(absl::Span<const float> x, uint64_t k,
                                   const kernels::TopKSelector& topk) {
  if (k == 0 || x.empty()) return {};
  double sum = 0, sum_sq = 0;
  uint64_t nonzeros = 0;
  for (float v : x) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    nonzeros += v != 0.0f;
  }
  const double n = static_cast<double>(x.size());
  const double mean = sum / n;
  const double sigma = std::sqrt(std::max(0.0, sum_sq / n - mean * mean));
  const double tail = std::min(0.5, static_cast<double>(k) / (2 * n));
  double threshold = sigma * NormalPpf(1.0 - tail);
  const uint64_t wanted = std::min<uint64_t>(nonzeros, (3 * k + 3) / 4);
  auto select = [&](double t) {
    return kernels::SelectAbsAtLeast(
        x, static_cast<float>(std::min<double>(t, FLT_MAX)), 0);
  };
  sparse::SparseBlock selected = select(threshold);
  // Lower t by 10% a pass; after 50 passes (t / 190) an outlier-heavy span
  // takes the exact threshold of its top `wanted` instead.
  for (int pass = 0; selected.size() < wanted && pass < 50; ++pass) {
    threshold *= 0.9;
    selected = select(threshold);
  }
  if (selected.size() < wanted) {
    selected = kernels::SelectAbsAtLeast(x, topk.KthLargestAbs(x, wanted), 0);
  }
  return selected;
}

absl::StatusOr<std::unique_ptr<TopkAllGather>> TopkAllGather::Create(
    int world_size, int rank, uint64_t n, double density,
    LocalSelection selection, const WireFormat& wire,
    std::vector<uint64_t> tensor_starts) {
  GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, density));
  return std::unique_ptr<TopkAllGather>(
      new TopkAllGather(world_size, rank, n, SelectionSize(n, density),
                        selection, wire, std::move(tensor_starts)));
}

absl::StatusOr<uint64_t> TopkAllGather::Accumulate(
    absl::Span<const float> gradient, absl::Span<float> residual,
    OpStats* stats) {
  return AccumulateChecked("TopkA", n_, gradient, residual, stats);
}

absl::StatusOr<Proposal> TopkAllGather::Reduce(
    absl::Span<const float> accumulator, const OpContext& context,
    OpStats* stats) {
  sparse::SparseBlock selected;
  {
    ScopedTimer timer(&stats->topk_seconds);
    selected = selection_ == LocalSelection::kExactTopK
                   ? tensors_.TopK(topk(), accumulator, k_, 0)
                   : GaussianSelect(accumulator, k_, topk());
  }
  stats->figures.selected = static_cast<int64_t>(selected.size());
  sparse::SparseBlock loss = codec_.Round(&selected);
  StepRunner runner(context, stats);
  const sparse::IndexRange all{0, n_};
  GM_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGather(runner, PhaseStep(0), Group::World(world_size_, rank_),
                codec_.Encode(selected, all), PreferredAllGather(world_size_)));
  std::vector<sparse::SparseBlock> blocks(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    auto block = codec_.Decode(gathered[r], all, stats);
    if (!block.ok()) return PeerError(block.status(), r);
    blocks[r] = *std::move(block);
  }
  blocks[rank_] = selected;  // k entries; `selected` still leaves below
  sparse::SparseBlock result = SumInOrder(std::move(blocks));
  stats->result_nonzeros = result.size();
  return Proposal{
      .result = std::move(result),
      .apply = [selected = std::move(selected), loss = std::move(loss)](
                   const sparse::SparseBlock&, absl::Span<float> residual) {
        LeaveSelected(selected, loss, residual);
      }};
}

}  // namespace gradmesh::collectives

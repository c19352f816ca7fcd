#include "server/cost_model.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "worker/collectives/registry.h"

namespace gradmesh::server {
namespace {

// The fit is refused when the samples' (rounds, bytes) columns are this close
// to parallel: det <= kMinSinSquared * |rounds|^2 |bytes|^2.
constexpr double kMinSinSquared = 1e-6;

// The table's cost of `algorithm` at its model point.
CommCost TableCost(absl::string_view algorithm, int world_size, int teams,
                   uint64_t n, double density) {
  const collectives::FormulaCost cost =
      collectives::FindAlgorithm(algorithm)->cost(world_size, teams, n,
                                                  density);
  return {.rounds = cost.rounds, .bytes = cost.model_bytes};
}

}  // namespace

CommCost SparDlCost(int world_size, int teams, uint64_t n, double density) {
  return TableCost("spardl", world_size, teams, n, density);
}

CommCost DenseRingCost(int world_size, uint64_t n) {
  return TableCost("dense", world_size, 1, n, 1.0);
}

double ModelSeconds(const CommCost& cost, const LinkModel& link) {
  return cost.rounds * link.alpha_s + cost.bytes * link.beta_s_per_byte;
}

LinkModel FitLinkModel(absl::Span<const LinkSample> samples,
                       const LinkModel& fallback) {
  // Normal equations of the two-column least squares problem.
  double rr = 0, rb = 0, bb = 0, rs = 0, bs = 0;
  for (const LinkSample& s : samples) {
    rr += static_cast<double>(s.rounds) * s.rounds;
    rb += s.rounds * s.bytes;
    bb += s.bytes * s.bytes;
    rs += s.rounds * s.seconds;
    bs += s.bytes * s.seconds;
  }
  if (!(rr > 0 && bb > 0)) return fallback;
  // Scale both columns to unit norm so the test below is scale-free.
  const double r_norm = std::sqrt(rr), b_norm = std::sqrt(bb);
  const double cross = rb / (r_norm * b_norm);  // cosine between the columns
  const double det = 1 - cross * cross;
  if (!(det > kMinSinSquared)) return fallback;
  const double rs_n = rs / r_norm, bs_n = bs / b_norm;
  const LinkModel fitted{
      .alpha_s = (rs_n - cross * bs_n) / det / r_norm,
      .beta_s_per_byte = (bs_n - cross * rs_n) / det / b_norm,
  };
  if (!(fitted.alpha_s > 0 && fitted.beta_s_per_byte > 0) ||
      !std::isfinite(fitted.alpha_s) ||
      !std::isfinite(fitted.beta_s_per_byte)) {
    return fallback;
  }
  return fitted;
}

std::vector<int> ValidTeamCounts(int world_size) {
  std::vector<int> divisors;
  for (int d = 1; d <= world_size; ++d) {
    if (world_size % d == 0) divisors.push_back(d);
  }
  return divisors;
}

std::vector<TeamCountModel> RankTeamCounts(int world_size, uint64_t n,
                                           double density,
                                           const LinkModel& link,
                                           double skip_factor) {
  GM_CHECK(skip_factor >= 1) << "skip_factor " << skip_factor;
  std::vector<TeamCountModel> ranked;
  for (int d : ValidTeamCounts(world_size)) {
    const CommCost cost = SparDlCost(world_size, d, n, density);
    ranked.push_back(
        {.teams = d, .cost = cost, .seconds = ModelSeconds(cost, link)});
  }
  // Without n the model holds the latency alone: the rounds rank, whatever
  // alpha is.
  auto key = [n](const TeamCountModel& m) {
    return n > 0 ? m.seconds : m.cost.rounds;
  };
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const TeamCountModel& a, const TeamCountModel& b) {
                     return key(a) < key(b);
                   });
  if (n > 0 && !ranked.empty()) {
    for (TeamCountModel& m : ranked) {
      m.skipped = m.seconds > skip_factor * ranked.front().seconds;
    }
  }
  return ranked;
}

}  // namespace gradmesh::server

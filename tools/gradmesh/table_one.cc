#include "tools/gradmesh/table_one.h"

#include "server/cost_model.h"
#include "worker/collectives/plan.h"
#include "worker/collectives/schedule.h"

namespace gradmesh::tools {
namespace {

constexpr double kWordBytes = 4;  // Table I's unit: an index or a value

FormulaCost Exact(int rounds, double words) {
  return {.rounds = rounds,
          .min_bytes = kWordBytes * words,
          .max_bytes = kWordBytes * words};
}

FormulaCost Range(int rounds, double min_words, double max_words) {
  return {.rounds = rounds,
          .min_bytes = kWordBytes * min_words,
          .max_bytes = kWordBytes * max_words};
}

}  // namespace

std::optional<FormulaCost> TableOneCost(std::string_view algorithm,
                                        int world_size, int teams, uint64_t n,
                                        double density) {
  const double P = world_size;
  const double k = static_cast<double>(collectives::SelectionSize(n, density));
  const int log_p = collectives::CeilLog2(world_size);
  if (algorithm == "spardl") {
    const server::CommCost cost =
        server::SparDlCost(world_size, teams, n, density);
    const double d = teams;
    if (teams == 1 || collectives::IsPowerOfTwo(teams)) {
      return FormulaCost{cost.rounds, cost.bytes, cost.bytes};
    }
    return Range(cost.rounds, 2 * (P * d + P - 2 * d) / (P * d) * k,
                 2 * (d * d + 2 * P - 3 * d) / P * k);
  }
  if (algorithm == "topka") return Exact(log_p, 2 * (P - 1) * k);
  if (algorithm == "gtopk") return Exact(2 * log_p, 4 * log_p * k);
  if (algorithm == "topkdsa") {
    return Range(world_size + 2 * log_p, 4 * (P - 1) / P * k,
                 (P - 1) / P * (2 * k + static_cast<double>(n)));
  }
  if (algorithm == "oktopk") {
    return Range(2 * (world_size + log_p), 2 * (P - 1) / P * k,
                 6 * (P - 1) / P * k);
  }
  if (algorithm == "dense") {
    return Exact(2 * (world_size - 1),
                 2 * (P - 1) / P * static_cast<double>(n));
  }
  return std::nullopt;
}

}  // namespace gradmesh::tools

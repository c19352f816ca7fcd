#include "worker/collectives/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/collectives/dense_ring.h"
#include "worker/collectives/exact_tail.h"
#include "worker/collectives/gtopk.h"
#include "worker/collectives/oktopk.h"
#include "worker/collectives/schedule.h"
#include "worker/collectives/spardl.h"
#include "worker/collectives/topka.h"
#include "worker/collectives/topkdsa.h"

namespace gradmesh::collectives {
namespace {

constexpr double kWordBytes = 4;  // Table I's unit: an index or a value

// Upcasts a StatusOr<unique_ptr<Derived>>.
template <typename T>
absl::StatusOr<std::unique_ptr<Collective>> Upcast(
    absl::StatusOr<std::unique_ptr<T>> created) {
  if (!created.ok()) return created.status();
  return std::unique_ptr<Collective>(*std::move(created));
}

FormulaCost Range(int rounds, double min_words, double max_words,
                  double model_words) {
  return {.rounds = rounds,
          .min_bytes = kWordBytes * min_words,
          .max_bytes = kWordBytes * max_words,
          .model_bytes = kWordBytes * model_words};
}

FormulaCost Exact(int rounds, double words) {
  return Range(rounds, words, words, words);
}

double K(uint64_t n, double density) {
  return static_cast<double>(SelectionSize(n, density));
}

// SparDL (server/cost_model.h has the derivation): SRS and the final Bruck
// all-gather inside the team, R-SAG or B-SAG across teams.
FormulaCost SparDlCost(int world_size, int teams, uint64_t n, double density) {
  GM_CHECK(world_size >= 1 && teams >= 1 && world_size % teams == 0)
      << "P=" << world_size << " d=" << teams;
  const double P = world_size, d = teams, k = K(n, density);
  double words = 4 * k * (P - d) / P;
  int rounds = 2 * CeilLog2(world_size / teams);
  if (teams == 1) return Exact(rounds, words);
  const int sag_rounds = CeilLog2(teams);  // = log2 d for R-SAG
  rounds += sag_rounds;
  if (IsPowerOfTwo(teams)) {
    return Exact(rounds, words + 2 * d * k / P * sag_rounds);
  }
  return Range(rounds, 2 * (P * d + P - 2 * d) / (P * d) * k,
               2 * (d * d + 2 * P - 3 * d) / P * k,
               words + 2 * (d - 1) * k / P);  // Algorithm 2 at h = k/P
}

FormulaCost TopkACost(int world_size, int, uint64_t n, double density) {
  return Exact(CeilLog2(world_size), 2 * (world_size - 1.0) * K(n, density));
}

FormulaCost GTopkCost(int world_size, int, uint64_t n, double density) {
  const int log_p = CeilLog2(world_size);
  return Exact(2 * log_p, 4 * log_p * K(n, density));
}

FormulaCost TopkDsaCost(int world_size, int, uint64_t n, double density) {
  const double P = world_size, k = K(n, density);
  const double min_words = 4 * (P - 1) / P * k;
  return Range(world_size + 2 * CeilLog2(world_size), min_words,
               (P - 1) / P * (2 * k + static_cast<double>(n)), min_words);
}

FormulaCost OkTopkCost(int world_size, int, uint64_t n, double density) {
  const double P = world_size, k = K(n, density);
  const double min_words = 2 * (P - 1) / P * k;
  return Range(2 * (world_size + CeilLog2(world_size)), min_words,
               6 * (P - 1) / P * k, min_words);
}

FormulaCost DenseCost(int world_size, int, uint64_t n, double) {
  const double P = world_size;
  return Exact(2 * (world_size - 1), 2 * (P - 1) / P * static_cast<double>(n));
}

// Smallest selections: SparDL's blocks of dk/P, the whole k where a worker
// selects once, the partitions' k/P elsewhere, nothing for the dense ring.
double SparDlSelection(int p, int d, uint64_t, double k) { return k * d / p; }
double WholeSelection(int, int, uint64_t, double k) { return k; }
double PartitionSelection(int p, int, uint64_t, double k) { return k / p; }
double NoSelection(int, int, uint64_t n, double) {
  return static_cast<double>(n);
}

absl::StatusOr<std::unique_ptr<Collective>> CreateSparDl(
    const AlgorithmOptions& o, int world_size, int rank, uint64_t n) {
  return Upcast(SparDl::Create(world_size, rank, n,
                               {.density = o.density,
                                .teams = o.teams,
                                .wire = o.wire,
                                .tensor_starts = o.tensor_starts}));
}

absl::StatusOr<std::unique_ptr<Collective>> CreateDense(const AlgorithmOptions&,
                                                        int world_size,
                                                        int rank, uint64_t n) {
  return Upcast(DenseRing::Create(world_size, rank, n));
}

template <LocalSelection kSelection>
absl::StatusOr<std::unique_ptr<Collective>> CreateTopkAllGather(
    const AlgorithmOptions& o, int world_size, int rank, uint64_t n) {
  return Upcast(TopkAllGather::Create(world_size, rank, n, o.density,
                                      kSelection, o.wire, o.tensor_starts));
}

absl::StatusOr<std::unique_ptr<Collective>> CreateTopkDsa(
    const AlgorithmOptions& o, int world_size, int rank, uint64_t n) {
  return Upcast(TopkDsa::Create(world_size, rank, n, o.density, o.quantize_bits,
                                o.seed, o.wire));
}

absl::StatusOr<std::unique_ptr<Collective>> CreateGTopk(
    const AlgorithmOptions& o, int world_size, int rank, uint64_t n) {
  return Upcast(GTopk::Create(world_size, rank, n, o.density, o.wire));
}

absl::StatusOr<std::unique_ptr<Collective>> CreateOkTopk(
    const AlgorithmOptions& o, int world_size, int rank, uint64_t n) {
  return Upcast(OkTopk::Create(world_size, rank, n,
                               {.density = o.density,
                                .tau = o.oktopk_tau,
                                .tau_prime = o.oktopk_tau_prime,
                                .wire = o.wire}));
}

constexpr AlgorithmEntry kAlgorithms[] = {
    {.name = "spardl",
     .tensor_quotas = true,
     .teams = true,
     .smallest_selection = SparDlSelection,
     .cost = SparDlCost,
     .create = CreateSparDl},
    {.name = "dense",
     .smallest_selection = NoSelection,
     .cost = DenseCost,
     .create = CreateDense},
    {.name = "topka",
     .tensor_quotas = true,
     .gathers_every_worker = true,
     .smallest_selection = WholeSelection,
     .cost = TopkACost,
     .create = CreateTopkAllGather<LocalSelection::kExactTopK>},
    {.name = "topkdsa",
     .quantizes = true,
     .smallest_selection = PartitionSelection,
     .cost = TopkDsaCost,
     .create = CreateTopkDsa},
    {.name = "gtopk",
     .smallest_selection = WholeSelection,
     .cost = GTopkCost,
     .create = CreateGTopk},
    {.name = "oktopk",
     .smallest_selection = PartitionSelection,
     .cost = OkTopkCost,
     .create = CreateOkTopk},
    {.name = "gaussiank",
     .gathers_every_worker = true,
     .smallest_selection = WholeSelection,
     .create = CreateTopkAllGather<LocalSelection::kGaussian>},
};

}  // namespace

absl::StatusOr<AlgorithmOptions> AlgorithmOptionsOf(const Plan& plan) {
  GM_ASSIGN_OR_RETURN(const WireFormat wire,
                      WireFormat::Parse(plan.encoding, plan.values));
  return AlgorithmOptions{.algorithm = plan.algorithm,
                          .density = plan.density,
                          .teams = plan.teams,
                          .oktopk_tau = plan.oktopk_tau,
                          .oktopk_tau_prime = plan.oktopk_tau_prime,
                          .quantize_bits = plan.quantize_bits,
                          .seed = plan.seed,
                          .wire = wire};
}

absl::Span<const AlgorithmEntry> Algorithms() { return kAlgorithms; }

const AlgorithmEntry* FindAlgorithm(absl::string_view name) {
  for (const AlgorithmEntry& entry : kAlgorithms) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::vector<std::string> AlgorithmNames() {
  std::vector<std::string> names;
  for (const AlgorithmEntry& entry : kAlgorithms) {
    names.emplace_back(entry.name);
  }
  return names;
}

std::optional<FormulaCost> TableOneCost(absl::string_view algorithm,
                                        int world_size, int teams, uint64_t n,
                                        double density) {
  const AlgorithmEntry* entry = FindAlgorithm(algorithm);
  if (entry == nullptr || entry->cost == nullptr) return std::nullopt;
  return entry->cost(world_size, teams, n, density);
}

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const AlgorithmOptions& options, int world_size, int rank, uint64_t n) {
  const AlgorithmEntry* entry = FindAlgorithm(options.algorithm);
  if (entry == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown algorithm '", options.algorithm,
                     "' (known: ", absl::StrJoin(AlgorithmNames(), ", "), ")"));
  }
  // d = 1 is the one value the others accept.
  if (options.teams != 1 && !entry->teams) {
    return absl::InvalidArgumentError(
        absl::StrCat("teams d = ", options.teams,
                     " applies to spardl only, not ", entry->name));
  }
  if (options.quantize_bits != 0 && !entry->quantizes) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantization applies to topkdsa's dense phase only, not ",
                     entry->name));
  }
  // The dense ring sums everything exactly: a tail changes nothing.
  const uint64_t tail = entry->name == "dense" ? 0 : options.exact_tail;
  if (tail > n && n > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("an exact tail of ", tail, " values in a buffer of ", n));
  }
  if (tail > 0 && tail == n) {
    return FindAlgorithm("dense")->create(options, world_size, rank, n);
  }
  AlgorithmOptions head = options;
  if (tail > 0 && n > 0) {
    // The parts each fit; the whole must too (its result's indices).
    GM_RETURN_IF_ERROR(ValidateCommon(world_size, rank, n, options.density));
    head.exact_tail = 0;
    head.tensor_starts = StartsBelow(options.tensor_starts, n - tail);
  }
  absl::StatusOr<std::unique_ptr<Collective>> created =
      entry->create(head, world_size, rank, n - std::min(tail, n));
  if (!created.ok()) return created;
  if (options.topk != nullptr) (*created)->set_topk(*options.topk);
  if (tail == 0 || n == 0) return created;
  return ExactTail::Create(*std::move(created), world_size, rank, n, tail);
}

}  // namespace gradmesh::collectives

#include "tools/gradmesh/sim.h"

#include <algorithm>
#include <barrier>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "tools/gradmesh/synthetic.h"
#include "worker/collectives/collective.h"
#include "worker/collectives/plan.h"
#include "worker/engine/engine.h"
#include "worker/kernels/topk.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::tools {
namespace {

// What one worker's operation cost, in one iteration.
struct WorkerIteration {
  transport::SimTimes times;
  int rounds = 0;
  uint64_t bytes_received = 0;  // real, unscaled
};

// The table's entry of c's algorithm (ValidateCase has checked the name).
const collectives::AlgorithmEntry& EntryOf(const SimCase& c) {
  return *collectives::FindAlgorithm(c.algorithm.algorithm);
}

// One worker: a fresh gradient each iteration, then one all-reduce between
// Start and Finish of its simulated clock. Every iteration starts on all
// workers at once (`start`), after the previous one finished everywhere.
absl::Status RunWorker(const SimCase& c, uint64_t n, int rank,
                       transport::SimulatedNetwork& network,
                       std::barrier<>& start,
                       std::vector<WorkerIteration>* out) {
  const engine::GroupConfig group{
      .transport = network.endpoint(rank),
      .options = {.algorithm = c.algorithm, .timeout = c.timeout}};
  engine::Engine engine;
  std::vector<float> gradient(n);
  for (int t = 0; t < c.iterations; ++t) {
    SyntheticGradient(c.seed, rank, t, absl::MakeSpan(gradient));
    start.arrive_and_wait();
    network.Start(rank);
    collectives::OpStats stats;
    GM_RETURN_IF_ERROR(engine
                           .AllReduce(group,
                                      {.buffer = "gradient",
                                       .gradient = gradient,
                                       .operation = static_cast<uint64_t>(t)},
                                      &stats)
                           .status());
    out->push_back({.times = network.Finish(rank),
                    .rounds = stats.rounds,
                    .bytes_received = stats.bytes_received});
  }
  return absl::OkStatus();
}

// A worker's own failure explains more than the Unavailable its peers saw.
absl::Status FirstCause(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok() && !absl::IsUnavailable(s)) return s;
  }
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

SimResult Summarize(const SimCase& c, uint64_t n,
                    const std::vector<std::vector<WorkerIteration>>& runs) {
  SimResult result{.simulated_n = n,
                   .scale = static_cast<double>(c.n) / static_cast<double>(n)};
  result.min_block_quota = EntryOf(c).smallest_selection(
      c.workers, c.algorithm.teams, n,
      static_cast<double>(collectives::SelectionSize(n, c.algorithm.density)));
  for (int t = 0; t < c.iterations; ++t) {
    const WorkerIteration* slowest = &runs[0][t];
    double max_bytes = 0, sum_bytes = 0;
    for (const std::vector<WorkerIteration>& worker : runs) {
      const WorkerIteration& w = worker[t];
      if (w.times.seconds > slowest->times.seconds) slowest = &w;
      result.max_rounds = std::max(result.max_rounds, w.rounds);
      max_bytes = std::max(max_bytes, static_cast<double>(w.bytes_received));
      sum_bytes += static_cast<double>(w.bytes_received);
    }
    result.seconds.push_back(slowest->times.seconds);
    result.mean_seconds += slowest->times.seconds / c.iterations;
    result.compute_seconds += slowest->times.compute_seconds / c.iterations;
    result.max_bytes_received += result.scale * max_bytes / c.iterations;
    result.mean_bytes_received +=
        result.scale * sum_bytes / c.workers / c.iterations;
  }
  return result;
}

// Seconds per call of `body`, the best of repeated timings over ~0.2 s.
template <typename Body>
double BestSeconds(Body body) {
  double best = 1e30;
  const absl::Time stop = absl::Now() + absl::Milliseconds(200);
  do {
    const absl::Time begin = absl::Now();
    body();
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - begin));
  } while (absl::Now() < stop);
  return best;
}

// Calibrate's measurement on the calling thread.
transport::SimCompute CalibrateOneThread(std::barrier<>& phase) {
  // Arrays well beyond the caches, as a worker's gradient is.
  constexpr size_t kValues = 16 << 20;
  // The top-k kernel runs on one thread below 1Mi values.
  constexpr size_t kChunk = (1 << 20) - 1;
  std::vector<float> x(kValues), y(kValues);
  SyntheticGradient(1, 0, 0, absl::MakeSpan(x));
  SyntheticGradient(1, 1, 0, absl::MakeSpan(y));
  transport::SimCompute cost;
  phase.arrive_and_wait();  // every thread measures each kind at once
  cost.select_s_per_value =
      BestSeconds([&] {
        for (size_t at = 0; at + kChunk <= kValues; at += kChunk) {
          kernels::TopKAbs(absl::MakeConstSpan(x).subspan(at, kChunk),
                           kChunk / 100, 0);
        }
      }) /
      static_cast<double>(kValues / kChunk * kChunk);

  const sparse::SparseBlock a = kernels::TopKAbs(x, kValues / 10, 0);
  const sparse::SparseBlock b = kernels::TopKAbs(y, kValues / 10, 0);
  phase.arrive_and_wait();
  cost.merge_s_per_value = BestSeconds([&] { sparse::Add(a, b); }) /
                           static_cast<double>(a.size() + b.size());

  std::fill(y.begin(), y.end(), 0.0f);
  phase.arrive_and_wait();
  cost.accumulate_s_per_value =
      BestSeconds(
          [&] { collectives::AccumulateFinite(x, absl::MakeSpan(y)); }) /
      static_cast<double>(kValues);
  return cost;
}

}  // namespace

absl::Status ValidateCase(const SimCase& c) {
  if (c.workers < 1 || c.workers > collectives::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("--workers=", c.workers,
                                                   " is outside 1..",
                                                   collectives::kMaxWorldSize));
  }
  // The algorithm's own checks (name, density, teams dividing P...).
  GM_RETURN_IF_ERROR(
      collectives::CreateCollective(c.algorithm, c.workers, 0, 0).status());
  if (c.n < 1) return absl::InvalidArgumentError("--n must be at least 1");
  if (c.iterations < 1 || c.iterations > kMaxSimIterations) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--iterations=", c.iterations, " is outside 1..", kMaxSimIterations));
  }
  auto cost = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!cost(c.link.alpha_s)) {
    return absl::InvalidArgumentError("--alpha-us must be finite and >= 0");
  }
  if (!cost(c.link.beta_s_per_byte)) {
    return absl::InvalidArgumentError("--gbit must be positive and finite");
  }
  if (!cost(c.compute.select_s_per_value) ||
      !cost(c.compute.merge_s_per_value) ||
      !cost(c.compute.accumulate_s_per_value)) {
    return absl::InvalidArgumentError(
        "--select-ns, --merge-ns and --accumulate-ns must be finite and >= 0");
  }
  if (!(c.timeout > absl::ZeroDuration())) {
    return absl::InvalidArgumentError("--timeout-s must be positive");
  }
  const uint64_t n = SimulatedValues(c);
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-values=", c.max_values, " leaves no value for ",
                     c.workers, " workers"));
  }
  if (n > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n' = ", n, " a worker exceeds uint32 indices (lower --max-values)"));
  }
  return absl::OkStatus();
}

uint64_t SimulatedValues(const SimCase& c) {
  const collectives::AlgorithmEntry* entry =
      collectives::FindAlgorithm(c.algorithm.algorithm);
  if (entry == nullptr) return 0;  // a bad case
  // Values a worker holds per value of n.
  double per_value = 3;
  if (entry->gathers_every_worker) {
    per_value += 2 * c.workers * c.algorithm.density;
  }
  const double fits =
      static_cast<double>(c.max_values) / (c.workers * per_value);
  if (!(fits >= 0 && per_value > 0)) return 0;  // bad workers or density
  if (fits >= static_cast<double>(c.n)) return c.n;
  return static_cast<uint64_t>(fits);
}

absl::StatusOr<SimResult> Simulate(const SimCase& c) {
  GM_RETURN_IF_ERROR(ValidateCase(c));
  const uint64_t n = SimulatedValues(c);
  transport::SimulatedNetwork network(
      c.workers, {.link = c.link,
                  .compute = c.compute,
                  .scale = static_cast<double>(c.n) / static_cast<double>(n)});
  std::vector<absl::Status> statuses(c.workers);
  std::vector<std::vector<WorkerIteration>> runs(c.workers);
  std::barrier<> start(c.workers);
  std::vector<std::thread> threads;
  threads.reserve(c.workers);
  for (int r = 0; r < c.workers; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = RunWorker(c, n, r, network, start, &runs[r]);
      start.arrive_and_drop();  // the others no longer wait for this one
      if (!statuses[r].ok()) network.endpoint(r)->Abort(statuses[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  GM_RETURN_IF_ERROR(FirstCause(statuses));
  return Summarize(c, n, runs);
}

transport::SimCompute Calibrate() {
  // Each thread holds ~180 MiB: at most 16 of them.
  const int threads = static_cast<int>(
      std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<transport::SimCompute> costs(threads);
  std::barrier<> phase(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { costs[t] = CalibrateOneThread(phase); });
  }
  for (std::thread& t : pool) t.join();
  transport::SimCompute mean;
  for (const transport::SimCompute& c : costs) {
    mean.select_s_per_value += c.select_s_per_value / threads;
    mean.merge_s_per_value += c.merge_s_per_value / threads;
    mean.accumulate_s_per_value += c.accumulate_s_per_value / threads;
  }
  return mean;
}

}  // namespace gradmesh::tools

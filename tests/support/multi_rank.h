// Helpers for multi-rank tests over the loopback transport.
#ifndef GRADMESH_TESTS_SUPPORT_MULTI_RANK_H_
#define GRADMESH_TESTS_SUPPORT_MULTI_RANK_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/collectives/collective.h"
#include "worker/collectives/mass_balance.h"
#include "worker/transport/loopback.h"

namespace gradmesh::testing {

// Runs body(rank, endpoint) on one thread per rank of `network` and joins.
// A network is anything with size() and endpoint(rank): the loopback network
// or the in-process gRPC one (grpc_network.h).
template <typename Network>
void RunRanks(Network& network,
              const std::function<void(int, transport::Transport*)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < network.size(); ++r) {
    threads.emplace_back([&, r] { body(r, network.endpoint(r)); });
  }
  for (std::thread& t : threads) t.join();
}

// Gaussian values (no zeros in practice), seeded.
inline std::vector<float> RandomVector(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// collectives::MassBalance as a GoogleTest assertion.
class MassBalance {
 public:
  MassBalance(const std::vector<std::vector<float>>& gradients,
              const std::vector<std::vector<float>>& residuals)
      : balance_(gradients, residuals) {}

  ::testing::AssertionResult Holds(
      const sparse::SparseBlock& result,
      const std::vector<std::vector<float>>& residuals,
      double tolerance = 1e-5) const {
    const absl::Status status = balance_.Check(result, residuals, tolerance);
    if (status.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << status.message();
  }

 private:
  collectives::MassBalance balance_;
};

// What one rank got from one all-reduce.
struct RankRun {
  absl::Status status;
  sparse::SparseBlock result;
  collectives::OpStats stats;
};

// Runs one all-reduce on every rank (instances[r] on network rank r) with
// operation id `operation`; residuals[r] is updated in place.
template <typename Network, typename CollectivePtr>
std::vector<RankRun> RunIteration(
    Network& network, std::vector<CollectivePtr>& instances,
    const std::vector<std::vector<float>>& gradients,
    std::vector<std::vector<float>>& residuals, uint64_t operation,
    absl::Duration timeout = absl::Seconds(30)) {
  std::vector<RankRun> runs(network.size());
  const absl::Time deadline = absl::Now() + timeout;
  RunRanks(network, [&](int r, transport::Transport* t) {
    collectives::OpContext context{
        .transport = t, .operation = operation, .deadline = deadline};
    auto result = instances[r]->AllReduce(
        gradients[r], absl::MakeSpan(residuals[r]), context, &runs[r].stats);
    runs[r].status = result.status();
    if (result.ok()) runs[r].result = *std::move(result);
  });
  return runs;
}

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_MULTI_RANK_H_

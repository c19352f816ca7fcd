// Helpers for multi-rank tests over the loopback transport.
#ifndef GRADMESH_TESTS_SUPPORT_MULTI_RANK_H_
#define GRADMESH_TESTS_SUPPORT_MULTI_RANK_H_

#include <cstdint>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "worker/transport/loopback.h"

namespace gradmesh::testing {

// Runs body(rank, endpoint) on one thread per rank of `network` and joins.
inline void RunRanks(
    transport::LoopbackNetwork& network,
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

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_MULTI_RANK_H_

// Top-k selection on the CPU against the standard library, and against a
// plain read of the same array (the bandwidth limit), in one run:
//
//   build/bench/topk_bench --benchmark_counters_tabular=true
//
// Arguments: n values and the density in parts per 10,000 (10 = 0.1%,
// 100 = 1%). Bytes processed = 4 n, so the
// bytes_per_second column is the effective bandwidth over the input.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "worker/kernels/topk.h"

namespace {

const std::vector<float>& Input(size_t n) {
  static std::vector<float> values;
  if (values.size() != n) {
    values.resize(n);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal;
    for (float& v : values) v = normal(rng);
  }
  return values;
}

size_t K(const benchmark::State& state) {
  return static_cast<size_t>(state.range(0)) * state.range(1) / 10000;
}

void Finish(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          state.range(0) * sizeof(float));
}

// The limit: one pass that reads every value, on every core (as the
// selection does), in a loop the compiler vectorizes.
void BM_MemoryRead(benchmark::State& state) {
  const std::vector<float>& x = Input(state.range(0));
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<uint32_t> partial(cores);
  auto read = [&](unsigned c) {
    const size_t begin = x.size() * c / cores, end = x.size() * (c + 1) / cores;
    uint32_t acc = 0;
    for (size_t i = begin; i < end; ++i) acc |= std::bit_cast<uint32_t>(x[i]);
    partial[c] = acc;
  };
  for (auto _ : state) {
    std::vector<std::thread> threads;
    for (unsigned c = 1; c < cores; ++c) threads.emplace_back(read, c);
    read(0);
    for (std::thread& t : threads) t.join();
    benchmark::DoNotOptimize(partial.data());
  }
  Finish(state);
}

void BM_RadixTopK(benchmark::State& state) {
  const std::vector<float>& x = Input(state.range(0));
  const size_t k = K(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(gradmesh::kernels::TopKAbs(x, k, 0));
  }
  Finish(state);
}

// The standard library selecting positions in TopKAbs's order (|x|
// descending, lower index first), then sorting the winners by index: the
// same output. `select` is std::nth_element or std::partial_sort.
template <typename Select>
void StandardTopK(benchmark::State& state, Select select) {
  const std::vector<float>& x = Input(state.range(0));
  const size_t k = K(state);
  std::vector<uint32_t> positions(x.size());
  auto before = [&x](uint32_t a, uint32_t b) {
    const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa > fb || (fa == fb && a < b);
  };
  for (auto _ : state) {
    std::iota(positions.begin(), positions.end(), 0u);
    select(positions.begin(), positions.begin() + k, positions.end(), before);
    std::sort(positions.begin(), positions.begin() + k);
    benchmark::DoNotOptimize(positions.data());
  }
  Finish(state);
}

void BM_NthElement(benchmark::State& state) {
  StandardTopK(state, [](auto first, auto kth, auto last, auto before) {
    std::nth_element(first, kth - 1, last, before);
  });
}

void BM_PartialSort(benchmark::State& state) {
  StandardTopK(state, [](auto first, auto kth, auto last, auto before) {
    std::partial_sort(first, kth, last, before);
  });
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1'000'000, 25'000'000, 100'000'000}) {
    for (int64_t density : {10, 100}) b->Args({n, density});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_MemoryRead)->Apply(Sizes);
BENCHMARK(BM_RadixTopK)->Apply(Sizes);
BENCHMARK(BM_NthElement)->Apply(Sizes);
BENCHMARK(BM_PartialSort)->Apply(Sizes);

}  // namespace

BENCHMARK_MAIN();

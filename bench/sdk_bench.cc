// The SDK's overhead: what a training process waits for beyond the worker's
// own all-reduce, against a memcpy of the gradient measured in the same run.
//
//   build/bench/sdk_bench --n=25000000 --workers=1 --iterations=10
//
// Starts a local cluster (LocalCluster: real gradmesh-worker processes),
// registers one bucket of n float32 values per worker, and for each result
// layout times, per iteration, the client's call (AllReduce from start to
// result) and the worker's own time for the operation (ReduceInfo::seconds);
// overhead = call - worker. Prints medians and overhead / memcpy.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/cli.h"
#include "tools/gradmesh/local_cluster.h"
#include "tools/gradmesh/synthetic.h"

ABSL_FLAG(uint64_t, n, 25'000'000, "values per gradient (25M = 100 MB)");
ABSL_FLAG(int, workers, 1, "worker processes");
ABSL_FLAG(int, iterations, 10, "timed iterations per layout");
ABSL_FLAG(double, density, 0.01, "k / n");

namespace gradmesh {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double MemcpyMs(uint64_t n, int iterations) {
  std::vector<float> from(n, 1.0f), to(n, 0.0f);
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    from[i] = static_cast<float>(i);
    const absl::Time start = absl::Now();
    std::memcpy(to.data(), from.data(), n * sizeof(float));
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  return Median(ms);
}

int Run() {
  const uint64_t n = absl::GetFlag(FLAGS_n);
  const int P = absl::GetFlag(FLAGS_workers);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  auto cluster = tools::LocalCluster::Start(
      {.workers = P,
       .coordinator_flags = {
           {"algo", "spardl"},
           {"teams", "1"},
           {"density", absl::StrCat(absl::GetFlag(FLAGS_density))}}});
  absl::Status up = cluster.status();
  if (up.ok()) up = (*cluster)->WaitForView(P, absl::Seconds(30));
  if (!up.ok()) {
    std::fprintf(stderr, "sdk_bench: %s\n", up.ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<Client>> clients(P);
  std::vector<std::unique_ptr<TensorSet>> sets(P);
  std::vector<std::thread> threads;
  for (int w = 0; w < P; ++w) {
    threads.emplace_back([&, w] {
      clients[w] = *Client::Connect(
          {.worker = (*cluster)->sdk_address(w), .job = "bench"});
      sets[w] = *clients[w]->Register("g", {{"g", n}});
    });
  }
  for (auto& t : threads) t.join();
  const double memcpy_ms = MemcpyMs(n, iterations);
  std::printf("n = %llu (%.0f MB), P = %d, memcpy %.2f ms\n",
              static_cast<unsigned long long>(n), n * 4 / 1e6, P, memcpy_ms);
  uint64_t step = 0;
  for (ResultLayout layout : {ResultLayout::kSparse, ResultLayout::kDense}) {
    std::vector<double> call_ms, worker_ms, overhead_ms;
    for (int i = 0; i <= iterations; ++i, ++step) {
      std::vector<double> call(P), worker(P);
      threads.clear();
      for (int w = 0; w < P; ++w) {
        threads.emplace_back([&, w] {
          tools::SyntheticGradient(1, w, step, sets[w]->values());
          const absl::Time start = absl::Now();
          auto info = clients[w]->AllReduce(*sets[w], step, {.layout = layout});
          call[w] = absl::ToDoubleMilliseconds(absl::Now() - start);
          worker[w] = info.ok() ? info->seconds * 1e3 : -1;
        });
      }
      for (auto& t : threads) t.join();
      if (i == 0) continue;  // warm-up
      call_ms.push_back(call[0]);
      worker_ms.push_back(worker[0]);
      overhead_ms.push_back(call[0] - worker[0]);
    }
    const double overhead = Median(overhead_ms);
    std::printf(
        "%-6s result: call %8.2f ms, worker %8.2f ms, overhead %7.2f ms = "
        "%.2fx memcpy (call / worker %.3f)\n",
        layout == ResultLayout::kSparse ? "sparse" : "dense", Median(call_ms),
        Median(worker_ms), overhead, overhead / memcpy_ms,
        Median(call_ms) / Median(worker_ms));
  }
  sets.clear();
  clients.clear();
  return (*cluster)->Stop().ok() ? 0 : 1;
}

}  // namespace
}  // namespace gradmesh

int main(int argc, char** argv) {
  gradmesh::ParseFlags(argc, argv, "GRADMESH_BENCH_");
  return gradmesh::Run();
}
